"""Block-scaled writes (MXFP8, NVFP4): ``quantize_block`` and the paged ``reshape_and_cache_block``.

``quantize_block(codes, scales, x, fmt, global_scale)``: x ``[N, H, D]`` float32, float16 or
bfloat16 with any row stride; codes uint8 ``[N, H, Dc]`` (``Dc`` = D, or D / 2 for NVFP4: two
e2m1 codes per byte, D even); scales uint8 ``[N, H, ceil(D / block)]``; fmt one of
:data:`oracle.reference.block_scaled.FORMATS`; global_scale a float32 tensor [1] (NVFP4's
per-tensor scale, also checked unchanged; MX ignores it).

``reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache,
value_scale_cache, slot_mapping, fmt, k_global_scale, v_global_scale)``: vLLM's
``reshape_and_cache_flash`` into block-scaled caches. key, value ``[T, H, D]`` (T may exceed the
index's length; the extra rows are never read); code caches uint8 ``[num_blocks, block_size, H,
Dc]`` ("NHD", or "HND": a permuted view of a ``[num_blocks, H, block_size, Dc]`` allocation);
scale caches uint8 ``[num_blocks, block_size, H, ceil(D / block)]`` (scale layout "linear", in the
code caches' layout) or ``[num_blocks, page_bytes]`` (``"swizzled"``: the 128x4 tiled pages of
:mod:`oracle.reference.block_scaled`; each page here is followed by 16 unused bytes, so the row
stride exceeds the page). Slot ``s`` is token ``s % block_size`` of block ``s // block_size``; a
padded slot writes neither codes nor scales. The kernel tells the scale layouts apart by rank.

Block size 16 tokens. Cases beyond the catalogue's classes come from the "block_scaled" class:
each format with each value set (:mod:`._blockcases`), NVFP4 under each per-tensor scale, heads
whose D is not a multiple of the block (the last block is shorter and must not straddle into the
next head), and (paged) the swizzled scale cache.
"""

from __future__ import annotations

import numpy as np
import torch

from ..buffers import Arena
from ..contract import Contract
from ..diagnose import block_scales
from ..diagnose.hypothesis import Hypothesis
from ..reference import block_scaled as ref
from ..reference.slots import Padding
from . import _blockcases, _build
from ._bad_scales import BAD_SCALES, spoil
from .base import Case, OpSpec, Prepared

BLOCK_SIZE = 16
PAGE_PAD = 16  # unused bytes after each swizzled page
SHAPES = ((1, 64), (8, 128), (32, 128), (4, 40), (2, 72), (1, 48), (13, 46), (8, 96))


