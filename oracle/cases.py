"""The case catalogue: one list of case classes, applied to every op where it makes sense.

Each class is a generator over an op spec's declared axes (its dtypes, shapes, sources, layouts,
fp8 support, bad inputs), so an op gets every class by describing itself, never by copying cases.
"""

from __future__ import annotations

from .ops import SPECS
from .ops.base import Case, OpSpec, shape_text
from .ops._build import LARGE_N
from .diagnose.hypothesis import GRID_DIMENSION_MAX
from .ops._fp8cases import EVERY_BITS_N, MIXED_SCALES, NEAR_UNIT_SCALE, POWER_OF_TWO_SCALE, UNIT_FIRST_HEAD
from .reference.fp8 import FORMATS

PROFILES = ("quick", "full", "exhaustive")
CASE_CLASSES = ("dtypes", "sizes", "strides", "aliasing", "padding", "duplicates", "dcp", "large",
                "fp8", "block_scaled", "repeat", "contexts", "bad_input")


def _dtypes(spec: OpSpec, profile: str, contract=None):
    """Every dtype x every index dtype; for ops that copy rows as bits, every float dtype again
    with random bit patterns and NaN payloads, infinities, -0 and subnormals in every row."""
    for dtype in spec.dtypes or (None,):
        for index in spec.index_dtypes or (None,):
            yield {"dtype": dtype, "index": index}
    if spec.sources and spec.index_dtypes and not spec.block_formats:  # the copying writers
        for dtype in spec.dtypes:
            if dtype != "uint8":
                yield {"dtype": dtype, "values": "bits"}


# Tokens past 65535, the most a CUDA grid's y or z dimension holds (and a 16-bit token counter):
# a launch that puts the tokens there fails, or one that folds them into it drops the rest.
GRID_LIMIT_N = GRID_DIMENSION_MAX + 4

WIDE_HEADS = (32, 128)  # (heads, head size): more heads than a 16-entry scale table holds



def _at_large_n(spec: OpSpec, params: dict) -> dict:
    """``params`` again at N = LARGE_N, in the spec's narrower row for that size when it has one
    (the rows per program, vector widths and grids that change with N are what this reaches)."""
    out = dict(params, n=LARGE_N)
    if spec.large_n_shape:
        out["shape"] = spec.large_n_shape
    return out


def _with_large_n(spec: OpSpec, params: dict):
    yield params
    yield _at_large_n(spec, params)


def _sizes(spec: OpSpec, profile: str, contract=None):
    for n in spec.sizes:
        for index in (spec.index_dtypes if profile != "quick" else spec.index_dtypes[:1]) or (None,):
            yield {"n": n, "index": index}
    for dtype in spec.dtypes[1:]:  # an empty call in every dtype: an early return keeps its dtypes
        yield {"n": 0, "dtype": dtype, "index": (spec.index_dtypes or (None,))[-1]}
    for shape in spec.shapes + spec.empty_rope_shapes:
        for dtype in (spec.dtypes if profile != "quick" else spec.dtypes[:1]) or (None,):
            yield {"shape": shape, "n": 7 if profile == "quick" else 133, "dtype": dtype}
    odd = spec.fp8_tail_shape or spec.odd_run_shape  # rows of no multiple of 16 bytes in every dtype:
    if odd and (profile == "quick" or odd not in spec.shapes):  # a tail loop sized for another one's width
        for dtype in spec.dtypes[1:]:
            yield {"shape": odd, "n": 7, "dtype": dtype}
    if profile != "quick" and spec.index_dtypes:  # more tokens than a launch grid's y or z dimension holds,
        narrow = spec.float_slots_shape or spec.large_n_shape  # in the narrowest rows: a failure's replays stay cheap
        yield {"n": GRID_LIMIT_N, **({"shape": narrow} if narrow else {})}
    if spec.wide_cache_shape:  # slot numbers past 2**16 in blocks that are no power of two
        yield {"shape": spec.wide_cache_shape, "n": 133, "wide": True}
    if spec.index_dtypes:  # a prefill's consecutive run of slots, which fast paths special-case
        yield {"slots": "run", "n": 133}
        yield _at_large_n(spec, {"slots": "run"})
        for layout in spec.layouts[1:]:  # the run across block boundaries where a block's tokens
            yield {"slots": "run", "n": 133, "layout": layout}  # are not one slab: HND, padded blocks
        if "padded" in spec.aliasing:
            yield {"slots": "run", "n": 133, "cache": "padded"}
        if spec.odd_run_shape:  # rows that share words of memory, written side by side
            yield {"slots": "run", "n": 133, "shape": spec.odd_run_shape}
    if spec.float_slots_shape:  # odd slot numbers past 2**24, which no float32 holds
        byte = {"dtype": "uint8"} if "uint8" in spec.dtypes else {}  # the narrowest cache
        yield {"slots": "past_float", "n": 7, "shape": spec.float_slots_shape, **byte}
        if "int32" in spec.index_dtypes:  # a key built from the slot in an int32 index's dtype overflows
            yield {"slots": "past_float", "n": 7, "shape": spec.float_slots_shape, "index": "int32", **byte}
    if spec.sources and spec.index_dtypes and not spec.returns:  # key/value padded past the index
        for n in (0, 133):
            yield {"src": "longer", "n": n}
        yield _at_large_n(spec, {"src": "longer"})


