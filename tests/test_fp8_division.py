"""Approximate fp8 division: the reference's ``quotient_ulps`` knob and the contract's
``fp8_division="approx"``, which accepts the codes of any quotient within 2 float32 ulps.

Oracles are independent of the code under test: ml_dtypes' own fp8 casts, numpy's float32
division and ``np.nextafter`` stepped in plain loops, and kernels written in plain torch. No test
input is zero (a zero quotient has no direction to move in).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch

import oracle.runner as runner
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.mutants.kernels import paged_write
from oracle.mutants.bases import check_quantize
from oracle.reference.fp8 import quantize
from oracle.reference.presets import PRESETS
from oracle.reference.rounding import move_float32_ulps
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

F32 = np.float32
ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
SCALES = (F32(0.0123), F32(0.0321), F32(3.0), F32(1.7))
WARNING = re.compile(r"^(\d+) fp8 code\(s\) are the neighbouring code of a quotient within 2 ulps "
                     r"\(fp8_division='approx'\)$")


def nudged(q: np.ndarray, k: int) -> np.ndarray:
    """``q`` stepped ``|k|`` times by np.nextafter: away from zero (k > 0) or toward it (k < 0)."""
    out = q.astype(F32, copy=True)
    for _ in range(abs(k)):
        target = np.copysign(F32(np.inf), out) if k > 0 else np.zeros_like(out)
        out = np.where(np.isfinite(out) & (out != 0), np.nextafter(out, target), out).astype(F32)
    return out


def ml_codes(q: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' fp8 codes of float32 ``q`` (its own rounding, non-saturating)."""
    return q.astype(ML[fmt]).view(np.uint8)


def sources_near_ties(fmt: str, scale: F32, rng: np.random.Generator) -> np.ndarray:
    """float32 sources whose quotients by ``scale`` lie within a few ulps of each fp8 tie (both
    signs), plus random normals; no zeros."""
    codes = np.arange(1, 0x7F, dtype=np.uint8).view(ML[fmt]).astype(np.float64)
    codes = codes[np.isfinite(codes)]
    ties = (codes[:-1] + codes[1:]) / 2
    x = (ties * float(scale)).astype(F32)
    around = [x]
    up = down = x
    for _ in range(4):
        up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(0))
        around += [up, down]
    near = np.concatenate(around)
    noise = (rng.standard_normal(4096) * 2).astype(F32)
    out = np.concatenate([near, -near, noise])
    return out[out != 0]


# --- the knob ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(ML))
@pytest.mark.parametrize("scale", SCALES + (F32(1.0),))
def test_zero_ulps_is_the_plain_quotient(fmt, scale):
    """quotient_ulps=0 is today's result, which is ml_dtypes' cast of numpy's float32 quotient."""
    rng = np.random.default_rng(7)
    x = np.concatenate([sources_near_ties(fmt, scale, rng),
                        rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(F32),
                        np.array([np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30], F32),
                        np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001], np.uint32).view(F32)])
    x = x[x != 0]
    with np.errstate(all="ignore"):
        want = ml_codes(x / scale, fmt)
    got = quantize(x, fmt, scale=scale, preset="ml_dtypes", quotient_ulps=0)
    with np.errstate(all="ignore"):
        nan = np.isnan(x / scale)  # NaN payloads aside, compare NaN-ness there
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(ML[fmt]).astype(F32)).all()
    assert np.array_equal(got, quantize(x, fmt, scale=scale, preset="ml_dtypes"))


@pytest.mark.parametrize("k", [-3, -2, -1, 1, 2, 3])
def test_move_matches_nextafter_steps_and_keeps_the_sign(k):
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x00000001, 0x00000002, 0x00000003, 0x007FFFFF, 0x00800000, 0x7F7FFFFE,
                      0x7F7FFFFF, 0x3F800000], np.uint32)
    q = np.concatenate([bits, edges, edges | np.uint32(0x80000000)]).view(F32)
    q = q[np.isfinite(q) & (q != 0)]
    got = move_float32_ulps(q, k)
    want = nudged(q, k)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(np.signbit(got), np.signbit(q))  # zero keeps the sign: never crosses


def test_move_leaves_specials_alone():
    q = np.array([np.inf, -np.inf, np.nan], F32)
    q = np.concatenate([q, np.array([0xFFC12345, 0x7F800001], np.uint32).view(F32)])
    for k in (-2, 2, 10**12, -10**12):
        assert np.array_equal(move_float32_ulps(q, k).view(np.uint32), q.view(np.uint32))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e4m3fnuz"])
