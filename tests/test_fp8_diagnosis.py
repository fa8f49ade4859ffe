"""fp8 conversions a hand-written quantizer gets wrong in more than one place at once, named as the
one bug they are: a vector loop whose scalar tail forgot the scale (part_unscaled), a
sign-magnitude conversion that takes the sign from ``x < 0`` (-0 and negative NaN lose it), and a
quotient computed in the 16-bit source's own arithmetic (the scale rounded to it too). Every
failure of each in the quick catalogue names it; the baseline passes the same cases."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
ML_DTYPES = {name: getattr(ml_dtypes, f"float8_{name}") for name in FORMATS}


def tail_unscaled(out, x, scale, fmt):
    tn.quantize_fp8(out, x, scale, fmt)  # the checks, and the vector body
    main = x.shape[-1] - x.shape[-1] % 16
    if main < x.shape[-1]:
        tail = x[..., main:].contiguous()
        out[..., main:] = tn._fp8_codes(tail, torch.ones(1), fmt)  # the scalar tail: no scale


def sign_magnitude(out, x, scale, fmt):
    tn.quantize_fp8(out, x, scale, fmt)
    magnitude = tn._to_fp8_codes(x.abs(), scale, fmt)  # fnuz: NaN is 0x80 here, its only NaN
    negative = x < 0  # false for -0 and for a negative NaN
    if fmt.endswith("fnuz"):  # one zero, unsigned (0x80 is the NaN)
        negative = negative & (magnitude & 0x7F != 0)
    out.copy_(magnitude | (negative.to(torch.uint8) << 7))


def half_division(out, x, scale, fmt):
    tn.quantize_fp8(out, x, scale, fmt)
    if x.dtype in (torch.float16, torch.bfloat16):  # __hdiv: the scale and the quotient in x's type
        quotient = (x / scale.reshape(1, -1, 1).to(x.dtype)).float()
        out.copy_(tn._quotient_codes(quotient, x, fmt))


def scale_per_vector(out, x, scale, fmt):
    """Per-head scales read once per 8-element vector of each token's flat [H * D] elements."""
    tn.quantize_fp8(out, x, scale, fmt)
    heads, dim = x.shape[1:]
    flat = scale.reshape(-1)
    first_head = torch.arange(heads * dim) // 8 * 8 // dim
    per_element = flat[first_head % flat.numel()].reshape(1, heads, dim)
    out.copy_(tn._quotient_codes(x.float() / per_element, x, fmt))


def flat_remainder_truncated(out, x, scale, fmt):
    """A 64-element vector loop over the flattened tensor whose scalar remainder truncates (a code
    whose value lies past the quotient is stepped one down in magnitude)."""
    tn.quantize_fp8(out, x, scale, fmt)
    rest = x.numel() % 64
    if rest and rest < x.numel():
        q = (x.float() / scale.reshape(1, -1, 1)).reshape(-1)[-rest:]
        codes = out.reshape(-1)[-rest:]
        values = codes.view(tn.FP8_DTYPES[fmt]).float()
        over = (values.abs() > q.abs()) & torch.isfinite(q) & torch.isfinite(values) & (values != 0)
        out.view(-1)[-rest:] = torch.where(over, codes - 1, codes)


def nan_as_signed_max(out, x, scale, fmt):
    """NaN taken for a huge finite value (a saturation that tests the exponent field alone): the
    largest finite code, with the NaN's sign."""
    tn.quantize_fp8(out, x, scale, fmt)
    top = {"e4m3fn": 0x7E, "e5m2": 0x7B}.get(fmt, 0x7F)
    sign = torch.signbit(x).to(torch.uint8) << 7
    out.copy_(torch.where(torch.isnan(x), sign | top, out))


