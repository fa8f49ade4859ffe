"""fp8 case inputs, and the scale modes that replay a kernel's quotient, shared by the op specs
that quantize (their bug hypotheses: :mod:`oracle.ops._fp8hypotheses`).

Case parameters of the "fp8" class: ``fp8`` (the format), ``scale`` and ``values``.

``scale``: "1.0" (the scale-free path), "0.0123" (per tensor; not a power of two, so ``x / s``,
``x * (1/s)`` and ``x * s`` differ) or "head" (one float32 scale per head). A second tensor of the
same op (V next to K) gets a different scale, 2.61 times larger, so swapping them shows.

``values``:

- "random": ordinary activations (normal, sigma 2) in the case's dtype.
- "special": float32 sources whose QUOTIENT ``x / scale`` is, bit for bit, each of: every code of
  the format, every tie between adjacent codes (subnormal ties and the tie between 0 and the
  smallest subnormal included), ±max, the tie above max and its neighbours, values that overflow
  (2*max, 1e30, the float32 max), quarter and half of the smallest subnormal, ±0, ±inf and NaN of
  both signs (with and without payload), plus a few raw sources (±float32 max, whose quotient is
  inf for scales below 1, and values near the bottom of float32's range: a subnormal, the smallest
  normals, whose exponent field a division done on it wraps). Where several sources give the quotient, the one whose ``x * (1/s)``
  lands on another fp8 code is taken, so the case also tells division from reciprocal
  multiplication. A quotient no float32 source reaches exactly keeps the nearest source (its
  rounding is accepted): for K's 0.0123 that is about a third of the targets, the ties whose
  significand is 1.3125 or more (464, the tie above e4m3fn's max, among them); V's 0.0321 and the
  per-head scales reach 85-99% of them, scale 1 all.
- "double_rounding": float32 sources whose quotient rounds to a different code when it is first
  rounded to float16 or bfloat16: for every tie, quotients one ulp, 0.75 and 2 float16 half-ulps
  from it on the side away from the even code (the last only bfloat16 pulls back to the tie), one
  float32 ulp below every code (truncation keeps the code below; float16 rounding first lands on
  the code), and the witnesses 0x3F080001 and 0x3F37F333 (e4m3fn: 0x31 direct, 0x30 via float16;
  0x33 and 0x34).
- "every_bits": each 16-bit pattern of a float16 or bfloat16 source in turn (N = 128 rows of 512
  elements or more hold them all): a conversion table one entry short, or a bit trick wrong for
  one exponent, shows.

The value sets are built in float32 and the spec uses float32 sources for them unless the case
names a dtype (then the sources are rounded to it and the exactness is lost, knowingly).
"""

from __future__ import annotations

import functools

import numpy as np

from ..buffers import NUMPY_DTYPES
from ..contract import Contract
from ..reference import fp8 as _fp8
from . import _build

SCALES = ("1.0", "0.0123", "head")
NEAR_UNIT_SCALE = "1.0009765625"  # 1 + 2**-10: a unit-scale test with a tolerance takes it for 1
POWER_OF_TWO_SCALE = "4.0"  # one case's scale: 2**k, whose division a fast path may do on the exponent
# one tensor's scale per tensor, the other's per head ("k_tensor_v_head": the first's per tensor):
# a writer that takes both scales' kind from one of them reads the other wrongly
MIXED_SCALES = ("k_tensor_v_head", "k_head_v_tensor")
# per-head scales whose head 0 is exactly 1: a unit-scale fast path decided on scale[0] alone
# skips every head
UNIT_FIRST_HEAD = "head_unit_first"
PER_HEAD_SCALES = ("head", UNIT_FIRST_HEAD) + MIXED_SCALES  # the choices that need per-head scales declared
VALUE_SETS = ("random", "special", "double_rounding", "every_bits")
EVERY_BITS_N = 128  # tokens of an "every_bits" case: rows of 512 elements or more hold all 2**16 patterns
EXACT_SETS = ("special", "double_rounding")  # built in float32
SECOND_SCALE = 2.61  # V's scale relative to K's
KNOBS = tuple(_fp8.Fp8Knobs.__dataclass_fields__)
LITERAL_WITNESSES = (0x3F080001, 0x3F37F333)
_F32 = np.float32


def with_defaults(p: dict, case_params: dict) -> dict:
    """float32 sources for the exact value sets unless the case names a dtype."""
    if p.get("values") in EXACT_SETS and "dtype" not in case_params:
        p["dtype"] = "float32"
    return p