@pytest.mark.parametrize("k", [-2, -1, 1, 2])
@pytest.mark.parametrize("scale_op", ["div", "mul_reciprocal"])
def test_quantize_codes_the_moved_quotient(fmt, k, scale_op):
    """The code is ml_dtypes' cast of the float32 quotient stepped k times by nextafter."""
    scale = F32(0.0123)
    x = sources_near_ties(fmt, scale, np.random.default_rng(3))
    with np.errstate(all="ignore"):
        q = x / scale if scale_op == "div" else x * (F32(1) / scale)
    want = ml_codes(nudged(q, k), fmt)
    got = quantize(x, fmt, scale=scale, preset="ml_dtypes", scale_op=scale_op, quotient_ulps=k)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, quantize(x, fmt, scale=scale, preset="ml_dtypes", scale_op=scale_op))


def test_quotient_moves_before_the_16bit_intermediate():
    """Double rounding applies to the moved quotient: ml_dtypes float16, then fp8."""
    scale = F32(0.0123)
    x = sources_near_ties("e4m3fn", scale, np.random.default_rng(5))
    want = ml_codes(nudged(x / scale, 2).astype(np.float16).astype(F32), "e4m3fn")
    got = quantize(x, "e4m3fn", scale=scale, preset="ml_dtypes", intermediate="float16", quotient_ulps=2)
    np.testing.assert_array_equal(got, want)


def test_moving_toward_zero_never_crosses_it():
    """Tiny quotients moved far toward zero end as zero of their own sign: e4m3fn -0 is 0x80."""
    x = np.array([1e-40, -1e-40, 3e-4, -3e-4], F32)
    got = quantize(x, "e4m3fn", scale=F32(3.0), quotient_ulps=-(10**12))
    assert got.tolist() == [0x00, 0x80, 0x00, 0x80]


def test_unit_scale_moves_nothing():
    """x / 1 is exact even for approximate division: 1.0625 is the e4m3fn tie between 1.0 (0x38)
    and 1.125 (0x39), so any move would show; a per-head scale of 1 moves only its own head."""
    tie = np.full((2, 2, 1), 1.0625, F32)
    for k in (-2, 2):
        assert quantize(tie, "e4m3fn", scale=1.0, quotient_ulps=k).ravel().tolist() == [0x38] * 4
        per_head = quantize(tie * np.array([1, 2], F32)[:, None], "e4m3fn",
                            scale=np.array([1, 2], F32), quotient_ulps=k)
        moved = 0x39 if k > 0 else 0x38
        assert per_head[:, 0].ravel().tolist() == [0x38, 0x38]
        assert per_head[:, 1].ravel().tolist() == [moved, moved]


@pytest.mark.parametrize("bad", [1.5, "2", True, None, np.float32(1)])
def test_bad_quotient_ulps_is_named(bad):
    with pytest.raises(TypeError, match=r"quotient_ulps must be an int, got " + re.escape(repr(bad))):
        quantize(np.ones(2, F32), "e4m3fn", scale=0.5, quotient_ulps=bad)
    with pytest.raises(ValueError, match="quotient_ulps must be an int"):
        Contract(op="quantize_fp8", name="bad", backend="t", fp8_formats=("e4m3fn",),
                 fp8_knobs=(("quotient_ulps", bad),))


def test_presets_leave_the_quotient_exact():
    for preset in PRESETS.values():
        for fmt in preset.formats:
            assert preset.knobs(fmt).quotient_ulps == 0


# --- kernels that divide approximately -----------------------------------------------------------