def ties_toward_plus_inf(out, x, scale, fmt):
    """floor(q + 0.5) on the signed quotient: a positive tie rounded up, a negative one toward zero
    (fixed up from the nearest-even codes by each code's neighbours, decoded by ml_dtypes)."""
    tn.quantize_fp8(out, x, scale, fmt)
    q = (x.float() / scale.float().reshape(1, -1, 1)).numpy()
    codes = out.numpy().astype(np.int64)
    table = np.arange(256, dtype=np.uint8).view(ML_DTYPES[fmt]).astype(np.float32)
    top = int(np.flatnonzero(np.isfinite(table[:0x80]))[-1])  # the largest finite magnitude code
    past = 2 * table[top] - table[top - 1]  # the step past it, where overflow starts
    overflowed = np.isfinite(q) & ~np.isfinite(table[codes])  # inf or NaN written for a finite quotient
    magnitude = np.where(overflowed, top + 1, codes & 0x7F)
    sign = np.where(overflowed, (q < 0) * 0x80, codes & 0x80)
    here = np.where(magnitude > top, past, table[np.minimum(magnitude, top)])
    up, down = table[np.minimum(magnitude + 1, top)], table[np.maximum(magnitude - 1, 0)]
    with np.errstate(invalid="ignore"):
        raise_positive = (q > 0) & (np.abs(q) == (here + up) / 2) & (magnitude < top)
        lower_negative = (q < 0) & (np.abs(q) == (here + down) / 2) & (magnitude > 0)
    lowered = sign | (magnitude - 1)
    if fmt.endswith("fnuz"):  # one zero, unsigned (0x80 is the NaN)
        lowered = np.where(magnitude == 1, 0, lowered)
    codes = np.where(raise_positive, magnitude + 1, np.where(lower_negative, lowered, codes))
    out.copy_(torch.from_numpy(codes.astype(np.uint8)))


def zero_input_positive(out, x, scale, fmt):
    """A zero test before the conversion: x == 0 (so -0 too) written as code 0."""
    tn.quantize_fp8(out, x, scale, fmt)
    out[x == 0] = 0


def source_clamped_before_the_scale(out, x, scale, fmt):
    """The saturation applied to x, then divided by the scale."""
    top = torch.finfo(tn.FP8_DTYPES[fmt]).max
    tn.quantize_fp8(out, torch.where(torch.isnan(x), x, x.clamp(-top, top)), scale, fmt)


def upper_clamp_only(out, x, scale, fmt):
    """Saturation as q > max ? max : q, then ml_dtypes' conversion, which does not saturate: a
    negative overflow or -inf is written as NaN (e5m2: -inf)."""
    q = (x.float() / scale.float().reshape(1, -1, 1)).numpy()
    top = float(torch.finfo(tn.FP8_DTYPES[fmt]).max)
    clamped = np.where(q > top, np.float32(top), q).astype(ML_DTYPES[fmt])
    tn.quantize_fp8(out, x, scale, fmt)  # the checks, and NaN inputs' own bytes
    codes = np.where(np.isnan(q), out.numpy(), clamped.view(np.uint8))
    out.copy_(torch.from_numpy(codes))


def _quotients(x, scale):
    return x.float() / scale.float().reshape(1, -1, 1)


def _codes_of(out, q, fmt, scale):
    """The kernel's checks on its own arguments, then the codes of the quotients ``q``."""
    tn.quantize_fp8(out, q, torch.ones_like(scale), fmt)


def ties_toward_zero(out, x, scale, fmt):
    """A hand-written e4m3fn conversion that rounds half down: where the nearest-even code lies
    above an exact tie, the one below it (the other formats converted right)."""
    tn.quantize_fp8(out, x, scale, fmt)
    if fmt != "e4m3fn":
        return
    q = _quotients(x, scale).double()
    codes = out.clone()
    lower = torch.where((codes & 0x7F) > 0, codes - 1, codes)
    value, below = (c.view(tn.FP8_DTYPES[fmt]).double() for c in (codes, lower))
    tie = ((codes & 0x7F) > 0) & torch.isfinite(value) & ((value + below) / 2 == q)
    out.copy_(torch.where(tie, lower, codes))


def _smallest_normal(fmt):
    return torch.finfo(tn.FP8_DTYPES[fmt]).smallest_normal


def subnormal_quantum_halved(out, x, scale, fmt):
    """A subnormal branch whose minimum exponent is -bias: quotients below the smallest normal
    get the code of twice their value."""
    q = _quotients(x, scale)
    _codes_of(out, torch.where(q.abs() < _smallest_normal(fmt), 2 * q, q), fmt, scale)


