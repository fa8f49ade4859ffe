"""Scale values a validating writer must reject: the bad inputs ``scale_nan``, ``scale_inf``,
``scale_zero`` and ``scale_negative`` of every op that takes an fp8 or NVFP4 scale.

The contract is "finite and > 0" (:func:`oracle.reference.fp8.quantize`). The four values are the
four ways a partial check lets one through: NaN passes ``scale <= 0`` (every comparison with NaN is
false), +inf passes ``isnan`` and ``scale > 0``, 0 and -1 pass ``isfinite``. Each lands where a
check that reads too little misses it: NaN and 0 in the first scale argument, +inf and -1 in the
last one (a check of K's scale alone, or of the one scale it quantizes with first), and always in
the last head of a per-head scale (a check of head 0 alone).
"""

from __future__ import annotations

import numpy as np

BAD_SCALES = {"scale_nan": np.nan, "scale_inf": np.inf, "scale_zero": 0.0, "scale_negative": -1.0}
FIRST_ARGUMENT = ("scale_nan", "scale_zero")  # the rest go into the last scale argument
# what lets each value through, for the verdict on a kernel that accepts it
LETS_THROUGH = {"scale_nan": "a test of `scale <= 0` alone (false for NaN) lets it through",
                "scale_inf": "a test of `isnan` or `scale > 0` alone lets it through",
                "scale_zero": "a test of `isfinite` or `scale >= 0` alone lets it through",
                "scale_negative": "a test of `isfinite` or `scale != 0` alone lets it through"}


def spoil(bad: str, scales: list) -> list:
    """``scales`` (one float32 array per scale argument, in signature order) with the last element
    of one of them set to the bad input ``bad``'s value (a key of :data:`BAD_SCALES`)."""
    out = [np.array(s, np.float32, copy=True) for s in scales]
    target = out[0] if bad in FIRST_ARGUMENT else out[-1]
    target.reshape(-1)[-1] = np.float32(BAD_SCALES[bad])
    return out


def describe(bad: str, arguments: tuple, per_head: bool) -> str:
    """Where :func:`spoil` put the bad input ``bad`` among the scale ``arguments`` (signature
    order), and which partial check lets it through."""
    name = arguments[0] if bad in FIRST_ARGUMENT else arguments[-1]
    where = f"the last head of {name}" if per_head else name
    return f"{BAD_SCALES[bad]} in {where}; {LETS_THROUGH[bad]}"