class _BlockSpec(OpSpec):
    """What the two block-scaled specs share: formats, value sets, knobs, needs."""

    dtypes = ("bfloat16", "float16", "float32")
    block_formats = tuple(ref.FORMATS)
    default_shape = (8, 128)
    shapes = SHAPES
    straddle_shape = (4, 40)  # D = 40: MX blocks of 32 + 8, NVFP4 16 + 16 + 8
    wide_page_shape = (13, 160)  # swizzled pages of 16 * 13 = 208 rows, 5 or 10 scale columns

    def p_with_defaults(self, case: Case) -> dict:
        p = super().p_with_defaults(case)
        if p.get("bad") in ("odd_head", *BAD_SCALES) and "block" not in case.p:  # NVFP4 has the per-tensor scales
            p["block"] = "nvfp4"
        return _blockcases.with_defaults(p, case.p)

    def needs(self, case: Case) -> dict:
        out = super().needs(case)
        p = self.p_with_defaults(case)
        out.update(fp8_format=None, scale=None, block_format=p["block"],
                   scale_layout=p.get("scale_layout", "linear") if self.name == "reshape_and_cache_block" else None)
        return out

    def row_bytes(self, case: Case) -> int:
        return 0

    def _params(self, case: Case) -> tuple:
        """(p, n, heads, head size, format, bad input) of a case; the bad input "odd_head" makes
        the head one element longer."""
        p = self.p_with_defaults(case)
        heads, dim = p["shape"]
        return p, p["n"], heads, dim + (p.get("bad") == "odd_head"), p["block"], p.get("bad")

    def _knobs(self, case: Case, contract: Contract, override: dict) -> tuple[str, dict, dict]:
        """(the format, the reference's knobs, the other overrides); ``block_format`` replays
        another format of the same widths."""
        override = dict(override)
        fmt = override.pop("block_format", self.p_with_defaults(case)["block"])
        knobs, rest = _blockcases.resolve(contract, fmt, override)
        return fmt, knobs, rest

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        p = self.p_with_defaults(case)
        return _blockcases.alternatives(p["block"], contract, p["dtype"])

    def observed_alternatives(self, case: Case, contract: Contract, prepared: Prepared, after: dict) -> list:
        """The elements quantized under the scales the kernel wrote, where those differ from the
        reference's: its scales' amax or exponent is wrong, its element path right."""
        try:
            written = self.written_scales(case, contract, prepared, after)
        except ValueError:  # a sparse cache that does not read back whole
            return []
        fmt, knobs, _ = self._knobs(case, contract, {})
        family, _, block = ref.require_format(fmt)
        texts = []
        for (source, gs), (rows, got, _) in zip(self.scaled_sources, written):
            x = prepared.numpy(source)[rows]
            with np.errstate(all="ignore"):
                want = ref.quantize_block(x, fmt, prepared.numpy(gs), **knobs)[1]
            if not np.array_equal(want, got[rows]):
                texts.append(f"{source}: " + block_scales.describe(x.astype(np.float32), want, got[rows], family, block))
        if not texts:
            return []
        given = tuple((got, codes if family == "mx" else None) for _, got, codes in written)  # per source
        return [Hypothesis("block_scale_wrong", "; ".join(texts), override={"given_scales": given})]

    def difference_cause(self, case: Case, contract: Contract, prepared: Prepared, after: dict, expected: dict):
        """Only each head's partial last block wrong (``partial_block_mishandled``), or the
        elements wrong in exactly the blocks whose multiplier lies past a power of two
        (``block_multiplier_range``): read off the blocks' codes and scales, K's and V's together."""
        try:
            got = self.written_scales(case, contract, prepared, after)
            want = self.written_scales(case, contract, prepared, expected)
        except ValueError:  # a sparse cache that does not read back whole
            return None
        fmt = self.p_with_defaults(case)["block"]
        parts, dim = [], None
        for (source, gs), (rows, got_scales, got_codes), (_, want_scales, want_codes) in zip(self.scaled_sources, got, want):
            x = prepared.numpy(source)[rows].astype(np.float32)
            dim = x.shape[-1]
            parts.append(block_scales.block_masks(x, (want_scales[rows], want_codes[rows]),
                                                  (got_scales[rows], got_codes[rows]), fmt, prepared.numpy(gs)))
        if not parts or not any(p["code"].size for p in parts):
            return None
        text = block_scales.partial_block_text(parts, dim, ref.require_format(fmt)[2])
        if text is not None:
            return "partial_block_mishandled", text
        text = block_scales.multiplier_range_text(parts)
        return None if text is None else ("block_multiplier_range", text)


