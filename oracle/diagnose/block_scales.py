"""What a block-scaled writer's wrong scales have in common.

Where a kernel's elements are right under the scales it wrote, only its scales are wrong: the
amax or the exponent they come from. The words here say how far the written scales lie from the
reference's (in binades for E8M0, as a ratio for e4m3fn) and which property every block with a
wrong scale shares that the blocks with a right one mostly lack (its largest magnitude is a
negative element's, it holds -inf, its amax is a float16 subnormal, ...): the property the
kernel's amax or exponent mishandles.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..reference.fp8 import code_values
from ..reference.nvfp4 import padded_blocks

E8M0_NAN = 0xFF
F16_SMALLEST_NORMAL = np.float32(2.0 ** -14)


def properties(x: np.ndarray, block: int, padded_tail: bool) -> dict:
    """Name -> bool ``[..., blocks]``: the properties of each block of ``x`` ([..., D] float32)
    a wrong amax or exponent typically follows."""
    blocks, real = padded_blocks(x, block)  # the last block padded with NaN, which ``real`` masks
    finite = np.isfinite(blocks)
    amax = np.where(finite, np.abs(blocks), np.float32(0)).max(axis=-1)
    top = np.where(finite, blocks, -np.inf).max(axis=-1)
    out = {
        "its largest magnitude is a negative element's": (amax > 0) & (top < amax),
        "it holds -inf": np.any(blocks == -np.inf, axis=-1),
        "it holds +inf": np.any(blocks == np.inf, axis=-1),
        "it holds NaN": np.any(np.isnan(blocks) & real, axis=-1),
        "it is all zero": np.all((blocks == 0) | ~real, axis=-1),
        "its amax is below float16's smallest normal (2^-14)": (amax > 0) & (amax < F16_SMALLEST_NORMAL),
    }
    if padded_tail:
        last = np.zeros(blocks.shape[:-1], bool)
        last[..., -1] = True
        out["it is a head's last, partial block"] = last
    return out


def _offsets(want: np.ndarray, got: np.ndarray, family: str) -> str:
    """How far the written scales lie from the reference's, commonest first."""
    if family == "mx":
        steps = Counter("NaN (0xFF) where the reference's is finite" if g == E8M0_NAN
                        else f"{int(g) - int(w):+d} binade(s)" for w, g in zip(want, got))
    else:
        values = code_values("e4m3fn")
        steps = Counter()
        for w, g in zip(want, got):
            a, b = float(values[w]), float(values[g])
            steps["NaN" if np.isnan(b) else "0" if b == 0 else "where the reference's is 0" if a == 0
                  else f"x{b / a:.3g}"] += 1
    return ", ".join(f"{what} in {n}" for what, n in steps.most_common(4))


def describe(x: np.ndarray, want: np.ndarray, got: np.ndarray, family: str, block: int) -> str:
    """The words for blocks whose written scales (``got``, uint8 ``[..., blocks]``) differ from
    the reference's (``want``) while their elements follow them; ``x``: the blocks' source
    (float32 ``[..., D]``)."""
    wrong = want != got
    text = (f"the scale differs from the reference's in {int(wrong.sum())} of {wrong.size} blocks "
            f"({_offsets(want[wrong], got[wrong], family)}), and each block's elements are quantized "
            "right under the scale written for it: the amax or the exponent the scale comes from is wrong")
    shared, right = [], ~wrong
    for name, has in properties(x, block, x.shape[-1] % block != 0).items():
        if has[wrong].all() and (not right.any() or has[right].mean() < 0.5):
            shared.append(f"{name} (as {int(has[right].sum())} of the {int(right.sum())} blocks "
                          "with a right scale)")
    if shared:
        text += "; every block with a wrong scale: " + "; ".join(shared)
    return text