def kv_cache_dtype(contract: Contract, p: dict) -> str:
    """The kv_cache_dtype string the kernel is called with: the case's ``spelling`` (one of the
    contract's ``kv_cache_dtypes`` names), else the contract's name for the case's format."""
    return p.get("spelling") or contract.kv_cache_dtype(p.get("fp8"))


def cache_dtype(contract: Contract, fmt: str) -> str:
    """The view dtype of an fp8 cache: uint8 codes, or the format's torch float8 dtype where the
    contract takes float8 caches (a Triton writer that stores through the cache's element type)."""
    return "uint8" if contract.fp8_cache == "uint8" else f"float8_{fmt}"


def scale_values(choice: str, heads: int, tensor: int = 0) -> np.ndarray:
    """The float32 scale of case parameter ``choice``: shape (1,), or (heads,) for "head".
    ``tensor`` 0 is the first (or only) tensor's scale, 1 the second's."""
    if choice in MIXED_SCALES:
        return scale_values("head" if (choice == "k_tensor_v_head") == bool(tensor) else "0.0123", heads, tensor)
    if choice == UNIT_FIRST_HEAD:
        values = scale_values("head", heads, tensor)
        values[0] = 1.0
        return values
    if choice not in SCALES + (POWER_OF_TWO_SCALE, NEAR_UNIT_SCALE):
        raise ValueError(f"scale={choice!r} is not one of "
                         f"{SCALES + MIXED_SCALES + (POWER_OF_TWO_SCALE, NEAR_UNIT_SCALE, UNIT_FIRST_HEAD)}")
    if choice == "1.0":
        return np.ones(1, _F32)
    factor = SECOND_SCALE if tensor else 1.0
    if choice == "head":
        h = np.arange(heads)
        return (0.0123 * factor * (1.0 + 0.37 * ((h + 3 * tensor) % 7))).astype(_F32)
    return np.array([float(choice) * factor], _F32)


def power_of_two_exponent(scale: np.ndarray) -> int:
    """K where ``scale`` is one float32 equal to ``2**K``, else 0."""
    flat = np.asarray(scale, _F32).reshape(-1)
    if flat.size != 1 or not np.isfinite(flat[0]) or flat[0] <= 0:
        return 0
    mantissa, exponent = np.frexp(flat[0])
    return int(exponent - 1) if mantissa == 0.5 else 0


def broadcast_scale(scale: np.ndarray, ndim: int, head_axis: int = -2) -> np.ndarray:
    """``scale`` ((1,) or (H,)) shaped to broadcast over an array of ``ndim`` dims whose heads lie
    on ``head_axis``."""
    scale = np.asarray(scale, _F32)
    if scale.size == 1:
        return scale.reshape(())
    axis = head_axis % ndim
    return scale.reshape((scale.size,) + (1,) * (ndim - 1 - axis))


def values(rng: np.random.Generator, kind: str, fmt: str, shape, dtype: str, scale: np.ndarray,
           head_axis: int = -2) -> np.ndarray:
    """Source values of value set ``kind`` for format ``fmt``, placed for ``scale``."""
    if kind not in VALUE_SETS:
        raise ValueError(f"values={kind!r} is not one of {VALUE_SETS}")
    if kind == "random":
        return _build.values(rng, shape, dtype)
    if kind == "every_bits":  # each 16-bit pattern in turn: a conversion table or bit trick that misses one
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"values='every_bits' takes a 16-bit float dtype, not {dtype!r}")
        size = int(np.prod(shape))
        return (np.arange(size) % (1 << 16)).astype(np.uint16).view(NUMPY_DTYPES[dtype]).reshape(shape)
    pool, raw = special_pool(fmt) if kind == "special" else (double_rounding_pool(fmt), None)
    size = int(np.prod(shape))
    picks = np.arange(size) % len(pool)
    quotients = pool[picks].reshape(shape)
    keep = np.zeros(shape, bool) if raw is None else raw[picks].reshape(shape)
    s = np.broadcast_to(broadcast_scale(scale, len(shape), head_axis), shape)
    x = place(quotients, keep, s, fmt)
    if kind == "special" and x.ndim > 1 and x.size:  # the first head (row) all zeros, signed: an amax of 0
        x[(0,) * (x.ndim - 1)] = np.where(np.arange(x.shape[-1]) % 2, _F32(-0.0), _F32(0.0))
    with np.errstate(all="ignore"):  # a narrower dtype rounds (and overflows) the sources
        return x.astype(NUMPY_DTYPES[dtype])


