"""The capability manifest a kernel registers with: what it promises, and so what it is tested on.

The suite reads a contract both ways. A case inside the contract must pass. A case outside it is
"not supported"; where running it is harmless (a dtype, a layout, a stride), the suite still runs
it and reports "works, not declared" when it passes, so a contract can be widened with evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

from .reference import fp8 as _fp8
from .reference import presets as _presets
from .reference.slots import Padding

OPS = ("store_cache", "reshape_and_cache_flash", "set_mla_kv_buffer", "concat_and_cache_mla",
       "quantize_fp8", "translate_full_to_swa", "quantize_block", "reshape_and_cache_block")
BLOCK_OPS = ("quantize_block", "reshape_and_cache_block")
BLOCK_FORMATS = ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4")  # oracle.reference.block_scaled
SCALE_LAYOUTS = ("linear", "swizzled")  # the scale cache of reshape_and_cache_block
DTYPES = ("float32", "float16", "bfloat16", "uint8")
INDEX_DTYPES = ("int32", "int64")
SCALES = ("tensor", "head")
LAYOUTS = ("NHD", "HND")
SOURCE_ROWS = ("index", "equal")
# Each op's own convention for the token count: vLLM's writers take it from slot_mapping.size(0)
# and accept sources with extra rows (padded for CUDA-graph capture); sglang's take equal lengths.
SOURCE_ROWS_BY_OP = {"reshape_and_cache_flash": "index", "concat_and_cache_mla": "index",
                     "reshape_and_cache_block": "index"}
DCP_MODULI = ("truncate", "floor")
FP8_DIVISIONS = ("ieee", "approx")
ERRORS = ("raise", "deferred")
FP8_CACHES = ("uint8", "float8")


def always_available() -> str | None:
    return None


GAP_KEYS = ("dtype", "index_dtype", "fp8_format", "kv_cache_dtype", "block_format", "scale_layout", "scale", "layout",
            "padding", "duplicates",
            "strided_source", "strided_heads", "longer_source", "strided_index", "aliased_caches", "cache_strides", "large_cache",
            "row_bytes", "empty_rope", "dcp", "torch_compile", "bad_input")


@dataclass(frozen=True)
class Tolerance:
    """fp8 results may be off by up to ``codes`` codes in at most ``budget`` elements per case;
    such a case passes with a warning that states how many were off."""

    codes: int
    budget: int


@dataclass(frozen=True)
class Contract:
    """What one kernel promises. Every field has the default a careful GPU kernel would declare,
    except ``op``, ``name`` and ``backend``, which are required."""

    op: str
    name: str
    backend: str
    device: str = "cpu"
    dtypes: tuple = ("float32", "float16", "bfloat16")
    index_dtypes: tuple = INDEX_DTYPES
    fp8_formats: tuple = ()  # kv_cache_dtype values besides "auto" that it implements
    # (name, format) pairs: the kv_cache_dtype strings it takes where they are not the format names
    # (vLLM: ("fp8", "e4m3fn"), ("fp8_e4m3", "e4m3fn"), ("fp8_e5m2", "e5m2")); every name is tested
    kv_cache_dtypes: tuple = ()
    fp8_cache: str = "uint8"  # fp8 caches handed over as "uint8" codes or as torch "float8" tensors
    fp8_preset: str = "ocp_satfinite"  # how it converts to fp8 (oracle.reference.presets)
    fp8_knobs: tuple = ()  # (knob, value) pairs overriding the preset, e.g. (("scale_op", "mul_reciprocal"),)
    scales: tuple = SCALES  # per-tensor ("tensor") and/or per-head ("head") fp8 scales
    block_formats: tuple = ()  # block-scaled formats it implements (BLOCK_FORMATS; the block ops)
    block_preset: str | None = None  # how it computes block scales and elements
    # (oracle.reference.block_scaled.PRESETS); None: each format's default preset
    block_knobs: tuple = ()  # (knob, value) pairs overriding the preset, e.g. (("exponent", "ceil"),)
    scale_layouts: tuple = ("linear",)  # scale cache layouts of reshape_and_cache_block
    padding: str = "none"  # oracle.reference.slots padding policy: none, negative, reserved:K
    duplicates: str = "forbid"  # forbid (never tested) or any (whole rows, no torn rows)
    layouts: tuple = LAYOUTS  # paged cache layouts
    strided_sources: bool = True  # honours any source row stride (K, V sliced from fused qkv)
    strided_heads: bool = True  # honours a source's head stride inside a row (heads not adjacent,
    # as qkv.view(N, H, 3, D)[:, :, j] gives); False: each row's heads are read as one run
    source_rows: str | None = None  # "index": the index's length is the token count and sources
    # may hold extra rows it must not read (vLLM); "equal": sources have exactly that many rows
    # (sglang). None: the op's own convention (SOURCE_ROWS_BY_OP, else "equal").
    strided_index: bool = True  # honours the index tensor's stride and storage offset
    aliased_caches: bool = True  # caches may be views of one tensor or at a storage offset
    shared_cache_strides: bool = False  # reads one cache's strides for both (K's and V's must match)
    distinct_kv_widths: bool = True  # store_cache: V's rows may be narrower or wider than K's
    row_bytes_multiple: int = 1  # rows whose byte width is not a multiple are out of contract
    empty_rope: bool = True  # the MLA writers: takes a rope (k_pe) of width 0, a row of nope alone
    large_caches: bool = True  # offsets past 2**31 elements (64-bit offset arithmetic)
    torch_compile: bool = True  # called through torch.compile it writes what it writes eagerly (an op
    # registered with torch.library declares the tensors it mutates, or functionalization drops its write)
    dcp_world: int = 1  # set_mla_kv_buffer under decode-context parallelism: this rank keeps the
    dcp_rank: int = 0  # locs with loc % dcp_world == dcp_rank and writes row loc // dcp_world
    dcp_modulo: str = "truncate"  # how % and // treat negative locs: "truncate" (C, Triton) or "floor" (torch)
    fp8_division: str = "ieee"  # "approx": x / scale may be off by up to 2 float32 ulps (Triton's
    # default float32 division), so a code may be the neighbouring one where the exact quotient
    # lies that close to a rounding boundary
    validates: bool = False  # rejects bad input with an error, writing nothing
    errors: str = "raise"  # "raise": the call itself raises; "deferred": a GPU kernel that checks on
    # the device may return first, and the error is raised by raise_deferred() after the device
    # synchronizes (the suite calls it after every call, so a false alarm fails the case too)
    raise_deferred: Callable[[], None] | None = field(default=None, compare=False)
    tolerance: Tolerance | None = None
    available: Callable[[], str | None] = field(default=always_available, compare=False)
    notes: str = ""
    reasons: tuple = ()  # (gap key, why) pairs: why a capability is left out, shown with "not supported"

    def __post_init__(self):
        if self.source_rows is None:  # frozen: resolve the op's convention once, here
            object.__setattr__(self, "source_rows", SOURCE_ROWS_BY_OP.get(self.op, "equal"))
        problems = self.problems()
        if problems:
            raise ValueError(f"contract {self.name!r}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Everything wrong with this manifest (a broken plug-in is reported with these)."""
        out = []
        if self.op not in OPS:
            out.append(f"op={self.op!r} is not one of {', '.join(OPS)}")
        if not self.name or not isinstance(self.name, str):
            out.append(f"name={self.name!r} must be a non-empty string")
        if not self.backend:
            out.append("backend must be set")
        for attr, allowed in (("dtypes", DTYPES), ("index_dtypes", INDEX_DTYPES),
                              ("fp8_formats", tuple(_fp8.FORMATS)), ("scales", SCALES),
                              ("layouts", LAYOUTS), ("block_formats", BLOCK_FORMATS),
                              ("scale_layouts", SCALE_LAYOUTS)):
            value = getattr(self, attr)
            if not isinstance(value, tuple):
                out.append(f"{attr} must be a tuple, got {value!r}")
            elif set(value) - set(allowed):
                out.append(f"{attr} has {sorted(set(value) - set(allowed))}; allowed: {', '.join(allowed)}")
        try:
            Padding.parse(self.padding)
        except ValueError as exc:
            out.append(str(exc))
        if self.duplicates not in ("forbid", "any"):
            out.append(f"duplicates={self.duplicates!r} is not 'forbid' or 'any'")
        for attr, allowed in (("source_rows", SOURCE_ROWS), ("dcp_modulo", DCP_MODULI),
                              ("fp8_division", FP8_DIVISIONS), ("errors", ERRORS),
                              ("fp8_cache", FP8_CACHES)):
            if getattr(self, attr) not in allowed:
                out.append(f"{attr}={getattr(self, attr)!r} is not one of {', '.join(allowed)}")
        world, rank = self.dcp_world, self.dcp_rank
        if not (isinstance(world, int) and isinstance(rank, int) and world >= 1 and 0 <= rank < world):
            out.append(f"dcp_world={world!r}, dcp_rank={rank!r}: need integers with 0 <= dcp_rank < dcp_world")
        elif world > 1 and self.op != "set_mla_kv_buffer":
            out.append(f"dcp_world={world}: only set_mla_kv_buffer has a DCP-sharded form")
        if self.fp8_formats:
            try:
                for fmt in self.fp8_formats:
                    self.knobs(fmt)
            except (TypeError, ValueError) as exc:
                out.append(f"fp8: {exc}")
        out += self._kv_cache_dtype_problems()
        if self.block_formats and self.op not in BLOCK_OPS:
            out.append(f"block_formats={self.block_formats!r}: only {', '.join(BLOCK_OPS)} write block-scaled formats")
        for fmt in self.block_formats if isinstance(self.block_formats, tuple) else ():
            try:
                self.block_knob_values(fmt)
            except (TypeError, ValueError) as exc:
                out.append(f"block format {fmt}: {exc}")
        keys = GAP_KEYS
        if not isinstance(self.reasons, tuple) or any(
                not (isinstance(r, tuple) and len(r) == 2 and r[0] in keys) for r in self.reasons):
            out.append(f"reasons must be (key, why) pairs with keys among {', '.join(keys)}, got {self.reasons!r}")
        if not callable(self.available):
            out.append("available must be a callable returning None or a reason")
        if self.errors == "deferred" and not callable(self.raise_deferred):
            out.append(f"errors='deferred' needs raise_deferred, a callable that raises the pending error "
                       f"after the device synchronizes, got {self.raise_deferred!r}")
        return out

    def _kv_cache_dtype_problems(self) -> list[str]:
        names = self.kv_cache_dtypes
        if not isinstance(names, tuple) or any(
                not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0])
                for pair in names):
            return [f"kv_cache_dtypes must be (name, format) pairs of strings, got {names!r}"]
        out = [f"kv_cache_dtypes: {name!r} names {fmt!r}, which is not among fp8_formats {self.fp8_formats!r}"
               for name, fmt in names if fmt not in self.fp8_formats]
        spelled = [name for name, _ in names]
        out += [f"kv_cache_dtypes names {name!r} twice" for name in sorted(set(spelled)) if spelled.count(name) > 1]
        return out

    def kv_cache_dtype(self, fmt: str | None) -> str:
        """The kv_cache_dtype string a case passes for fp8 format ``fmt`` (None: "auto"): the first
        name :attr:`kv_cache_dtypes` gives it, else the format's own name."""
        if fmt is None:
            return "auto"
        return next((name for name, meaning in self.kv_cache_dtypes if meaning == fmt), fmt)

    def knobs(self, fmt: str) -> _fp8.Fp8Knobs:
        """The fp8 knobs this kernel declares for ``fmt``."""
        return _fp8.resolve_knobs(_fp8.get_format(fmt), self.fp8_preset, dict(self.fp8_knobs))

    def block_knob_values(self, fmt: str):
        """The block-scaling knobs this kernel declares for block format ``fmt``."""
        from .reference import block_scaled

        return block_scaled.knobs_for(fmt, self.block_preset, **dict(self.block_knobs))

    def describe(self) -> str:
        """The contract in one line."""
        parts = [f"{self.op} on {self.device}", "/".join(self.dtypes), "idx " + "/".join(self.index_dtypes)]
        if self.fp8_formats:
            knobs = ",".join(f"{k}={v}" for k, v in self.fp8_knobs)
            parts.append("fp8 " + "/".join(self.fp8_formats) + f" ({self.fp8_preset}{',' + knobs if knobs else ''})")
            if self.kv_cache_dtypes:
                parts.append("kv_cache_dtype " + "/".join(f"{n}={f}" for n, f in self.kv_cache_dtypes))
            if self.fp8_cache != "uint8":
                parts.append(f"fp8 caches as torch {self.fp8_cache}")
        parts += [f"padding={self.padding}", f"duplicates={self.duplicates}"]
        if self.source_rows == "index":
            parts.append("sources may be longer than the index")
        if self.dcp_world > 1:
            parts.append(f"DCP rank {self.dcp_rank} of {self.dcp_world} ({self.dcp_modulo} modulo)")
        if self.fp8_division != "ieee":
            parts.append(f"fp8 division {self.fp8_division}")
        if self.block_formats:
            knobs = ",".join(f"{k}={v}" for k, v in self.block_knobs)
            parts.append("block formats " + "/".join(self.block_formats)
                         + f" ({self.block_preset or 'default presets'}{',' + knobs if knobs else ''})")
        if self.op == "reshape_and_cache_block":
            parts.append("scale layouts " + "/".join(self.scale_layouts))
        if self.op in ("reshape_and_cache_flash", "reshape_and_cache_block"):
            parts.append("layouts " + "/".join(self.layouts))
        if self.row_bytes_multiple > 1:
            parts.append(f"row bytes % {self.row_bytes_multiple}")
        parts.append("validates" if self.validates else "no validation")
        if self.errors == "deferred":
            parts.append("errors deferred to the next synchronization")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        out = {}
        for f in fields(self):
            if f.name in ("available", "raise_deferred"):
                continue
            value = getattr(self, f.name)
            out[f.name] = value.__dict__ if isinstance(value, Tolerance) else value
        return out