def top_subnormals_as_normals(out, x, scale, fmt):
    """The normal branch taken from half the smallest normal: the top subnormal binade encoded
    with exponent field 0 and its mantissa bits alone."""
    q, low = _quotients(x, scale), _smallest_normal(fmt)
    top = (q.abs() >= low / 2) & (q.abs() < low)
    _codes_of(out, torch.where(top, torch.copysign(2 * q.abs() - low, q), q), fmt, scale)


def minimum_exponent_minus_bias(out, x, scale, fmt):
    """Threshold and subnormal branch both built around -bias: the top subnormal binade encoded
    with exponent field 0, the quotients below it as the code of twice their value."""
    q, low = _quotients(x, scale), _smallest_normal(fmt)
    magnitude = q.abs()
    q = torch.where((magnitude >= low / 2) & (magnitude < low), torch.copysign(2 * magnitude - low, q),
                    torch.where(magnitude < low / 2, 2 * q, q))
    _codes_of(out, q, fmt, scale)


def exponent_field_division(out, x, scale, fmt):
    """A power-of-two scale applied by subtracting its exponent from the float32 bits, unguarded."""
    flat = scale.reshape(-1)
    if flat.numel() == 1 and float(flat[0]) == 4.0:
        q = (x.float().view(torch.int32) - (2 << 23)).view(torch.float32)
        return _codes_of(out, q, fmt, scale)
    tn.quantize_fp8(out, x, scale, fmt)


def clamped_at_240(out, x, scale, fmt):
    """One clamp for both e4m3 flavours: e4m3fnuz's 240."""
    q = _quotients(x, scale)
    if fmt == "e4m3fn":
        q = torch.where(torch.isnan(q), q, q.clamp(-240, 240))
    _codes_of(out, q, fmt, scale)


@pytest.mark.parametrize("fn, cause, words", [(nan_as_signed_max, "nan_mishandled", "NaN written as"),
                                              (upper_clamp_only, "fp8_conversion", "one-sided clamp|saturate=False"),
                                              (ties_toward_plus_inf, "ties_upward", "toward +inf"),
                                              (ties_toward_zero, "ties_toward_zero", "round half down"),
                                              (subnormal_quantum_halved, "subnormals_mishandled", "twice their value"),
                                              (top_subnormals_as_normals, "subnormals_mishandled", "implicit bit"),
                                              (minimum_exponent_minus_bias, "subnormals_mishandled", "-bias, not 1 - bias"),
                                              (exponent_field_division, "fp8_conversion", "exponent field, unguarded"),
                                              (clamped_at_240, "fp8_conversion", "e4m3fnuz's range"),
                                              (zero_input_positive, "negative_zero_mishandled", "written as +0"),
                                              (source_clamped_before_the_scale, "fp8_conversion", "before its division|saturate=True"),
                                              (tail_unscaled, "part_unscaled", "stored without the scale"),
                                              (scale_per_vector, "scale_misindexed", "once per 8-element vector"),
                                              (flat_remainder_truncated, "fp8_conversion", "remainder loop"),
                                              (sign_magnitude, "fp8_conversion", "sign-magnitude"),
                                              (half_division, "fp8_conversion", "half-precision")])
def test_every_failure_names_the_conversion_bug(fn, cause, words):
    fields = dict(op="quantize_fp8", backend="test", fp8_formats=FORMATS, fp8_preset=tn._torch_fp8_preset())
    wrong = Kernel(Contract(name="q." + fn.__name__, **fields), fn, "test")
    right = Kernel(Contract(name="q.baseline", **fields), tn.quantize_fp8, "test")
    failed = {}
    for case in catalogue("quantize_fp8", "quick", wrong.contract):
        if case.cls in ("fp8", "sizes"):
            outcome = run_case(wrong, case)
            if outcome.status == FAIL:
                failed[case.id] = outcome
                assert run_case(right, case).status == PASS
    assert failed
    # named by it, or (where another replay matches the same bytes, listed first) among the causes that also hold
    assert {cid: (o.cause or {}).get("id") for cid, o in failed.items()
            if cause not in [(o.cause or {}).get("id")] + [a["id"] for a in (o.cause or {}).get("also", ())]} == {}
    # "a|b": either words (under a unit scale a clamp of x is a saturating conversion)
    assert [cid for cid, o in failed.items() if not any(w in text for w in words.split("|") for text in
                                                        [o.cause["text"]] + [a["text"] for a in o.cause["also"]])] == []


