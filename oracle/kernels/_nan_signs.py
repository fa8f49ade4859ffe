"""Keeping a NaN's sign through torch's CPU arithmetic, for the torch baselines.

torch's CPU half-to-float conversion and its division return the default NaN, sign cleared, in the
elements their vector loops leave to the tail (2 and 6 of a row of 46, torch 2.11 and 2.13), while
its fp8 casts keep a NaN's sign. A baseline that widens a source or divides it would then write a
negative NaN's code without its sign in those elements only, against the presets it declares
(tests/test_torch_baselines.py).
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
    NaNs torch's CPU loops cleared change."""
    if q.device.type != "cpu":
        return q
    return torch.copysign(q, signs(x))
