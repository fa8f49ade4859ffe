"""The MLA latent-cache writers: one row per token, the compressed KV (``nope`` / ``kv_c``) followed
by the rotary part (``rope`` / ``k_pe``).

``set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)``: sglang's flat writer.
kv_buffer ``[S, W]`` with ``W >= nope + rope`` (elements past ``nope + rope`` stay untouched),
nope ``[N, nope]``, rope ``[N, rope]``, one dtype (uint8 for fp8 byte layouts, 528 + 128 bytes);
loc int32 or int64 ``[N]``. Case shapes are ``(nope, rope)`` or ``(nope, rope, W)``.

``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``: vLLM's paged
writer. kv_cache ``[num_blocks, block_size, rank + rope]``; kv_cache_dtype "auto" (plain copy) or
an fp8 format name (uint8 cache of codes); scale a float32 tensor ``[1]``. Case shapes are
``(rank, rope)`` or ``(rank, rope, block_size)`` (block size 16 otherwise).

"fused" sources are both parts sliced out of one latent tensor ``[N, lead + nope + rope]`` (a fused
qkv_a projection), so each part's row stride exceeds its width. "aliased" caches share their
allocation with a neighbour view interleaved row by row (block by block, paged), which must stay
untouched.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import reference
from ..reference.slots import Collision, OneOfRows
from ..buffers import NUMPY_DTYPES, Arena
from ..contract import Contract
from ..diagnose.hypothesis import Hypothesis
from . import _build, _dcp, _fp8cases, _fp8hypotheses
from ._bad_scales import BAD_SCALES, spoil
from ._mla_diagnosis import boundary_vector_read, compacted_sources, local_row_reserved, misplaced_rope
from .base import Case, OpSpec, Prepared

NEIGHBOUR = 8  # elements per row (per block, paged) of the view interleaved with an "aliased" cache
BLOCK_SIZE = 16
EMPTY_ROPE = (512, 0)  # rows of nope alone: sglang's set_mla_kv_buffer takes its no-rope kernel there


def _other_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float16 if dtype != torch.float16 else torch.float32


def _cache(arena: Arena, name: str, shape: tuple, dtype: str, layout: str) -> torch.Tensor:
    """One cache in the case's layout; "aliased" interleaves it with a neighbour view (a paged
    cache's with a whole entry and more per block: its block stride is no multiple of its pages'
    size, so a block size derived from the strides comes out wrong)."""
    if layout == "aliased":
        neighbour = (shape[0], NEIGHBOUR + (shape[-1] if len(shape) > 2 else 0))
        return _build.caches(arena, (name, name + "_neighbour"), (shape, neighbour), dtype, layout)[0]
    return _build.caches(arena, (name,), (shape,), dtype, layout)[0]


class SetMlaKvBuffer(OpSpec):
    name = "set_mla_kv_buffer"
    signature = "set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)"
    dtypes = ("bfloat16", "float16", "float32", "uint8")
    default_shape = (512, 64)  # (nope, rope); uint8 defaults to the fp8 byte layout 528 + 128
    shapes = ((512, 64), (528, 64), (256, 64), (128, 64), (512, 32),  # sglang's grid
              (528, 128), (528, 128, 700),  # the fp8 byte layout, also in a wider row
              (512, 64, 640), (97, 31, 141),  # W wider than nope + rope: the tail stays untouched
              (511, 65), (97, 31), (1, 1),  # odd widths: alignment fallbacks
              (32, 64))  # rope wider than nope: a rope loop sized by nope's threads
    large_n_shape = (128, 64)
    sources = ("nope", "rope")
    source_layouts = ("fused", "fused_unsqueezed")  # [N, 1, n] sources, as sglang's callers pass them
    dcp = True  # under a DCP contract every case's locs are widened (oracle.ops._dcp)
    large_case = {"dtype": "uint8", "n": 7}  # the fp8 byte layout, rows past 2**31 elements
    empty_rope_shapes = (EMPTY_ROPE, EMPTY_ROPE + (640,))  # also in a wider row: not a packed [S, nope]
    float_slots_shape = (1, 1)
    odd_run_shape = (97, 30)  # 254-byte rows in bf16, packed: neighbours share a word

    def p_with_defaults(self, case: Case) -> dict:
        p = super().p_with_defaults(case)
        if "shape" not in case.p and p.get("dtype") == "uint8":
            p["shape"] = (528, 128)
        return p

    @staticmethod
    def dims(p: dict) -> tuple[int, int, int]:
        """(nope, rope, W) of a case."""
        nope, rope = p["shape"][:2]
        return nope, rope, p["shape"][2] if len(p["shape"]) > 2 else nope + rope

    def row_bytes(self, case: Case) -> int:
        """Bytes of the written part of a row, nope + rope."""
        p = self.p_with_defaults(case)
        nope, rope, _ = self.dims(p)
        return (nope + rope) * NUMPY_DTYPES[p["dtype"]].itemsize

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        nope_w, rope_w, width = self.dims(p)
        n, dtype, bad = p["n"], p["dtype"], p.get("bad")
        num_slots = _build.LARGE_UNITS if p.get("large") else _build.slot_count(p)
        nope, rope = _build.rows(arena, ("nope", "rope"), (_build.values(rng, (n, nope_w), dtype, p["values"]),
                                                           _build.values(rng, (n, rope_w), dtype, p["values"])),
                                 p["src"], rng)
        if bad == "narrow_buffer":
            width = nope_w + rope_w - 1
        if p.get("large"):
            kv_buffer, = _build.large_caches(arena, ("kv_buffer",), ((num_slots, width),))
            entries = _build.large_slots(rng, n)
        else:
            kv_buffer = _cache(arena, "kv_buffer", (num_slots, width), dtype, p["cache"])
            entries = _build.destinations(rng, p, num_slots, contract)
        entries = _dcp.widen(rng, entries, contract, p["index"], padding=p.get("padding"),
                             negatives=bool(p.get("dcp")), keep=(0, 1) if p.get("large") else ())
        if bad == "out_of_range" and n:
            entries[_build.illegal_at(n)] = _dcp.loc_of(num_slots, contract)  # kept by this rank, a row past the end
        loc = _build.index_of(arena, "loc", entries, p, num_slots, rng)
        if bad == "dtype_mismatch":
            rope = rope.to(_other_dtype(rope.dtype))
        elif bad == "shape_mismatch":
            nope = nope[: max(n - 1, 0)]
        elif bad == "index_dtype":
            loc = loc.to(torch.int16)
        return Prepared(arena, (kv_buffer, loc, nope, rope), ("kv_buffer",))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        """Overrides besides the policies: ``swapped=True`` (rope written first, nope after it),
        ``rope_at=k`` (rope written at element ``k`` of the row instead of at ``nope``) and
        ``zero_tail=True`` (the whole W-wide row written, zeros past nope + rope)."""
        swapped, rope_at = override.pop("swapped", False), override.pop("rope_at", None)
        zero_tail = override.pop("zero_tail", False)
        policies = {"padding": contract.padding, "duplicates": contract.duplicates,
                    "dcp_world": contract.dcp_world, "dcp_rank": contract.dcp_rank,
                    "dcp_modulo": contract.dcp_modulo} | override
        buffer, loc = prepared.numpy("kv_buffer"), prepared.numpy("loc")
        nope, rope = prepared.numpy("nope")[:len(loc)], prepared.numpy("rope")[:len(loc)]
        if zero_tail:  # the tail past nope + rope written too, as zeros
            tail = buffer.shape[1] - nope.shape[1] - rope.shape[1]
            rope = np.concatenate([rope, np.zeros((len(rope), tail), rope.dtype)], axis=1)
        if swapped:
            nope, rope = rope, nope
        if rope_at is None:
            return {"kv_buffer": reference.set_mla_kv_buffer(buffer, loc, nope, rope, **policies)}
        out = reference.set_mla_kv_buffer(buffer, loc, nope, rope[:, :0], **policies)
        return {"kv_buffer": _rope_written_at(out, rope_at, rope.shape[1], lambda window: reference.set_mla_kv_buffer(
            window, loc, rope, nope[:, :0], **policies), before=buffer, first=nope.shape[1])}

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        out = []
        if case.p.get("dups"):
            return out
        p = self.p_with_defaults(case)
        nope, rope, width = self.dims(p)
        itemsize = NUMPY_DTYPES[p["dtype"]].itemsize
        out.append(Hypothesis("parts_swapped", "nope and rope swapped (rope at offset 0, nope after it)",
                              {"swapped": True}))
        if width > nope + rope:
            out.append(Hypothesis("part_misplaced", f"rope written at the end of the row (element "
                                  f"{width - rope} = W - rope) instead of after nope (element {nope})",
                                  {"rope_at": width - rope}))
        if width > nope + rope:
            out.append(Hypothesis("row_tail_written", f"the whole {width}-element row written, zeros "
                                  f"past nope + rope = {nope + rope}", {"zero_tail": True}))
        if itemsize > 1 and nope * itemsize + rope <= width:
            out.append(Hypothesis("part_misplaced", f"rope written at element {nope * itemsize} "
                                  "(nope's byte size used as an element offset)",
                                  {"rope_at": nope * itemsize}))
        return out

    def layout_alternatives(self, case: Case, contract: Contract, prepared: Prepared) -> list[Hypothesis]:
        """kv_buffer taken as packed rows of nope + rope; rope written at another offset of the row,
        or its first elements read past nope's row: see :mod:`oracle.ops._mla_diagnosis`."""
        if case.p.get("dups"):
            return []
        p = self.p_with_defaults(case)
        nope, rope, width = self.dims(p)
        itemsize = NUMPY_DTYPES[p["dtype"]].itemsize
        buffer = prepared.arena.views["kv_buffer"]
        packed = []
        if width > nope + rope and buffer.strides[-1] == 1:  # rows addressed as slot * (nope + rope)
            packed.append(Hypothesis("dense_cache_assumed", f"kv_buffer taken as a packed [S, {nope + rope}] (rows "
                                     f"{nope + rope} elements apart, its row stride {buffer.strides[0]} ignored)",
                                     views={"kv_buffer": ((buffer.shape[0], nope + rope), (nope + rope, 1),
                                                          buffer.offset)}))
        return (packed + misplaced_rope(prepared.arena.views, "kv_buffer", "nope", nope, rope,
                                        {width - rope, nope * itemsize})
                + boundary_vector_read(prepared, "nope", "rope")
                + compacted_sources(prepared, contract, self.sources) + local_row_reserved(prepared, contract))

    def bad_inputs(self) -> tuple:
        return ("dtype_mismatch", "shape_mismatch", "out_of_range", "index_dtype", "narrow_buffer")