def place(quotients: np.ndarray, keep: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """float32 sources ``x`` with ``fl(x / scale) == quotients`` bit for bit where a float32 ``x``
    within 4 ulps of ``quotient * scale`` gives it, preferring one whose ``x * fl(1/scale)``
    rounds to another code of ``fmt``; elsewhere that nearest ``x``. Non-finite quotients, unit
    scales and ``keep`` entries are sources as they are."""
    x = quotients.astype(_F32, copy=True)
    todo = np.isfinite(quotients) & ~keep & (scale != 1)
    if not todo.any():
        return x
    q, s = quotients[todo].astype(_F32), scale[todo].astype(_F32)
    with np.errstate(over="ignore"):  # a quotient near float32's max under a scale past 1: inf
        x0 = (q.astype(np.float64) * s).astype(_F32)  # the product of two float32 is exact in float64
    candidates, up, down = [x0], x0, x0
    for _ in range(4):
        up, down = np.nextafter(up, _F32(np.inf)), np.nextafter(down, _F32(-np.inf))
        candidates += [down, up]
    c = np.stack(candidates)
    with np.errstate(all="ignore"):
        hit = (c / s).view(np.uint32) == q.view(np.uint32)
        product = (c * (_F32(1) / s)).astype(_F32)
    codes = _fp8.quantize(q, fmt)
    witness = hit & (_fp8.quantize(product.reshape(-1), fmt).reshape(c.shape) != codes)
    pick = np.where(witness.any(0), witness.argmax(0), np.where(hit.any(0), hit.argmax(0), 0))
    x[todo] = c[pick, np.arange(c.shape[1])]
    return x


def _code_magnitudes(fmt: str) -> np.ndarray:
    """The values of codes 0..max (sign clear), float64."""
    form = _fp8.get_format(fmt)
    return _fp8.code_values(fmt)[: form.max_code + 1].astype(np.float64)


def _signed(magnitudes) -> np.ndarray:
    m = np.asarray(magnitudes, np.float64).astype(_F32)
    return np.concatenate([m, -m])


@functools.lru_cache(maxsize=8)
def special_pool(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(quotients, raw): the "special" targets of ``fmt`` (float32) and which are raw sources."""
    codes = _code_magnitudes(fmt)
    ties = (codes[:-1] + codes[1:]) / 2
    maximum, step = codes[-1], codes[-1] - codes[-2]
    above = maximum + step / 2
    fmax = float(np.finfo(_F32).max)
    edges = [above, np.nextafter(_F32(above), _F32(0)), np.nextafter(_F32(above), _F32(np.inf)),
             2 * maximum, 1e30, fmax, codes[1] / 4, codes[1] / 2,
             np.nextafter(_F32(codes[1] / 2), _F32(1)), np.nextafter(_F32(codes[1] / 2), _F32(0))]
    # just below each power of two past the first code, far from any tie even once scaled: they
    # round up into the next binade (the rounding's carry into the exponent)
    powers = codes[(codes > codes[1]) & (np.frexp(codes)[0] == 0.5)]
    finite = _signed(np.concatenate([codes, ties, edges, powers * 0.985]))
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC12345], np.uint32).view(_F32)
    specials = np.concatenate([finite, np.array([np.inf, -np.inf], _F32), nans])
    # sources as they are: float32's max, and values near the bottom of float32's range (a subnormal,
    # the smallest normals), whose exponent field an exponent-field division wraps
    tiny = np.array([0x00000001, 0x80000005, 0x00800000, 0x80C00000, 0x01000000], np.uint32).view(_F32)
    raw = np.concatenate([np.array([fmax, -fmax], _F32), tiny])
    pool = np.concatenate([specials, raw])
    keep = np.zeros(pool.shape, bool)
    keep[-raw.size:] = True
    pool.flags.writeable = keep.flags.writeable = False
    return pool, keep


@functools.lru_cache(maxsize=8)
def double_rounding_pool(fmt: str) -> np.ndarray:
    """The "double_rounding" quotients of ``fmt`` (float32)."""
    codes = _code_magnitudes(fmt)
    ties = (codes[:-1] + codes[1:]) / 2
    away = np.where(np.arange(ties.size) % 2 == 0, 1.0, -1.0)  # the side away from the even code
    exponent = np.floor(np.log2(ties))
    half16 = np.exp2(np.maximum(exponent - 10, -24)) / 2  # float16 half-ulp (subnormals: 2**-25)
    one_ulp = np.nextafter(ties.astype(_F32), (away * np.inf).astype(_F32)).astype(np.float64)
    # just below each code: plain truncation keeps the code below, float16 rounding first lands on it
    below = np.nextafter(codes[1:].astype(_F32), _F32(0)).astype(np.float64)
    targets = np.concatenate([one_ulp, ties + away * 0.75 * half16, ties + away * 2 * half16, below])
    literals = np.array(LITERAL_WITNESSES, np.uint32).view(_F32).astype(np.float64)
    pool = _signed(np.concatenate([targets, literals]))
    pool.flags.writeable = False
    return pool


# --- hypotheses: the fp8 bugs a failing kernel may have -----------------------------------------

def resolve(contract: Contract, fmt: str | None, override: dict) -> tuple[str | None, str | None, dict, dict]:
    """Split an ``expected(**override)`` into (the format to write, scale mode, fp8 arguments for
    the reference, the other overrides).

    The format is ``fmt`` unless a ``format`` override names another of :data:`FORMATS` (the
    kernel writes that format's codes). The fp8 arguments are the contract's preset and knobs,
    with a "preset" override replacing both and knob overrides replacing single knobs; under
    another format the contract's knobs are kept only where they are valid for it (a NaN byte of
    e4m3fn is not one of e4m3fnuz). Empty when ``fmt`` is None; a ``format`` override then is a
    ValueError."""
    rest = dict(override)
    mode = rest.pop("scale", None)
    preset = rest.pop("preset", None)
    written = rest.pop("format", None)
    knobs = {k: rest.pop(k) for k in list(rest) if k in KNOBS}
    if not fmt:
        if written is not None:
            raise ValueError(f"format={written!r}: the case writes no fp8")
        return None, mode, {}, rest
    written = written or fmt
    form = _fp8.get_format(written)
    if preset is not None:
        return written, mode, {"preset": preset} | knobs, rest
    args = {"preset": contract.fp8_preset, **dict(contract.fp8_knobs)} | knobs
    if written != fmt:
        try:
            _fp8.resolve_knobs(form, contract.fp8_preset, dict(contract.fp8_knobs) | knobs)
        except (TypeError, ValueError):
            args = {"preset": contract.fp8_preset} | knobs
    return written, mode, args, rest


def scaled_source(fmt: str | None, mode: str | None, source: np.ndarray, scale: np.ndarray):
    """:func:`apply_scale` for a write in ``fmt``: unquantized (``fmt`` None), the quotient in
    the source's own dtype again, which such a write copies."""
    quotient, scale = apply_scale(mode, source, scale)
    return (quotient.astype(source.dtype), scale) if fmt is None else (quotient, scale)


def apply_scale(mode: str | None, source: np.ndarray, scale: np.ndarray, head_axis: int = -2):
    """(source, scale) as the reference should see them under a scale mode: None (as given),
    "one" (the scale ignored), or a quotient the kernel computed otherwise, in float32, handed on
    with no scale: "divided" (``x / scale``: for an unquantized write, which must ignore the
    scale), "inverted" (``x * scale``), "token_axis" (token n divided by ``scale[n]``),
    "zero_input_positive" (``x / scale`` with a ±0 input made +0), "clamp_source=M" (x clamped to
    [-M, M], NaN kept, then divided), "head_major" (token n of head h by ``scale[(h * N + n) %
    S]``: a per-head scale repeated over head-major rows), "repeated" (a per-head scale broadcast over each ``[H * D]``
    row as ``scale[j % H]``: ``repeat`` where ``repeat_interleave`` was meant); steps on
    ``x / scale``, ";"-separated, in order: "nan=V" (NaN quotients replaced by V, as
    ``fminf``/``fmaxf`` clamps and ``nan_to_num`` do), "nan_signed=M" (NaN quotients replaced by M
    with the NaN's sign), "clamp=M" (clamped to [-M, M], NaN kept), "clamp_upper=M" and
    "clamp_lower=M" (clamped on one side only), "halved_subnormal_quantum=M" (quotients below the
    smallest normal M doubled: a subnormal branch that takes the minimum exponent as ``-bias``, not
    ``1 - bias``), "top_subnormals_unhidden=M" (quotients in ``[M/2, M)`` as ``2|q| - M``: a
    normal/subnormal threshold one binade low, so the top subnormal binade is encoded as a normal
    of exponent field 0, its implicit bit dropped), "minimum_exponent_off=M" (both: the threshold
    and the subnormal branch built around ``-bias``, so ``[M/2, M)`` as above and the quotients
    below it doubled); "exponent_field" (a per-tensor scale ``2**K``, K != 0, applied by
    subtracting K from the float32 exponent field, no guard: zeros, subnormals, inf and NaN wrap;
    a scale that is no power of two divides, so K's and V's scales each take their own path) and
    "exponent_field_guarded" (the same, zeros, inf and NaN passed through); "tail_unscaled=V" (the last ``D % V`` elements of each row,
    past its last whole V-element vector, left unscaled: a vector loop whose scalar tail forgot
    the scale); "sign_from_lt0" (``x / scale`` with -0 and negative NaN made positive first: a
    sign-magnitude conversion that takes the sign from ``x < 0``); "source_dtype_div" and
    "source_dtype_mul" (the quotient in the 16-bit source's own arithmetic: the scale, or its
    float32 reciprocal, rounded to that type, the quotient or product rounded to it, as ``__hdiv``
    and ``__hmul`` compute); "scale_source_dtype" (the scale rounded to the 16-bit source's type,
    the quotient in float32: ``x / scale.to(x.dtype)``); "vector_head=V" (a per-head scale read
    once per V-element vector along each token's flat ``[H * D]`` elements: a vector that starts in head h scales all its
    elements by head h's scale); "address_head=S[,T]" (rows S and heads T elements apart, T = D
    unless given: a per-head scale indexed by ``(offset // D) %
    H``, each head's offset from the tensor's start in rows S elements apart: the head it would
    have in dense rows)."""
    if mode is None:
        return source, scale
    if mode == "one":
        return source, np.ones(1, _F32)
    widened = source.astype(_F32)
    with np.errstate(all="ignore"):  # special values: inf and NaN sources
        if mode == "divided":
            quotient = widened / broadcast_scale(scale, widened.ndim, head_axis)
        elif mode == "inverted":
            quotient = widened * broadcast_scale(scale, widened.ndim, head_axis)
        elif mode.startswith("clamp_source="):  # x clamped (NaN kept), then divided
            bound = _F32(mode.split("=")[1])
            clamped = np.where(np.isnan(widened), widened, np.clip(widened, -bound, bound))
            quotient = clamped / broadcast_scale(scale, widened.ndim, head_axis)
        elif mode == "zero_input_positive":  # a zero input written as +0 before any conversion
            quotient = widened / broadcast_scale(scale, widened.ndim, head_axis)
            quotient = np.where(widened == 0, _F32(0), quotient)
        elif mode == "token_axis":  # token n by scale[n]
            flat = np.asarray(scale, _F32).reshape(-1)
            tokens = widened.shape[0]
            quotient = widened / flat[np.arange(tokens) % flat.size].reshape((tokens,) + (1,) * (widened.ndim - 1))
        elif mode == "repeated":
            flat = np.asarray(scale, _F32).reshape(-1)
            heads, dim = widened.shape[head_axis], widened.shape[-1]
            per_element = flat[np.arange(heads * dim) % flat.size].reshape(heads, dim)
            quotient = widened / per_element
        elif mode == "head_major":  # [H, N] rows flattened head-major: row h * N + n by scale[(h * N + n) % S]
            flat = np.asarray(scale, _F32).reshape(-1)
            tokens, heads = widened.shape[0], widened.shape[head_axis]
            rows = (np.arange(heads)[None, :] * tokens + np.arange(tokens)[:, None]) % flat.size
            quotient = widened / flat[rows].reshape(rows.shape + (1,) * (widened.ndim - 2))
        elif mode == "sign_from_lt0":  # sign-magnitude: -0 and negative NaN carry no sign (x < 0 is false)
            unsigned = np.where(np.isnan(widened) | (widened == 0), np.abs(widened), widened)
            quotient = unsigned / broadcast_scale(scale, widened.ndim, head_axis)
        elif mode in ("source_dtype_div", "source_dtype_mul"):  # __hdiv / __hmul(x, hrcp(s)) on 16-bit x
            narrow = source.dtype
            divisor = broadcast_scale(scale, widened.ndim, head_axis).astype(narrow)
            if mode == "source_dtype_div":
                quotient = (source / divisor).astype(narrow).astype(_F32)
            else:
                reciprocal = (_F32(1) / divisor.astype(_F32)).astype(narrow)
                quotient = (source * reciprocal).astype(narrow).astype(_F32)
        elif mode == "scale_source_dtype":  # the scale narrowed to x's 16-bit type, the quotient in float32
            divisor = broadcast_scale(scale, widened.ndim, head_axis).astype(source.dtype).astype(_F32)
            quotient = widened / divisor
        elif mode.startswith("address_head="):  # the head of each element's offset: rows S, heads T apart
            (tokens, heads, dim) = widened.shape[-3:]
            stride, head_stride = (int(v) for v in (mode.split("=")[1] + f",{dim}").split(",")[:2])
            flat = np.asarray(scale, _F32).reshape(-1)
            offset = (np.arange(tokens)[:, None] * stride + np.arange(heads)[None, :] * head_stride)
            quotient = widened / flat[(offset // dim) % heads % flat.size][..., None]
        elif mode.startswith("chunk_head="):  # flat chunks of C elements: the head of the offset in its chunk
            chunk, (tokens, heads, dim) = int(mode.split("=")[1]), widened.shape[-3:]
            flat = np.asarray(scale, _F32).reshape(-1)
            local = np.arange(tokens * heads * dim).reshape(tokens, heads, dim) % chunk
            quotient = widened / flat[(local // dim) % heads % flat.size]
        elif mode.startswith("vector_head="):  # each V-element vector of the flat [H * D] row: its first head's scale
            vector, (heads, dim) = int(mode.split("=")[1]), widened.shape[head_axis:][:2]
            flat = np.asarray(scale, _F32).reshape(-1)
            first = np.arange(heads * dim) // vector * vector // dim
            quotient = widened / flat[first % flat.size].reshape(heads, dim)
        elif mode.startswith("tail_unscaled="):  # the last D % V elements of each row unscaled
            width = widened.shape[-1]
            main = width - width % int(mode.split("=")[1])
            quotient = widened / broadcast_scale(scale, widened.ndim, head_axis)
            quotient[..., main:] = widened[..., main:]
        elif mode in ("exponent_field", "exponent_field_guarded"):  # 2**k off the exponent bits
            power = power_of_two_exponent(scale)
            if power:
                quotient = (widened.view(np.int32) - np.int32(power << 23)).view(_F32)
                if mode == "exponent_field_guarded":  # zeros, inf and NaN passed through
                    quotient = np.where((widened == 0) | ~np.isfinite(widened), widened, quotient)
            else:  # this tensor's scale is no power of two (or is 1): divided
                quotient = widened / broadcast_scale(scale, widened.ndim, head_axis)
        elif mode.startswith(("nan=", "clamp=", "nan_signed=", "clamp_upper=", "clamp_lower=",
                              "halved_subnormal_quantum=", "top_subnormals_unhidden=", "minimum_exponent_off=")):
            quotient = widened / broadcast_scale(scale, widened.ndim, head_axis)
            for step in mode.split(";"):  # in order, e.g. "clamp=448.0;nan=-448.0"
                kind, value = step.split("=")
                bound = _F32(value)
                if kind == "nan":
                    quotient = np.where(np.isnan(quotient), bound, quotient)
                elif kind == "nan_signed":  # NaN as the largest finite value, its sign kept
                    quotient = np.where(np.isnan(quotient), np.copysign(bound, quotient), quotient)
                elif kind == "clamp_upper":  # one side clamped (NaN compares false: kept)
                    quotient = np.where(quotient > bound, bound, quotient)
                elif kind == "clamp_lower":
                    quotient = np.where(quotient < -bound, -bound, quotient)
                elif kind == "halved_subnormal_quantum":  # below the smallest normal: the code of 2q
                    quotient = np.where(np.abs(quotient) < bound, 2 * quotient, quotient)
                elif kind in ("top_subnormals_unhidden", "minimum_exponent_off"):  # [min/2, min) encoded as
                    magnitude = np.abs(quotient)  # normals of exponent field 0: mantissa only
                    top = (magnitude >= bound / 2) & (magnitude < bound)
                    below = magnitude < bound / 2 if kind == "minimum_exponent_off" else np.zeros_like(top)
                    quotient = np.where(top, np.copysign(2 * magnitude - bound, quotient),
                                        np.where(below, 2 * quotient, quotient))
                else:
                    quotient = np.where(np.isnan(quotient), quotient, np.clip(quotient, -bound, bound))
        else:
            raise ValueError(f"scale mode {mode!r} is not one of apply_scale's modes")
    return quotient.astype(_F32), np.ones(1, _F32)
