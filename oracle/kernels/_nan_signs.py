"""Keeping a NaN's sign through torch's CPU arithmetic, for the torch baselines.

torch's CPU float16-to-float32 conversion returns the default NaN, sign cleared, in the elements
its vector loop leaves to the tail (the last 6 of a row of 46 with torch 2.13; the H100 host's
torch 2.11 did it too), while its fp8 casts keep a NaN's sign. A baseline that widens a source
would then write a negative NaN's code without its sign in those elements only, against the
presets it declares (tests/test_torch_baselines.py). The quotients and products computed from the
widened values are given the source's signs too, so no other loop of torch's can do the same.
"""

from __future__ import annotations

import torch


def signs(x: torch.Tensor) -> torch.Tensor:
    """-1.0 where ``x``'s sign bit is set, else 1.0 (float32), read from its bits: exact for every
    value, NaN included, whatever torch's arithmetic does with them."""
    bits = x.view({4: torch.int32, 2: torch.int16, 1: torch.int8}[x.element_size()])
    return torch.where(bits < 0, -1.0, 1.0)


def with_signs_of(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``q`` with the sign of ``x`` (same shape) in every element, on the CPU; elsewhere ``q`` as
    it is (the CUDA casts' NaN handling is declared by their own presets). For ``q`` a float32
    function of ``x`` that keeps its sign (a widening, a division by a positive scale), only the
    NaNs whose sign torch's CPU loops cleared change."""
    if q.device.type != "cpu":
        return q
    return torch.copysign(q, signs(x))