class QuantizeBlock(_BlockSpec):
    name = "quantize_block"
    signature = "quantize_block(codes, scales, x, fmt, global_scale)"
    index_dtypes = ()
    sources = ("x",)
    scale_arguments = ("global_scale",)  # NVFP4's
    aliasing = ("offset",)
    scaled_sources = (("x", "global_scale"),)

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p, n, heads, dim, fmt, bad = self._params(case)
        x_np = _blockcases.values(rng, p["values"], fmt, (n, heads, dim), p["dtype"])
        gs_np = _blockcases.global_scale(p.get("scale", "1.0"), x_np)
        if bad in BAD_SCALES:
            gs_np, = spoil(bad, [gs_np])
        global_scale = arena.tensor("global_scale", gs_np, role="scale")
        (x,) = _build.rows(arena, ("x",), (x_np,), p["src"])
        width = dim // 2 if fmt == "nvfp4" else dim
        shapes = ((n, heads, width), (n, heads, ref.scale_count(fmt, dim)))
        codes_dtype = "float16" if bad == "codes_dtype" else "uint8"
        codes, scales = _build.caches(arena, ("codes",), shapes[:1], codes_dtype, p["cache"]) + \
            _build.caches(arena, ("scales",), shapes[1:], "uint8", p["cache"])
        if bad == "x_dtype":
            x = x.to(torch.float64)
        elif bad == "shape_mismatch":
            scales = scales[:, :, :-1]
        elif bad == "fmt":
            fmt = "mxfp4"
        return Prepared(arena, (codes, scales, x, fmt, global_scale), ("codes", "scales"))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        fmt, knobs, rest = self._knobs(case, contract, override)
        straddle = rest.pop("straddle_heads", False)
        (given, given_codes), = rest.pop("given_scales", ((None, None),))  # x's alone
        if rest:
            raise ValueError(f"quantize_block has no {sorted(rest)} to override")
        x = prepared.numpy("x")
        with np.errstate(all="ignore"):
            if not straddle:
                codes, scales = ref.quantize_block(x, fmt, prepared.numpy("global_scale"), scales=given,
                                                   nan_block_codes=given_codes, **knobs)
                return {"codes": codes, "scales": scales}
            # blocks over each token's whole [H * D] row; its scales in the first entries of the
            # token's [H, blocks] scale row, the rest untouched
            flat, flat_scales = ref.quantize_block(x.reshape(x.shape[0], -1), fmt, prepared.numpy("global_scale"),
                                                   **knobs)
        scales = prepared.numpy("scales")
        rows = scales.reshape(scales.shape[0], -1)
        rows[:, :flat_scales.shape[1]] = flat_scales
        return {"codes": flat.reshape(x.shape[:2] + (-1,)), "scales": rows.reshape(scales.shape)}

    def written_scales(self, case: Case, contract: Contract, prepared: Prepared, after: dict) -> list:
        """(the rows written, the kernel's scales ``[N, H, blocks]``, its codes) of x."""
        arena = prepared.arena
        return [(slice(None), np.array(arena.numpy_view(after, "scales")), np.array(arena.numpy_view(after, "codes")))]

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The block-scaling hypotheses, and blocks that straddle heads (where D is not a multiple
        of the block, the only case where they differ)."""
        p = self.p_with_defaults(case)
        out = super().alternatives(case, contract)
        if p["shape"][1] % ref.require_format(p["block"])[2]:
            out.append(Hypothesis("blocks_straddle_heads", "blocks run over each token's whole [H * D] row, "
                                  "straddling heads, their scales written first in the token's scale row",
                                  override={"straddle_heads": True}))
        return out

    def bad_inputs(self) -> tuple:
        return ("x_dtype", "codes_dtype", "shape_mismatch", "fmt", "odd_head", *BAD_SCALES)


class ReshapeAndCacheBlock(_BlockSpec):
    name = "reshape_and_cache_block"
    paged = True
    signature = ("reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, "
                 "value_scale_cache, slot_mapping, fmt, k_global_scale, v_global_scale)")
    large_n_shape = (2, 64)
    # a swizzled scale page's offset table kept per (block size, heads) without the scale columns:
    # D = 96 (3 MX scale columns) after D = 128 (4) with 8 heads each
    after_shapes = (((8, 96), (8, 128)),)
    after_shape_params = {"scale_layout": "swizzled"}
    sources = ("key", "value")
    scale_arguments = ("k_global_scale", "v_global_scale")  # NVFP4's
    aliasing = ("aliased", "offset", "unequal")
    layouts = ("NHD", "HND")
    large_case = {"n": 7}
    scale_names = ("key_scale_cache", "value_scale_cache")
    scaled_sources = (("key", "k_global_scale"), ("value", "v_global_scale"))
    slot_groups = (("key_cache", "key_scale_cache"), ("value_cache", "value_scale_cache"))

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p, n, heads, dim, fmt, bad = self._params(case)
        layout, scale_layout = p["layout"], p.get("scale_layout", "linear")
        num_blocks = _build.LARGE_UNITS if p.get("large") else -(-_build.slot_count(p) // BLOCK_SIZE)
        num_slots = num_blocks * BLOCK_SIZE
        arrays = tuple(_blockcases.values(rng, p["values"], fmt, (n, heads, dim), p["dtype"]) for _ in range(2))
        if p.get("dups"):  # rows of different magnitudes, so colliding rows differ in their scales too
            arrays = tuple(_blockcases.spread_magnitudes(a) for a in arrays)
        scales = [_blockcases.global_scale(p.get("scale", "1.0"), a, t) for t, a in enumerate(arrays)]
        if bad in BAD_SCALES:
            scales = spoil(bad, scales)
        k_gs = arena.tensor("k_global_scale", scales[0], role="scale")
        v_gs = arena.tensor("v_global_scale", scales[1], role="scale")
        key, value = _build.rows(arena, ("key", "value"), arrays, p["src"], rng)
        width, count = (dim // 2 if fmt == "nvfp4" else dim), ref.scale_count(fmt, dim)
        code_shape = (num_blocks, BLOCK_SIZE, heads, width)
        scale_shape = (num_blocks, BLOCK_SIZE, heads, count)
        names = ("key_cache", "value_cache")
        cache_dtype = "float16" if bad == "cache_dtype" else "uint8"
        if p.get("large"):
            caches = _build.large_caches(arena, names + self.scale_names, (code_shape,) * 2 + (scale_shape,) * 2)
            entries = _build.large_slots(rng, n, BLOCK_SIZE)
        else:
            linear = scale_layout == "linear"
            caches = _paged(arena, names + (self.scale_names if linear else ()),
                            (code_shape,) * 2 + ((scale_shape,) * 2 if linear else ()), p["cache"], layout,
                            cache_dtype)
            if not linear:
                caches += _swizzled(arena, self.scale_names, num_blocks, BLOCK_SIZE * heads, count)
            entries = _build.destinations(rng, p, num_slots, contract)
        if bad == "out_of_range" and n:
            entries[_build.illegal_at(n)] = num_slots
        slot_mapping = _build.index_of(arena, "slot_mapping", entries, p, num_slots, rng)
        key_cache, value_cache, key_scales, value_scales = caches
        if bad == "dtype_mismatch":
            key = key.to(torch.float16 if key.dtype != torch.float16 else torch.float32)
        elif bad == "shape_mismatch":
            value = value[:, :, : dim - 2]
        elif bad == "index_dtype":
            slot_mapping = slot_mapping.to(torch.int16)
        elif bad == "fmt":
            fmt = "mxfp4"
        elif bad == "scale_cache_shape":
            key_scales = key_scales[..., :-1] if key_scales.dim() == 4 else key_scales[:, :-PAGE_PAD - 1]
        return Prepared(arena, (key, value, key_cache, value_cache, key_scales, value_scales, slot_mapping,
                                fmt, k_gs, v_gs), names + self.scale_names)

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        fmt, knobs, rest = self._knobs(case, contract, override)
        p = self.p_with_defaults(case)
        layout = rest.pop("scale_layout", p.get("scale_layout", "linear"))
        policies = {"padding": contract.padding, "duplicates": contract.duplicates} | rest
        with np.errstate(all="ignore"):
            out = ref.reshape_and_cache_block(
                *(prepared.numpy(name) for name in ("key_cache", "value_cache") + self.scale_names),
                prepared.numpy("slot_mapping"), prepared.numpy("key"), prepared.numpy("value"), fmt=fmt,
                k_global_scale=prepared.numpy("k_global_scale"), v_global_scale=prepared.numpy("v_global_scale"),
                scale_layout=layout, **policies, **knobs)
        return dict(zip(("key_cache", "value_cache") + self.scale_names, out))

    def written_scales(self, case: Case, contract: Contract, prepared: Prepared, after: dict) -> list:
        """For K and V: (the entries that write a slot no other entry writes, the scales ``[T,
        H, blocks]`` and the codes the kernel left at each entry's slot; zero for the other
        entries)."""
        p = self.p_with_defaults(case)
        arena, loc = prepared.arena, prepared.numpy("slot_mapping").astype(np.int64)
        slots, counts = np.unique(loc, return_counts=True)
        num_slots = prepared.args[2].shape[0] * BLOCK_SIZE  # key_cache's blocks
        padded = Padding.parse(contract.padding).skipped(loc, num_slots)
        rows = np.flatnonzero(np.isin(loc, slots[counts == 1]) & ~padded & (loc >= 0) & (loc < num_slots))
        pages, tokens = np.divmod(loc[rows], BLOCK_SIZE)
        out = []
        for name, source, code_name in zip(self.scale_names, ("key", "value"), ("key_cache", "value_cache")):
            cache = np.asarray(arena.numpy_view(after, name))
            code_cache = np.asarray(arena.numpy_view(after, code_name))
            tokens_in, heads, dim = prepared.numpy(source).shape
            count = ref.scale_count(p["block"], dim)
            got = np.zeros((tokens_in, heads, count), np.uint8)
            if cache.ndim == 4:
                got[rows] = cache[pages, tokens]
            else:
                offsets = ref.swizzled_offsets(BLOCK_SIZE * heads, count).reshape(BLOCK_SIZE, heads, count)
                got[rows] = cache[pages[:, None, None], offsets[tokens]]
            codes = np.zeros((got.shape[0],) + code_cache.shape[2:], np.uint8)
            codes[rows] = code_cache[pages, tokens]
            out.append((rows, got, codes))
        return out

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The block-scaling hypotheses, the per-tensor scales swapped (NVFP4), padding rows
        quantized into slot 0, and a swizzled scale cache written in the linear order."""
        p = self.p_with_defaults(case)
        out = super().alternatives(case, contract)
        if p["block"] == "nvfp4":
            out += _blockcases.global_scale_hypotheses(("k_global_scale", "v_global_scale"))
        if p.get("padding") == "negative":
            out.append(_blockcases.padding_into_slot_zero("slot_mapping"))
        if p.get("scale_layout") == "swizzled":
            heads, dim = p["shape"]
            count = ref.scale_count(p["block"], dim)
            page = ref.swizzled_page_bytes(BLOCK_SIZE * heads, count)
            blocks = -(-(max(2 * p["n"], 64) + 3) // BLOCK_SIZE)
            shape = (blocks, BLOCK_SIZE, heads, count)
            strides = (page + PAGE_PAD, heads * count, count, 1)
            out.append(Hypothesis("scale_layout_wrong", "the swizzled scale cache written in the linear "
                                  "[block_size, H, blocks] order of each page",
                                  views={name: (shape, strides, 0) for name in self.scale_names},
                                  override={"scale_layout": "linear"}))
            out += [Hypothesis("scale_layout_wrong", f"the swizzled scale cache written with {how}",
                               override={"swizzle_fault": fault})
                    for fault, how in (("col_tiles_floor", f"its column tiles counted as {count} // 4 "
                                        f"= {count // 4}, rounded down, not up"),
                                       ("tiles_column_major", "its 128x4 tiles in column-major order"),
                                       ("rows_not_interleaved", "each 128x4 tile's rows in order, not "
                                        "interleaved 32 apart"),
                                       (ref.ROWS_HEAD_MAJOR, "the row of token t, head h numbered head-major, "
                                        f"h * {BLOCK_SIZE} + t, not t * {heads} + h"))]
            if count % 4:
                out.append(Hypothesis("scale_layout_wrong", f"each written row's group of 4 scale columns stored "
                                      f"whole: its padding columns {count}..{-(-count // 4) * 4 - 1}, which no scale "
                                      "owns, written as zeros", override={"swizzle_fault": ref.PADDING_COLUMNS}))
        return out

    def bad_inputs(self) -> tuple:
        return ("dtype_mismatch", "shape_mismatch", "out_of_range", "index_dtype", "fmt", "cache_dtype",
                "scale_cache_shape", "odd_head", *BAD_SCALES)


def _paged(arena: Arena, names: tuple, shapes: tuple, variant: str, layout: str, dtype: str) -> tuple:
    """Paged caches of logical shapes ``shapes`` (``[blocks, block_size, H, W]``), allocated in
    ``layout`` order (HND: ``[blocks, H, block_size, W]``, handed over as a permuted view) as
    ``variant`` (plain, offset, aliased: see _build.caches; unequal: V's code and scale caches
    padded past each block, K's dense, so K's and V's strides differ). The code caches get ``dtype``."""
    alloc = tuple(s if layout == "NHD" else (s[0], s[2], s[1], s[3]) for s in shapes)
    if variant == "aliased":  # one allocation, slot by slot (cases of the bad class are plain)
        views = list(_build.caches(arena, names, alloc, "uint8", variant))
    else:  # "unequal": V's caches (codes and scales) padded past each block, K's dense
        own = {"unequal": ("plain", "padded")}.get(variant)
        views = [_build.caches(arena, (name,), (shape,), dtype if i < 2 else "uint8",
                               own[i % 2] if own else variant)[0]
                 for i, (name, shape) in enumerate(zip(names, alloc))]
    if layout == "HND":
        for i, name in enumerate(names):
            spec = arena.views[name]
            s0, s1, s2, s3 = spec.strides
            views[i] = arena.view(name, spec.region, shapes[i], (s0, s2, s1, s3), spec.offset, spec.dtype,
                                  role="cache")
    return tuple(views)


def _swizzled(arena: Arena, names: tuple, num_blocks: int, rows: int, cols: int) -> tuple:
    """Swizzled scale caches ``[num_blocks, page_bytes]`` whose pages lie PAGE_PAD bytes apart."""
    page = ref.swizzled_page_bytes(rows, cols)
    out = []
    for name in names:
        arena.region(name + "_storage", num_blocks * (page + PAGE_PAD), max(_build.GUARD_MIN, 2 * page))
        out.append(arena.view(name, name + "_storage", (num_blocks, page), (page + PAGE_PAD, 1), 0, "uint8",
                              role="cache"))
    return tuple(out)