def _strides(spec: OpSpec, profile: str, contract=None):
    if spec.sources:
        for layout in spec.source_layouts:
            yield from _with_large_n(spec, {"src": layout})
        if "head" in spec.fp8_scales:  # a per-head scale over strided rows: a head taken from the address
            yield {"src": spec.source_layouts[-1], "scale": "head", "fp8": "e4m3fn"}
        if len(spec.sources) > 1:
            yield {"src": "gapped"}
    for layout in ("strided", "offset") if spec.index_dtypes else ():
        for index in spec.index_dtypes:
            yield {"index_layout": layout, "index": index}
        yield _at_large_n(spec, {"index_layout": layout, "index": spec.index_dtypes[0]})
        if spec.index_2d_shape:  # strided in both of its dimensions, or at an offset
            yield {"index_layout": layout, "index": spec.index_dtypes[-1], "shape": spec.index_2d_shape}
    if spec.index_2d_shape:  # column-major (a transposed view): no longer a row-major walk
        yield {"index_layout": "transposed", "index": spec.index_dtypes[-1], "shape": spec.index_2d_shape}


def _aliasing(spec: OpSpec, profile: str, contract=None):
    for cache in spec.aliasing:
        yield from _with_large_n(spec, {"cache": cache})
    for layout in spec.layouts[1:]:
        yield from _with_large_n(spec, {"layout": layout})
        yield {"layout": layout, "src": "fused"}


def _padding(spec: OpSpec, profile: str, contract=None):
    """Every padding policy real kernels use, and the kernel's own reserved slot where it is
    another than 0."""
    if spec.index_dtypes and not spec.returns:
        policies = ["negative", "reserved:0"]
        if contract is not None and contract.padding.startswith("reserved:") and contract.padding not in policies:
            policies.append(contract.padding)
        for policy in policies:
            for index in spec.index_dtypes:
                yield {"padding": policy, "index": index}
            yield _at_large_n(spec, {"padding": policy, "index": spec.index_dtypes[0]})
            if spec.empty_rope_shapes:  # sglang's no-rope kernel skips no reserved slot
                yield {"padding": policy, "shape": spec.empty_rope_shapes[0]}
            # a decode step of one padding entry (a single-token fast path without the padding test)
            yield {"padding": policy, "index": spec.index_dtypes[0], "n": 1}
        if spec.sources and not spec.block_formats:  # tokens whose rows are all zeros are no padding
            yield {"values": "zero_rows"}


def _duplicates(spec: OpSpec, profile: str, contract=None):
    if spec.index_dtypes and not spec.returns:
        yield {"dups": True}


def _dcp(spec: OpSpec, profile: str, contract=None):
    if spec.dcp:
        for n in (133, 4096):
            yield {"dcp": True, "n": n}


def _large(spec: OpSpec, profile: str, contract=None):
    if spec.large_case:  # in every profile: int32 offsets are a common bug, and a case takes 1-7 s
        yield dict(spec.large_case, large=True)
        if "int32" in spec.index_dtypes:  # an int32 index: offsets computed in its type wrap
            yield dict(spec.large_case, large=True, index="int32")


