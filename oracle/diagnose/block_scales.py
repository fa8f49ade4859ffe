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

from ..reference.block_scaled import require_format
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


# Where a multiplier 2^k stops being a normal power of two of a type a kernel computes it in:
# (the first power past the range, or for underflow the last one inside it; the words).
_OVERFLOW_HINTS = ((16, "float16's largest power of two is 2^15: a float16 multiplier (such as "
                        "__float2half(2^-E)) is inf past it"),
                   (127, "only blocks of scale byte 0 (E = -127): a divisor or multiplier rebuilt from the "
                         "byte's bits (byte << 23) is 0 or inf there, 2^-127 being subnormal in float32"))
_UNDERFLOW_HINTS = ((-14, "float16's smallest normal is 2^-14: a float16 multiplier is subnormal or 0 past it"),
                    (-126, "float32's smallest normal is 2^-126: a multiplier past it is subnormal or 0"))


def block_masks(x: np.ndarray, want: tuple, got: tuple, fmt: str, gs: np.ndarray) -> dict:
    """Per block (``[..., blocks]``) of one source: whether its codes or its scale differ from the
    reference's, log2 of the reference's element multiplier (2^-E for MX, the per-tensor scale
    over the block scale for NVFP4; NaN for a NaN scale) and whether the block is all zero.
    ``want``, ``got``: (scales, codes) of the same rows; ``x``: their source, float32."""
    family, _, block = require_format(fmt)
    (want_scales, want_codes), (got_scales, got_codes) = want, got
    per = block if family == "mx" else block // 2  # code bytes per block
    differs = want_codes != got_codes
    code_wrong = np.stack([differs[..., b * per:(b + 1) * per].any(axis=-1)
                           for b in range(want_scales.shape[-1])], axis=-1)
    with np.errstate(all="ignore"):
        if family == "mx":
            level = np.where(want_scales == E8M0_NAN, np.nan, 127.0 - want_scales.astype(np.float64))
        else:
            level = np.log2(np.float64(gs.reshape(-1)[0])) - np.log2(code_values("e4m3fn")[want_scales].astype(np.float64))
    blocks, real = padded_blocks(x, block)
    return {"code": code_wrong, "scale": want_scales != got_scales, "level": level,
            "zero": np.all((blocks == 0) | ~real, axis=-1)}


def _merged(parts: list) -> dict:
    return {k: np.concatenate([p[k].reshape(-1) for p in parts]) for k in parts[0]}


def partial_block_text(parts: list, dim: int, block: int) -> str | None:
    """The words where only each head's partial last block is wrong (its codes or its scale),
    every whole block right; else None. ``parts``: :func:`block_masks` of each source."""
    if dim % block == 0:
        return None
    wrong = [p["code"] | p["scale"] for p in parts]
    if not any(w[..., -1].any() for w in wrong) or any(w[..., :-1].any() for w in wrong):
        return None
    codes = sum(int(p["code"][..., -1].sum()) for p in parts)
    scales = sum(int(p["scale"][..., -1].sum()) for p in parts)
    heads = sum(p["code"][..., -1].size for p in parts)
    start = dim - dim % block
    return (f"only each head's partial last block (elements {start}-{dim - 1}, {dim % block} of a block of "
            f"{block}) is wrong, every whole block right: its codes in {codes} and its scale in {scales} of "
            f"{heads} heads, as a loop over whole blocks only that leaves the tail to another path or to none")


def multiplier_range_text(parts: list) -> str | None:
    """The words where, among the blocks whose scale is right, the elements are wrong in exactly
    those whose element multiplier lies past a power of two (every block on the near side right):
    a multiplier that leaves the range of the type it is computed in; else None. All-zero blocks
    are left out where they alone break the pattern (a kernel's zero-amax path spares them)."""
    m = _merged(parts)
    right_scale = ~m["scale"] & np.isfinite(m["level"])
    for spared in (np.zeros_like(m["zero"]), m["zero"]):
        # an all-zero block's codes are right under almost any multiplier: no witness of its range
        bad, good = right_scale & m["code"] & ~spared, right_scale & ~m["code"] & ~m["zero"]
        if bad.any() and good.any():
            text = _range_words(m, bad, good, spared.any())
            if text is not None:
                return text
    return None


def _range_words(m: dict, bad: np.ndarray, good: np.ndarray, spared: bool) -> str | None:
    lo_bad, hi_bad = m["level"][bad].min(), m["level"][bad].max()
    lo_good, hi_good = m["level"][good].min(), m["level"][good].max()
    if lo_bad > hi_good:
        side, edge, other, at = f"2^{lo_bad:g} or more", f"up to 2^{hi_good:g}", "overflows", lo_bad
        hints = [(k, w) for k, w in _OVERFLOW_HINTS if hi_good < k <= lo_bad]
    elif hi_bad < lo_good:
        side, edge, other, at = f"2^{hi_bad:g} or less", f"from 2^{lo_good:g}", "underflows", hi_bad
        hints = [(k, w) for k, w in _UNDERFLOW_HINTS if hi_bad < k <= lo_good]
    else:
        return None
    hint = min(hints, key=lambda kw: abs(kw[0] - at))[1] if hints else None
    zero = " (all of them all-zero blocks)" if m["zero"][bad].all() else ""
    return (f"the elements are wrong in exactly the {int(bad.sum())} {'nonzero ' if spared else ''}blocks whose "
            f"element multiplier is {side}{zero}, their scales right; the {int(good.sum())} blocks with a "
            f"multiplier {edge} are right{' (all-zero blocks right at any multiplier)' if spared else ''}: the "
            f"multiplier (or the division by the scale) {other} the type it is computed in"
            + (f" ({hint})" if hint else ""))
