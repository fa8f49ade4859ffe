"""fp8 conversions a hand-written quantizer gets wrong in more than one place at once, named as the
one bug they are: a vector loop whose scalar tail forgot the scale (part_unscaled), a
sign-magnitude conversion that takes the sign from ``x < 0`` (-0 and negative NaN lose it), and a
quotient computed in the 16-bit source's own arithmetic (the scale rounded to it too). Every
failure of each in the quick catalogue names it; the baseline passes the same cases."""

from __future__ import annotations

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")


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


@pytest.mark.parametrize("fn, cause, words", [(tail_unscaled, "part_unscaled", "stored without the scale"),
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
    assert {cid: (o.cause or {}).get("id") for cid, o in failed.items() if (o.cause or {}).get("id") != cause} == {}
    assert all(words in o.cause["text"] for o in failed.values())