def _fp8(spec: OpSpec, profile: str, contract=None):
    if not spec.fp8:
        return
    formats = tuple(FORMATS) if profile != "quick" else ("e4m3fn", "e5m2")
    for fmt in formats:
        for scale in spec.fp8_scales:
            for values in ("random", "special", "double_rounding"):
                yield {"fp8": fmt, "scale": scale, "values": values}
    for fmt in (f for f in getattr(contract, "fp8_formats", ()) if f not in formats):  # quick: the
        # other formats a kernel declares (fnuz: one NaN, no -0) get their special values too
        yield {"fp8": fmt, "scale": "1.0", "values": "special"}
        yield {"fp8": fmt, "scale": spec.fp8_scales[-1], "values": "random"}
    if spec.fp8_mixed_scales:  # one scale per tensor, the other per head
        for scale in MIXED_SCALES:
            yield {"fp8": "e4m3fn", "scale": scale, "values": "random"}
    if "head" in spec.fp8_scales:  # 32 per-head scales (a table of 16 wraps) over N = H tokens (a
        # per-token scale, where a kernel takes one, is a tensor of the same length)
        yield {"fp8": "e4m3fn", "scale": "head", "values": "random", "shape": WIDE_HEADS, "n": WIDE_HEADS[0]}
        # head 0's scale exactly 1: a unit-scale fast path that looks at scale[0] alone
        yield {"fp8": "e4m3fn", "scale": UNIT_FIRST_HEAD, "values": "random"}
        if "HND" in spec.layouts:  # per-head scales over the other layout (a head taken from the address)
            yield {"fp8": "e4m3fn", "scale": "head", "values": "random", "layout": "HND"}
    if "float16" in spec.dtypes:  # float16 sources' own specials (65504, inf, NaN payloads) under a unit
        for fmt in ("e4m3fn", "e5m2"):  # scale: a half-precision fast path, or a widening trick
            yield {"fp8": fmt, "scale": "1.0", "values": "special", "dtype": "float16"}
    if spec.fp8_optional:  # an unquantized call under scales it must ignore (a calibrated
        for scale in spec.fp8_scales[1:]:  # checkpoint's scales, served with kv_cache_dtype "auto")
            yield {"scale": scale}
    # a scale just past 1 (1 + 2**-10), which a unit-scale fast path with a tolerance takes for 1;
    # float16 sources, whose type holds it (narrowed to bfloat16 it is 1: another bug, the same codes)
    yield {"fp8": "e4m3fn", "scale": NEAR_UNIT_SCALE, "values": "random",
           **({"dtype": "float16"} if "float16" in spec.dtypes else {})}
    for dtype in (d for d in ("bfloat16", "float16") if d in spec.dtypes):  # every 16-bit pattern: a
        for fmt, scale in (("e4m3fn", "1.0"), ("e4m3fn", "0.0123"), ("e4m3fn", POWER_OF_TWO_SCALE),
                           ("e5m2", "1.0")):  # conversion table, a bit trick or an exponent-field scale
            yield {"fp8": fmt, "scale": scale, "values": "every_bits", "dtype": dtype, "n": EVERY_BITS_N}
    # a power-of-two scale, which a fast path may apply to the exponent field (NaN, inf, subnormals)
    yield {"fp8": "e4m3fn", "scale": POWER_OF_TWO_SCALE, "values": "special"}
    if spec.large_n_shape:  # past the size gates, where a fast path may convert another way
        yield {"fp8": "e4m3fn", "scale": "0.0123", "values": "special", "n": LARGE_N, "shape": spec.large_n_shape}
    if spec.fp8_tail_shape:  # rows of no multiple of 16 elements: a vector loop's scalar tail
        for fmt in ("e4m3fn", "e5m2"):
            yield {"fp8": fmt, "scale": "1.0", "values": "special", "shape": spec.fp8_tail_shape}
            yield {"fp8": fmt, "scale": spec.fp8_scales[-1], "values": "random", "shape": spec.fp8_tail_shape}
    for name, fmt in getattr(contract, "kv_cache_dtypes", ()):  # every name the kernel takes
        yield {"fp8": fmt, "spelling": name, "scale": spec.fp8_scales[-1], "values": "random"}
        yield {"fp8": fmt, "spelling": name, "scale": "1.0", "values": "special"}