@dataclass(frozen=True)
class Gap:
    """One way a case lies outside a contract. ``probe`` says whether running it anyway is
    harmless (a dtype or a layout), so that a pass can be reported as "works, not declared"."""

    key: str
    text: str
    probe: bool


def gaps(contract: Contract, needs: dict) -> list[Gap]:
    """How a case with requirements ``needs`` (see oracle.ops.base.Case.needs) falls outside."""
    out = []

    def lacks(key, declared, wanted, probe, label=None):
        if wanted is not None and wanted not in declared:
            out.append(Gap(key, f"{label or key} {wanted} not declared (declares {', '.join(map(str, declared)) or 'none'})", probe))

    lacks("dtype", contract.dtypes, needs.get("dtype"), True)
    lacks("index_dtype", contract.index_dtypes, needs.get("index_dtype"), True)
    lacks("fp8_format", contract.fp8_formats, needs.get("fp8_format"), True, "fp8 format")
    lacks("kv_cache_dtype", tuple(name for name, _ in contract.kv_cache_dtypes), needs.get("kv_cache_dtype"),
          True, "kv_cache_dtype name")
    if needs.get("cache_strides") and contract.shared_cache_strides:
        out.append(Gap("cache_strides", "K's and V's caches have different strides; the kernel declares "
                       "shared_cache_strides (it reads one cache's strides for both)", False))
    lacks("block_format", contract.block_formats, needs.get("block_format"), True, "block format")
    lacks("scale_layout", contract.scale_layouts, needs.get("scale_layout"), True, "scale layout")
    lacks("scale", contract.scales, needs.get("scale"), True, "scale kind")
    lacks("layout", contract.layouts, needs.get("layout"), True)
    if needs.get("padding") and needs["padding"] != contract.padding:
        out.append(Gap("padding", f"padding slots under policy {needs['padding']}; the kernel declares padding={contract.padding}", False))
    if needs.get("duplicates") and contract.duplicates != "any":
        out.append(Gap("duplicates", "duplicate slots; the kernel declares duplicates=forbid", False))
    for key, attr, text in (("strided_source", "strided_sources", "a non-contiguous source"),
                            ("strided_heads", "strided_heads", "a source whose heads are not adjacent in its rows"),
                            ("strided_index", "strided_index", "a strided or offset index tensor"),
                            ("aliased_caches", "aliased_caches", "caches that alias one allocation"),
                            ("large_cache", "large_caches", "offsets past 2**31 elements"),
                            ("distinct_kv_widths", "distinct_kv_widths", "K and V rows of different widths"),
                            ("empty_rope", "empty_rope", "a rope of width 0 (rows of nope alone)"),
                            ("torch_compile", "torch_compile", "a call through torch.compile")):
        if needs.get(key) and not getattr(contract, attr):  # not probed: a large cache (memory), a
            # compiled call (seconds of tracing where it cannot work)
            out.append(Gap(key, f"{text}; the kernel declares {attr}=False", key not in ("large_cache", "torch_compile")))
    if needs.get("longer_source") and contract.source_rows != "index":
        out.append(Gap("longer_source", "sources with more rows than the index; the kernel declares "
                                        f"source_rows={contract.source_rows!r}", False))
    if needs.get("dcp") and contract.dcp_world == 1:
        out.append(Gap("dcp", "DCP-widened locs; the kernel declares dcp_world=1 (not DCP-sharded)", False))
    row_bytes = needs.get("row_bytes")
    if row_bytes and row_bytes % contract.row_bytes_multiple:
        out.append(Gap("row_bytes", f"rows of {row_bytes} bytes; the kernel needs a multiple of "
                                    f"{contract.row_bytes_multiple}", True))
    if needs.get("bad_input") and not contract.validates:
        out.append(Gap("bad_input", "bad input; the kernel declares validates=False (undefined behaviour)", False))
    reasons = dict(contract.reasons)
    return [Gap(g.key, f"{g.text}: {reasons[g.key]}", g.probe) if g.key in reasons else g for g in out]