FP8_BAD = ("scale_dtype", "fp8_cache_dtype", *BAD_SCALES)  # bad inputs only an fp8 call can have


class ConcatAndCacheMla(OpSpec):
    name = "concat_and_cache_mla"
    paged = True
    signature = "concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)"
    dtypes = ("bfloat16", "float16", "float32")
    fp8 = True
    fp8_optional = True
    fp8_scales = tuple(s for s in _fp8cases.SCALES if s != "head")  # the latent row has no heads
    fp8_tail_shape = (511, 65)
    default_shape = (512, 64)  # (kv_lora_rank, rope); a third entry is the block size
    shapes = ((512, 64), (256, 64), (128, 64), (512, 32), (511, 65), (97, 31),
              (512, 64, 1), (97, 31, 5), (32, 64))  # (32, 64): rope wider than the latent rank
    large_n_shape = (128, 64)
    sources = ("kv_c", "k_pe")
    scale_arguments = ("scale",)
    large_case = {"fp8": "e4m3fn", "n": 7}  # fp8 blocks past 2**31 elements
    empty_rope_shapes = (EMPTY_ROPE,)
    float_slots_shape = (1, 1)
    odd_run_shape = (97, 30)  # 254-byte rows in bf16

    @staticmethod
    def dims(p: dict) -> tuple[int, int, int]:
        """(rank, rope, block_size) of a case."""
        rank, rope = p["shape"][:2]
        return rank, rope, p["shape"][2] if len(p["shape"]) > 2 else BLOCK_SIZE

    def p_with_defaults(self, case: Case) -> dict:
        p = super().p_with_defaults(case)
        if p.get("bad") in FP8_BAD and "fp8" not in case.p:  # built as an e4m3fn call
            p["fp8"] = "e4m3fn"
        if p.get("fp8"):
            p.setdefault("scale", "1.0")
        return _fp8cases.with_defaults(p, case.p)

    def row_bytes(self, case: Case) -> int:
        """Bytes of one entry, the gcd over source and cache (fp8: one byte per element), so a
        declared multiple divides both."""
        p = self.p_with_defaults(case)
        rank, rope, _ = self.dims(p)
        source = NUMPY_DTYPES[p["dtype"]].itemsize
        return math.gcd((rank + rope) * source, (rank + rope) * (1 if p.get("fp8") else source))

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        rank, rope_w, block_size = self.dims(p)
        n, dtype, fmt, bad = p["n"], p["dtype"], p.get("fp8"), p.get("bad")
        num_blocks = _build.LARGE_UNITS if p.get("large") else -(-_build.slot_count(p) // block_size)
        num_slots = num_blocks * block_size
        scale_values = _fp8cases.scale_values(p.get("scale", "1.0"), 1)
        if fmt:
            arrays = tuple(_fp8cases.values(rng, p["values"], fmt, (n, w), dtype, scale_values)
                           for w in (rank, rope_w))
        else:
            arrays = tuple(_build.values(rng, (n, w), dtype, p["values"]) for w in (rank, rope_w))
        if bad in BAD_SCALES:
            scale_values, = spoil(bad, [scale_values])
        scale = arena.tensor("scale", scale_values, role="scale")
        kv_c, k_pe = _build.rows(arena, ("kv_c", "k_pe"), arrays, p["src"], rng)
        width = rank + rope_w + (1 if bad == "cache_width" else 0)
        cache_dtype = _fp8cases.cache_dtype(contract, fmt) if fmt else dtype
        if bad == "fp8_cache_dtype":
            cache_dtype = dtype
        elif bad == "auto_cache_dtype":  # an fp8 cache (codes) written under "auto"
            cache_dtype = "uint8"
        if p.get("large"):
            kv_cache, = _build.large_caches(arena, ("kv_cache",), ((num_blocks, block_size, width),),
                                            cache_dtype)
            entries = _build.large_slots(rng, n, block_size)
        else:
            kv_cache = _cache(arena, "kv_cache", (num_blocks, block_size, width), cache_dtype, p["cache"])
            entries = _build.destinations(rng, p, num_slots, contract)
        if bad == "out_of_range" and n:
            entries[_build.illegal_at(n)] = num_slots
        slot_mapping = _build.index_of(arena, "slot_mapping", entries, p, num_slots, rng)
        if bad == "scale_dtype":
            scale = scale.to(torch.float64)
        elif bad == "dtype_mismatch":
            k_pe = k_pe.to(_other_dtype(k_pe.dtype))
        elif bad == "shape_mismatch":
            k_pe = k_pe[: max(n - 1, 0)]
        elif bad == "index_dtype":
            slot_mapping = slot_mapping.to(torch.int16)
        kv_cache_dtype = "fp9" if bad == "kv_cache_dtype" else _fp8cases.kv_cache_dtype(contract, p)
        return Prepared(arena, (kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale), ("kv_cache",))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        """Overrides: the policies, the fp8 ones of :func:`_fp8cases.resolve` (scale mode,
        preset, knobs, format), ``swapped=True`` (k_pe written first, kv_c after it) and
        ``unscaled="k_pe"`` or ``"kv_c"`` (that part quantized with scale 1, the other with the
        scale; a ValueError without fp8 or with duplicated slots)."""
        fmt = self.p_with_defaults(case).get("fp8")
        fmt, mode, fp8_args, rest = _fp8cases.resolve(contract, fmt, override)
        swapped, unscaled = rest.pop("swapped", False), rest.pop("unscaled", None)
        rope_at = rest.pop("rope_at", None)
        policies = {"padding": contract.padding, "duplicates": contract.duplicates} | rest
        scale = prepared.numpy("scale")
        kv_c, _ = _fp8cases.scaled_source(fmt, mode, prepared.numpy("kv_c"), scale)
        k_pe, scale = _fp8cases.scaled_source(fmt, mode, prepared.numpy("k_pe"), scale)
        if swapped:
            kv_c, k_pe = k_pe, kv_c
        cache, slots = prepared.numpy("kv_cache"), prepared.numpy("slot_mapping")
        fp8 = {"kv_cache_dtype": fmt, "scale": scale, **fp8_args} if fmt else {}
        if rope_at is not None:
            out = cache.copy()  # kv_c alone into the entries' first columns, k_pe after
            out[..., :kv_c.shape[1]] = _plain(reference.concat_and_cache_mla(
                cache[..., :kv_c.shape[1]], slots, kv_c, k_pe[:, :0], **policies, **fp8))
            block_size = cache.shape[1]
            return {"kv_cache": _rope_written_at(out, rope_at, k_pe.shape[1], lambda window: reference.concat_and_cache_mla(
                window.reshape(-1, block_size, k_pe.shape[1]), slots, kv_c[:, :0], k_pe, **policies, **fp8
            ).reshape(window.shape), whole=block_size, before=cache, first=kv_c.shape[1])}
        out = reference.concat_and_cache_mla(cache, slots, kv_c, k_pe, **policies, **fp8)
        if unscaled is not None:
            if not fmt:
                raise ValueError(f"unscaled={unscaled!r}: the case writes no fp8")
            plain = reference.concat_and_cache_mla(cache, slots, kv_c, k_pe, **policies,
                                                   **(fp8 | {"scale": np.ones(1, np.float32)}))
            out = _unscaled_part(out, unscaled, kv_c.shape[1], plain)
        return {"kv_cache": out}

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The fp8 hypotheses (:func:`_fp8hypotheses.alternatives`), and without duplicated slots:
        kv_c and k_pe swapped, and (scale not 1) one part unscaled."""
        p = self.p_with_defaults(case)
        out = _fp8hypotheses.alternatives(p, contract)
        if not case.p.get("dups"):
            out.append(Hypothesis("parts_swapped", "kv_c and k_pe swapped (k_pe at offset 0, kv_c "
                                  "after it)", {"swapped": True}))
            if p.get("fp8") and p.get("scale", "1.0") != "1.0":
                out += [Hypothesis("part_unscaled", f"{part} stored without the scale (x, not "
                                   f"x / scale); {other} scaled", {"unscaled": part})
                        for part, other in (("k_pe", "kv_c"), ("kv_c", "k_pe"))]
        return out

    def layout_alternatives(self, case: Case, contract: Contract, prepared: Prepared) -> list[Hypothesis]:
        """k_pe written at another offset of the entry, or its first elements read past kv_c's
        row: see :mod:`oracle.ops._mla_diagnosis`."""
        if case.p.get("dups"):
            return []
        rank, rope, _ = self.dims(self.p_with_defaults(case))
        return (misplaced_rope(prepared.arena.views, "kv_cache", "kv_c", rank, rope, set())
                + boundary_vector_read(prepared, "kv_c", "k_pe"))

    def bad_inputs(self) -> tuple:
        return ("dtype_mismatch", "shape_mismatch", "out_of_range", "index_dtype", "cache_width",
                "kv_cache_dtype", "auto_cache_dtype") + FP8_BAD


def _plain(outcome) -> np.ndarray:
    if not isinstance(outcome, np.ndarray):
        raise ValueError("rope_at= is not replayed on duplicated slots")
    return outcome


def _rope_written_at(out, rope_at: int, rope: int, write, whole: int = 1, before=None, first: int = 0):
    """``out`` (a cache of rows ``[..., W]``, the first part written) with the rope part of row r
    written at element ``r * W + rope_at`` of the packed cache: ``write(window)`` returns the
    ``[rows, rope]`` window (``rows`` a multiple of ``whole``, the rows of a block) with the rope
    rows written; past a row's end the window runs into the next row. Where a rope so lands on
    the first part (``first`` elements) of a row that is written too (it differs from ``before``),
    the kernel's threads may leave either one's bytes there: a OneOfRows allowing both."""
    if not isinstance(out, np.ndarray):
        raise ValueError("rope_at= is not replayed on duplicated slots")
    width = out.shape[-1]
    rows = (out.size - rope_at - rope) // width + 1
    rows -= rows % whole
    if rows <= 0:
        raise ValueError(f"rope_at={rope_at}: no row's rope fits in the cache")
    firsts = np.ascontiguousarray(out)
    out = firsts.copy()
    window = np.lib.stride_tricks.as_strided(out.reshape(-1)[rope_at:], (rows, rope), (width * out.itemsize, out.itemsize))
    window[...] = write(np.array(window))
    if before is None or rope_at + rope <= width:
        return out
    bits = f"u{out.itemsize}"  # compared as bits: NaN rows included
    flat_out, flat_firsts = out.reshape(-1, width), firsts.reshape(-1, width)
    prior = np.ascontiguousarray(before).reshape(-1, width)
    written = (flat_firsts[:, :first].view(bits) != prior[:, :first].view(bits)).any(axis=1)
    other = flat_out.copy()  # the first parts written after every rope
    other[written, :first] = flat_firsts[written, :first]
    clash = np.flatnonzero((other.view(bits) != flat_out.view(bits)).any(axis=1))
    if not clash.size:
        return out
    lead = out.shape[:-1]
    collisions = tuple(Collision(int(q), np.unravel_index(int(q), lead), (0, 1), np.stack([flat_out[q], other[q]]))
                       for q in clash)
    return OneOfRows(out, collisions)


def _unscaled_part(scaled, part: str, rank: int, plain):
    """``scaled`` (the cache with both parts scaled) with ``part``'s columns ("kv_c": the first
    ``rank``, "k_pe": the rest) taken from ``plain`` (the cache with nothing scaled). Both write
    the same slots, so the splice is the cache of a kernel that scales one part only."""
    if not (isinstance(scaled, np.ndarray) and isinstance(plain, np.ndarray)):
        raise ValueError("unscaled= is not replayed on duplicated slots")
    columns = {"kv_c": np.s_[..., :rank], "k_pe": np.s_[..., rank:]}
    if part not in columns:
        raise ValueError(f"unscaled={part!r} is not 'kv_c' or 'k_pe'")
    out = scaled.copy()
    out[columns[part]] = plain[columns[part]]
    return out


__all__ = ["ConcatAndCacheMla", "SetMlaKvBuffer"]