def _block_scaled(spec: OpSpec, profile: str, contract=None):
    """Each block format with each value set (NVFP4 under each per-tensor scale), a head whose D
    is not a multiple of the block, and, for a paged writer, the swizzled scale cache."""
    from .ops._blockcases import GLOBAL_SCALES, VALUE_SETS

    for fmt in spec.block_formats:
        for values in VALUE_SETS:
            scales = GLOBAL_SCALES if fmt == "nvfp4" and values in ("random", "special") else (None,)
            for scale in scales if profile != "quick" or values == "special" else scales[:1]:
                yield {"block": fmt, "values": values, "scale": scale}
        yield {"block": fmt, "shape": spec.straddle_shape, "values": "special"}
        yield {"block": fmt, "shape": spec.straddle_shape, "values": "nonfinite"}  # a partial block all NaN
        # float16 sources at its own extremes: a scale computed in the source dtype under- or overflows
        yield {"block": fmt, "values": "special", "dtype": "float16"}
        if spec.layouts:
            yield {"block": fmt, "layout": spec.layouts[-1]}
            yield {"block": fmt, "scale_layout": "swizzled"}
            yield {"block": fmt, "scale_layout": "swizzled", "values": "special", "shape": spec.straddle_shape}
            yield {"block": fmt, "scale_layout": "swizzled", "padding": "negative"}
            # pages of 208 rows and 5 (MX) or 10 (NVFP4) columns: two row tiles and two or three
            # column tiles, both padded, so tile order and the in-tile interleave are reached
            yield {"block": fmt, "scale_layout": "swizzled", "shape": spec.wide_page_shape}


def _repeat(spec: OpSpec, profile: str, contract=None):
    """Two calls on the same tensors, every input redrawn in place between them (oracle.ops._repeat):
    the ordinary case, each fp8 scale variant but 1.0, a per-tensor-scaled block format; where the
    op has sources, the same slots rewritten with values changed only in places (signed zeros, each
    row's last element); and, where an index can hold an illegal slot, a second call that must be
    rejected (at N = 133 and at N = 1, a decode step)."""
    yield {"repeat": "inplace"}
    if spec.sources:  # the same slots written again, changed only in places (a skipped rewrite)
        yield {"repeat": "rewrite"}
        if spec.fp8:
            yield {"repeat": "rewrite", "fp8": "e4m3fn"}
    if spec.fp8:  # not under scale 1.0: a kernel that ignores the scale would look stale there
        for scale in spec.fp8_scales:
            if scale != "1.0":
                yield {"repeat": "inplace", "fp8": "e4m3fn", "scale": scale}
    if "nvfp4" in spec.block_formats:
        yield {"repeat": "inplace", "block": "nvfp4"}
    if "out_of_range" in spec.bad_inputs():
        yield {"repeat": "interior"}  # an index with the first call's length and ends, reversed between
        yield {"repeat": "bad"}
        yield {"repeat": "bad", "n": 1}
    # after a call of another variant (oracle.ops._repeat.calls_before): state kept per process
    # and keyed without the format, the strides or cache layout, or the dtype
    if spec.fp8:
        yield {"fp8": "e4m3fn", "after": "fp8=e5m2"}
        yield {"fp8": "e5m2", "after": "fp8=e4m3fn"}
    if "head" in spec.fp8_scales:  # a launch plan keyed without the scale's kind, made for either
        yield {"fp8": "e4m3fn", "scale": "head", "after": "scale=0.0123"}
        yield {"fp8": "e4m3fn", "scale": "0.0123", "after": "scale=head"}
    formats = spec.block_formats
    for fmt, other in zip(formats, formats[1:] + formats[:1]) if len(formats) > 1 else ():
        yield {"block": fmt, "after": f"block={other}"}
    if spec.sources and "fused" in spec.source_layouts:  # a launch plan keyed by shapes, not strides
        yield {"src": "fused", "after": "src=contig"}
    for layout in spec.layouts[1:]:
        yield {"layout": layout, "after": f"layout={spec.layouts[0]}"}
    if len(spec.index_dtypes) > 1 and not spec.returns:  # a launch plan keyed without the index's dtype
        yield {"index": spec.index_dtypes[-1], "after": f"index={spec.index_dtypes[0]}"}
    for shape, other in spec.after_shapes:
        yield {"shape": shape, "after": "shape=" + shape_text(other), **spec.after_shape_params}
    if len(spec.dtypes) > 1 and spec.sources:  # a source's dtype (an SWA mapping's is no source's)
        yield {"dtype": spec.dtypes[0], "after": f"dtype={spec.dtypes[1]}"}
        if "1.0" in spec.fp8_scales:  # a unit-scale fast path's code table, built per format alone
            yield {"dtype": spec.dtypes[0], "fp8": "e4m3fn", "scale": "1.0", "after": f"dtype={spec.dtypes[1]}"}