def approx_quotient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` in float32, then moved 1 or 2 ulps in magnitude by a fixed pseudo-random
    pattern (as an approximate division may be off), sign kept, never past zero or inf; exact
    where the scale is a power of two (1 included: its reciprocal is exact, so is the product), and
    for zeros, inf and NaN."""
    s = scale.reshape(1, -1, 1).expand(x.shape)
    q = x.float() / s
    bits = q.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign, magnitude = bits & 0x80000000, bits & 0x7FFFFFFF
    i = torch.arange(q.numel(), dtype=torch.int64).reshape(q.shape)
    delta = torch.tensor([-2, -1, 1, 2])[((i * 40503) % 65536) >> 14]
    power_of_two = torch.frexp(s)[0] == 0.5
    movable = (magnitude != 0) & (magnitude < 0x7F800000) & ~power_of_two
    magnitude = torch.where(movable, (magnitude + delta).clamp(0, 0x7F800000), magnitude)
    out = sign | magnitude
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.float32)


def approx_codes(x, scale, fmt):
    return approx_quotient(x, scale).to(tn.FP8_DTYPES[fmt]).view(torch.uint8)


def times_scale_codes(x, scale, fmt):
    return (x.float() * scale.reshape(1, -1, 1)).to(tn.FP8_DTYPES[fmt]).view(torch.uint8)


def toward_zero_codes(x, scale, fmt):
    """Exact quotient, then the fp8 code rounded toward zero (where the nearest one is larger)."""
    q = x.float() / scale.reshape(1, -1, 1)
    codes = q.to(tn.FP8_DTYPES[fmt])
    back = codes.float()
    larger = torch.isfinite(back) & torch.isfinite(q) & (back.abs() > q.abs())
    raw = codes.view(torch.uint8)
    return torch.where(larger, raw - 1, raw)  # magnitude code - 1: the next code toward zero


def quantize_with(codes_fn, touch_source=False):
    def fn(out, x, scale, fmt):
        check_quantize(out, x, scale, fmt)
        out.copy_(codes_fn(x, scale, fmt))
        if touch_source:  # an otherwise allowed kernel that also writes its input
            x[0, 0, 0] = 12345.0
    return fn


def paged_with(codes_fn):
    """torch's paged write (its checks included) with ``codes_fn(rows, scale, fmt)`` converting."""
    return lambda *args: paged_write(*args, codes=codes_fn)


BUILDERS = {"quantize_fp8": quantize_with, "reshape_and_cache_flash": paged_with}


def kernel(op, codes_fn, division, **build):
    contract = Contract(op=op, name=f"{op}.{codes_fn.__name__}.{division}", backend="test",
                        validates=True, padding="negative" if op != "quantize_fp8" else "none",
                        fp8_formats=("e4m3fn", "e5m2"), fp8_preset=tn._torch_fp8_preset(),
                        fp8_division=division)
    return Kernel(contract, BUILDERS[op](codes_fn, **build), "test")


def fp8_cases(op):
    return [c for c in catalogue(op, "quick") if c.cls == "fp8" and c.p.get("fp8")]


def near_ties(case) -> bool:
    """The cases built from quotients on or one ulp from fp8 ties, under a scale that divides
    inexactly (not 1; under "4.0" V's scale is 4 * 2.61 where the op has two)."""
    return case.p["values"] in ("special", "double_rounding") and case.p["scale"] != "1.0" and not (
        case.p["scale"] == "4.0" and case.op == "quantize_fp8")


def params(keep=lambda case: True):
    return [pytest.param(op, case, id=f"{op}-{case.id}")
            for op in sorted(BUILDERS) for case in fp8_cases(op) if keep(case)]


@pytest.mark.parametrize("op,case", params())
def test_approximate_division_fails_ieee_near_ties_and_passes_approx(op, case):
    exact = run_case(kernel(op, approx_codes, "ieee"), case)
    if near_ties(case):
        assert exact.status == FAIL  # and the diagnosis names it, suggesting the declaration
        assert exact.cause["id"] == "approximate_division", exact.message
        assert "fp8_division='approx'" in exact.message
    elif case.p["scale"] == "1.0" or case.op == "quantize_fp8" and case.p["scale"] == "4.0":  # exact division
        assert exact.status == PASS and not exact.warning
    outcome = run_case(kernel(op, approx_codes, "approx"), case)
    assert outcome.status == PASS, outcome.message
    if exact.status == PASS:
        assert outcome.warning == ""
        return
    match = WARNING.match(outcome.warning)
    assert match and int(match.group(1)) > 0, outcome.warning
    if op == "quantize_fp8":  # one written region: the failure counted the same bytes
        assert int(match.group(1)) == exact.first["differing_bytes"]


@pytest.mark.parametrize("op,case", params(lambda c: c.p["scale"] != "1.0" and c.p["values"] != "random"))
def test_multiplying_by_the_scale_still_fails_under_approx(op, case):
    assert run_case(kernel(op, times_scale_codes, "approx"), case).status == FAIL
    ieee = run_case(kernel(op, times_scale_codes, "ieee"), case)
    assert ieee.status == FAIL and (ieee.cause or {}).get("id") != "approximate_division"


@pytest.mark.parametrize("op,case", params(lambda c: c.p["values"] == "random"))
def test_rounding_toward_zero_still_fails_under_approx(op, case):
    assert run_case(kernel(op, toward_zero_codes, "approx"), case).status == FAIL


def test_allowed_codes_do_not_excuse_other_writes():
    """Everything besides the fp8 codes (here the source, an input) must still match exactly."""
    case = next(c for c in fp8_cases("quantize_fp8") if near_ties(c))
    outcome = run_case(kernel("quantize_fp8", approx_codes, "approx", touch_source=True), case)
    assert outcome.status == FAIL
    assert "x is an input (source): the kernel modified it" in outcome.message


def test_passing_cases_are_not_re_examined(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("approximate-division check ran on a passing case")

    monkeypatch.setattr(runner, "within_approx_division", never)
    for case in fp8_cases("quantize_fp8"):
        outcome = run_case(kernel("quantize_fp8", tn._to_fp8_codes, "approx"), case)
        assert outcome.status == PASS and not outcome.warning, case.id