def scale_head_from_the_address(out, x, scale, fmt):
    """A per-head scale indexed by ``(offset // D) % H`` of each head's offset in x: the right
    head in dense rows (or rows a multiple of H * D apart), another in padded ones."""
    tokens, heads, dim = x.shape
    offset = torch.arange(tokens)[:, None] * x.stride(0) + torch.arange(heads)[None, :] * x.stride(1)
    per_head = scale.reshape(-1)[(offset // dim) % heads % scale.numel()]
    out.copy_(tn._fp8_codes(x.float() / per_head[..., None], torch.ones(1), fmt))


def scale_in_the_source_dtype(out, x, scale, fmt):
    """The scale narrowed to x's type (scale.to(x.dtype)), the quotient in float32."""
    narrowed = scale.to(x.dtype).float().reshape(1, -1, 1)
    out.copy_(tn._fp8_codes(x.float() / narrowed, torch.ones(1), fmt))


def carry_lost(out, x, scale, fmt):
    """Codes whose rounding carried into the next binade (a normal quotient written as 2^(e+1))
    written as 2^e: the mantissa rounded apart from the exponent."""
    tn.quantize_fp8(out, x, scale, fmt)
    q = x.float() / scale.reshape(1, -1, 1)
    mbits = 3 if fmt.startswith("e4m3") else 2
    binade = (torch.frexp(q)[1] - 1).float()  # exact, where a float32 log2 may round up to 2^k
    normal = torch.isfinite(q) & (q.abs() >= torch.finfo(tn.FP8_DTYPES[fmt]).smallest_normal)
    steps = torch.round(q.abs() / torch.exp2(binade - mbits))  # half to even, in the binade's ulps
    carried = normal & (steps == 2 ** (mbits + 1))
    low = torch.copysign(torch.exp2(binade), q)
    out.copy_(torch.where(carried, tn._fp8_codes(low, torch.ones(1), fmt), out))


@pytest.mark.parametrize("fn, words", [(scale_in_the_source_dtype, "scale rounded to"),
                                       (carry_lost, "carry out of the mantissa lost")])
def test_a_scale_narrowed_or_a_lost_carry_is_named(fn, words):
    fields = dict(op="quantize_fp8", backend="test", fp8_formats=("e4m3fn", "e5m2"), fp8_preset=tn._torch_fp8_preset())
    wrong = Kernel(Contract(name="q." + fn.__name__, **fields), fn, "test")
    failed = {c.id: o for c in catalogue("quantize_fp8", "quick", wrong.contract)
              if c.cls in ("fp8", "dtypes") and (o := run_case(wrong, c)).status == FAIL}
    assert len(failed) >= 3, list(failed)
    assert {cid: (o.cause or {}).get("text") for cid, o in failed.items() if words not in (o.cause or {}).get("text", "")} == {}


def test_a_scale_head_taken_from_the_address_is_named():
    fields = dict(op="quantize_fp8", backend="test", fp8_formats=FORMATS, fp8_preset=tn._torch_fp8_preset())
    wrong = Kernel(Contract(name="q.address_head", **fields), scale_head_from_the_address, "test")
    outcomes = {c.id: run_case(wrong, c) for c in catalogue("quantize_fp8", "quick", wrong.contract)
                if c.cls in ("strides", "fp8")}
    failed = {cid: o for cid, o in outcomes.items() if o.status == FAIL}
    assert list(failed) == ["e4m3fn-interleaved_src-scale_head"], list(failed)
    assert all(o.cause["id"] == "scale_misindexed" and "offset" in o.cause["text"] for o in failed.values())


def e5m2_top_byte(out, x, scale, fmt):
    """e5m2 as the top byte of the float16 quotient (the shortcut through float16 bits), other
    formats right."""
    tn.quantize_fp8(out, x, scale, fmt)
    if fmt == "e5m2":
        half = (x.float() / scale.reshape(1, -1, 1)).half()
        half = torch.where(torch.isnan(half), torch.full_like(half, float("nan")).copysign(half), half)
        out.copy_((half.view(torch.int16) >> 8).to(torch.uint8))


def test_e5m2_as_the_top_byte_of_float16_is_named():
    fields = dict(op="quantize_fp8", backend="test", fp8_formats=FORMATS, fp8_preset=tn._torch_fp8_preset())
    wrong = Kernel(Contract(name="q.e5m2_top_byte", **fields), e5m2_top_byte, "test")
    cases = [c for c in catalogue("quantize_fp8", "quick", wrong.contract) if c.p.get("fp8") == "e5m2"]
    outcomes = [run_case(wrong, c) for c in cases]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed
    def names(o):
        return [o.cause["text"]] + [a["text"] for a in o.cause["also"]] if o.cause else []

    assert all(any("top byte" in text for text in names(o)) for o in failed), [o.message[-800:] for o in failed]
    # the double-rounding values hold quotients just below a code, where truncation alone differs
    assert all("top byte" in o.cause["text"] for c, o in zip(cases, outcomes)
               if o.status == FAIL and c.p.get("values") in ("double_rounding", "special")), \
        [o.message[-800:] for o in failed]


def scale_memo_by_address():
    """A quantizer that reads each scale tensor once, keyed on its data_ptr (as a kernel that
    caches a host copy of its scale does): a later tensor at a freed address gets the old value."""
    memo = {}

    def kernel(out, x, scale, fmt):
        remembered = memo.setdefault(scale.data_ptr(), scale.clone())
        tn.quantize_fp8(out, x, remembered if remembered.shape == scale.shape else scale, fmt)
    return kernel


def test_a_memo_keyed_on_addresses_is_named_stale_state():
    """Cases of one shape reuse each other's freed addresses, so the memo hands a later case an
    earlier case's scale; the same case built at other addresses passes, which names the cause
    (not a scale that is "missing" because the stale value was 1.0)."""
    fields = dict(op="quantize_fp8", backend="test", fp8_formats=FORMATS, fp8_preset=tn._torch_fp8_preset())
    kernel = Kernel(Contract(name="q.scale_memo", **fields), scale_memo_by_address(), "test")
    chosen = [c for c in catalogue("quantize_fp8", "quick", kernel.contract)
              if c.cls == "fp8" and c.p.get("fp8") == "e4m3fn" and "shape" not in c.p and c.p.get("values") == "random"]
    outcomes = [run_case(kernel, c) for c in chosen]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed, [c.id for c in chosen]
    assert all(o.cause and o.cause["id"] in ("stale_state", "not_reproducible") for o in failed), \
        [o.message[-600:] for o in failed]


def test_a_rerun_elsewhere_builds_at_other_addresses_and_names_stale_state():
    """The rerun the diagnosis uses for address-keyed state: with ballast held, the case's tensors
    land where the previous build's did not; a kernel whose memo hits at every address it has seen
    fails a plain rerun and passes the one elsewhere, which names stale_state."""
    from oracle.buffers import Arena
    from oracle.diagnose.engine import explain_rejection
    from oracle.ops import get_spec
    from oracle.runner import Outcome, _rerun

    fields = dict(op="quantize_fp8", backend="test", fp8_formats=FORMATS, fp8_preset=tn._torch_fp8_preset())
    seen = []

    def recording(out, x, scale, fmt):
        seen.append(scale.data_ptr())
        tn.quantize_fp8(out, x, scale, fmt)

    kernel = Kernel(Contract(name="q.recording", **fields), recording, "test")
    spec = get_spec("quantize_fp8")
    case = next(c for c in catalogue("quantize_fp8", "quick", kernel.contract) if c.p.get("scale") == "0.0123")
    like = Arena("cpu", case.seed)
    spec.build(case, like, np.random.default_rng(case.seed), kernel.contract)
    assert _rerun(kernel, spec, case, lambda p: None)
    assert _rerun(kernel, spec, case, lambda p: None)
    assert seen[0] == seen[1]  # a plain rebuild reuses the freed address
    assert _rerun(kernel, spec, case, lambda p: None, like=like)
    assert seen[2] != seen[1]

    rerun = lambda other, change, elsewhere=False: elsewhere  # noqa: E731  stale wherever it has been
    failed = explain_rejection(Outcome(FAIL, "accepted\ncause: x [validation_missing]",
                                       cause={"id": "validation_missing"}), case, rerun=rerun)
    assert failed.cause["id"] == "stale_state" and "validation_missing" not in failed.message


def scale_kind_from_k(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Per-head or per-tensor decided from k_scale's shape alone: a per-head v_scale beside a
    per-tensor k_scale is read as per-tensor (its first head's value)."""
    if k_scale.numel() == 1 and v_scale.numel() > 1:
        v_scale = v_scale[:1]
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_scales_of_two_kinds_are_reached_and_named():
    """Only the cases whose K and V scales differ in kind fail, named as V's scale collapsed."""
    fields = dict(op="reshape_and_cache_flash", backend="test", fp8_formats=("e4m3fn", "e5m2"),
                  fp8_preset=tn._torch_fp8_preset(), padding="negative")
    wrong = Kernel(Contract(name="paged.scale_kind_from_k", **fields), scale_kind_from_k, "test")
    outcomes = {c.id: run_case(wrong, c) for c in catalogue("reshape_and_cache_flash", "quick", wrong.contract)
                if c.cls == "fp8"}
    failed = {cid: o for cid, o in outcomes.items() if o.status == FAIL}
    assert list(failed) == ["e4m3fn-scale_k_tensor_v_head-random"], list(failed)
    assert all(o.cause["id"] == "scale_collapsed" and "v_scale" in o.cause["text"] for o in failed.values())


def exponent_field_where_a_power_of_two(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                         k_scale, v_scale):
    """Each per-tensor scale that is a power of two, 2**k, applied by subtracting k from the
    float32 exponent field (unguarded); a scale that is not divides, as it should."""
    if kv_cache_dtype == "auto":
        return tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                          k_scale, v_scale)

    def quotient(x, scale):
        mantissa, exponent = np.frexp(float(scale.reshape(-1)[0]))
        if scale.numel() != 1 or mantissa != 0.5 or exponent == 1:
            return x.float() / scale.reshape(1, -1, 1)
        return (x.float().contiguous().view(torch.int32) - ((int(exponent) - 1) << 23)).view(torch.float32)

    one = torch.ones(1)
    tn.reshape_and_cache_flash(quotient(key, k_scale), quotient(value, v_scale), key_cache, value_cache,
                               slot_mapping, kv_cache_dtype, one, one)


def test_a_power_of_two_scale_through_the_exponent_field_is_named_with_the_other_scale_divided():
    """K's scale 4 goes through the exponent field, V's (4 * 2.61) is divided: the replay takes
    each tensor's own path, so the case is named."""
    fields = dict(op="reshape_and_cache_flash", backend="test", fp8_formats=("e4m3fn", "e5m2"),
                  fp8_preset=tn._torch_fp8_preset(), padding="negative")
    wrong = Kernel(Contract(name="paged.exponent_field", **fields), exponent_field_where_a_power_of_two, "test")
    right = Kernel(Contract(name="paged.baseline", **fields), tn.reshape_and_cache_flash, "test")
    cases = [c for c in catalogue("reshape_and_cache_flash", "quick", wrong.contract)
             if c.cls == "fp8" and c.p.get("scale") == "4.0"]
    failed = {c.id: run_case(wrong, c) for c in cases}
    failed = {cid: o for cid, o in failed.items() if o.status == FAIL}
    assert failed and all(run_case(right, c).status == PASS for c in cases if c.id in failed)
    assert {cid: o.cause["id"] for cid, o in failed.items()} == {cid: "fp8_conversion" for cid in failed}
    assert all("exponent field, unguarded" in o.cause["text"] for o in failed.values()), failed