def _contexts(spec: OpSpec, profile: str, contract=None):
    """Calls made as serving engines make them (oracle.ops._modes: call_context, as_called).

    Inside ``torch.inference_mode()`` on inputs made there: inference tensors carry no version
    counter, and an in-place change of one moves nothing a kernel could key a memo on. The ordinary
    case, again past the size gates, and where the op has an index, two calls on the same tensors
    past them: every input redrawn in place, and an illegal slot written in place, which a check
    kept from the first call misses.

    Through ``torch.compile``: an op registered with torch.library that does not declare the
    tensors it writes loses its write to functionalization, and a value read at tracing time is
    baked into the graph. The ordinary case, again past the size gates, and two calls on the same
    tensors, every input redrawn in place between them (the second replays the first's graph), and
    past the size gates an illegal slot written in place before the second (a check made while
    tracing, or kept across calls, stays in the graph)."""
    yield {"torch_mode": "inference"}
    yield _at_large_n(spec, {"torch_mode": "inference"})
    if spec.index_dtypes and not spec.returns:
        yield _at_large_n(spec, {"torch_mode": "inference", "repeat": "inplace"})
        if "out_of_range" in spec.bad_inputs():
            yield _at_large_n(spec, {"torch_mode": "inference", "repeat": "bad"})
    yield {"torch_mode": "compile"}
    yield _at_large_n(spec, {"torch_mode": "compile"})
    yield {"torch_mode": "compile", "repeat": "inplace"}
    if "out_of_range" in spec.bad_inputs():  # a check made while tracing, kept in the graph
        yield _at_large_n(spec, {"torch_mode": "compile", "repeat": "bad"})


def _bad_input(spec: OpSpec, profile: str, contract=None):
    """Each bad input the spec makes; an illegal slot also in a decode step (N = 1: a kernel that
    checks only batches past some size) and past the size gates (N = LARGE_N, where it is the last
    entry: a check that covers only a prefix misses it)."""
    for bad in spec.bad_inputs():
        yield {"bad": bad}
    if "out_of_range" in spec.bad_inputs():
        yield {"bad": "out_of_range", "n": 1}
        yield {"bad": "out_of_range", "n": LARGE_N}
    if "negative_two" in spec.bad_inputs():  # a -2 that plain indexing wraps instead of raising
        yield {"bad": "negative_two", "n": 1}
    for bad in ("negative_two", "sentinel_index"):  # entries a wrapping gather takes for legal ones,
        if bad in spec.bad_inputs():  # past a check that covers only a prefix of a long index
            yield {"bad": bad, "n": LARGE_N}
    if "scale_nan" in spec.bad_inputs() and "head" in spec.fp8_scales:  # NaN in the last head's scale
        yield {"bad": "scale_nan", "scale": "head"}


GENERATORS = {"dtypes": _dtypes, "sizes": _sizes, "strides": _strides, "aliasing": _aliasing,
              "padding": _padding, "duplicates": _duplicates, "dcp": _dcp, "large": _large, "fp8": _fp8,
              "block_scaled": _block_scaled, "repeat": _repeat, "contexts": _contexts, "bad_input": _bad_input}


def catalogue(op: str, profile: str = "quick", contract=None) -> list[Case]:
    """Every case of ``op`` in ``profile``, in a stable order, without duplicate ids. With a
    ``contract``, also the cases only that kernel's declarations call for (its own reserved
    padding slot)."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is not one of {', '.join(PROFILES)}")
    spec = SPECS[op]
    seen, out = set(), []
    for case_class in CASE_CLASSES:
        for params in GENERATORS[case_class](spec, profile, contract):
            case = Case.make(op, case_class, **params)
            if case.id not in seen:
                seen.add(case.id)
                out.append(case)
    return out
