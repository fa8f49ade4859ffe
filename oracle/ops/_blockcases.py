"""Block-scaled case inputs and bug hypotheses, shared by the block-scaled op specs.

Case parameters: ``block`` (the format, :data:`oracle.reference.block_scaled.FORMATS`),
``values`` and ``scale`` (NVFP4's per-tensor scale).

``values``:

- "random": ordinary activations (normal, sigma 2) in the case's dtype.
- "special": every block gets its own power of two ``2**k`` (k from -140 to 120, so float32
  subnormal blocks and blocks near float32's largest value are among them) and elements
  ``m * 2**k`` with ``m`` dyadic: every e2m1 magnitude and every tie between two of them, the
  e4m3fn and e5m2 maxima, the ties above them (464, 61440) and their neighbours, the powers of
  two that decide the shared exponent, with both signs; so element rounding ties, saturation and
  both exponent rules (floor and ceil differ where amax is not a power of two) are reached
  exactly wherever the block scale is a power of two.
- "zero_blocks": random rows in which some blocks are all +0, all -0, or float32 subnormals.
- "nonfinite": random rows with NaN, +inf or -inf in some blocks (one block all NaN, and where D
  leaves a partial last block, the second row's all NaN too).

``scale`` (NVFP4 only): "calibrated", vLLM's ``448 * 6 / amax`` over the tensor's finite
elements (never a power of two); "1.0"; "0.37". V's scale is 2.61 times K's, so swapping them shows.
"""

from __future__ import annotations

import numpy as np

from ..buffers import NUMPY_DTYPES
from ..contract import Contract
from ..diagnose.hypothesis import Hypothesis
from ..reference import block_scaled, mx, nvfp4
from . import _build

VALUE_SETS = ("random", "special", "zero_blocks", "nonfinite")
GLOBAL_SCALES = ("calibrated", "1.0", "0.37")
SECOND_SCALE = 2.61
_F32 = np.float32
_MANTISSAS = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 12,
                       440, 448, 456, 464, 472, 480, 896, 57344, 59392, 61440, 63488, 65536,
                       1.0078125, 1.9921875, 0.99609375], dtype=np.float64)


def with_defaults(p: dict, case_params: dict) -> dict:
    """The format and value set of a case: MXFP8 e4m3fn, random values, NVFP4 calibrated; the
    special sets in float32 unless the case names a dtype."""
    p.setdefault("block", "mxfp8_e4m3fn")
    p.setdefault("values", "random")
    if p["block"] == "nvfp4":
        p.setdefault("scale", "calibrated")
    if p["values"] in ("special", "zero_blocks", "nonfinite") and "dtype" not in case_params:
        p["dtype"] = "float32"
    return p


def values(rng: np.random.Generator, kind: str, fmt: str, shape: tuple, dtype: str) -> np.ndarray:
    """Source values ``shape`` (``[..., D]``) of value set ``kind`` for block format ``fmt``."""
    if kind not in VALUE_SETS:
        raise ValueError(f"values={kind!r} is not one of {VALUE_SETS}")
    if kind == "random":
        return _build.values(rng, shape, dtype)
    block = block_scaled.require_format(fmt)[2]
    width, rows = shape[-1], int(np.prod(shape[:-1]))
    count = -(-width // block)
    x = _build.values(rng, (rows, count, block), "float32").astype(np.float64)
    choice = (np.arange(rows * count).reshape(rows, count) % 8)[..., None]  # each block's role
    if kind == "special":  # block exponents across the source dtype's whole range, its subnormals included
        low, high = (-26, 14) if dtype == "float16" else (-140, 120)
        k = np.where(choice > 0, rng.integers(low, high + 1, (rows, count, 1)), rng.integers(-8, 9, (rows, count, 1)))
        m = rng.choice(_MANTISSAS, x.shape) * rng.choice([-1.0, 1.0], x.shape)
        top = float(np.finfo(np.float16).max) if dtype == "float16" else 3.4e38
        x = np.clip(m * np.exp2(k.astype(np.float64)), -top, top)
        if dtype == "float32":  # every 8th block's amax the float just below 2**k: a log2 taken
            # in float32 rounds to k there (k >= 3, k <= -2) and floors one binade too high
            edge = np.exp2(rng.integers(3, 100, (rows, count, 1)) * rng.choice([-1.0, 1.0], (rows, count, 1)))
            smaller = rng.choice([0.0, 0.25, 0.5, 0.75], x.shape) * edge * rng.choice([-1.0, 1.0], x.shape)
            at = np.arange(block) == rng.integers(0, block, (rows, count, 1))
            below = np.where(at, (1 - 2.0 ** -24) * edge * rng.choice([-1.0, 1.0], (rows, count, 1)), smaller)
            x = np.where(choice == 7, below, x)
    elif kind == "zero_blocks":
        tiny = 1e-40 * rng.integers(1, 9, x.shape)
        x = np.where(choice == 0, 0.0, np.where(choice == 3, -0.0, np.where(choice == 5, tiny, x)))
    else:  # nonfinite: one element of some blocks (inside the row, also in a partial last block)
        size = np.minimum(block, width - np.arange(count) * block)[None, :, None]
        at = (rng.integers(0, 1 << 30, (rows, count, 1)) % size) == np.arange(block)
        nan = np.where(np.arange(rows)[:, None, None] % 2, -np.nan, np.nan)  # NaNs of both signs
        special = np.select([choice == 1, choice == 4, choice == 6], [nan, np.inf, -np.inf], 0.0)
        x = np.where(at & np.isin(choice, (1, 4, 6)), special, x)
        if rows:
            x[0, 0, :] = np.nan
        if rows > 1 and width % block:  # a partial last block all NaN (its lanes past D, if loaded as 0, hide it)
            x[1, count - 1, :] = np.nan
    with np.errstate(over="ignore"):
        out = x.reshape(rows, count * block)[:, :width].reshape(shape).astype(_F32)
    if kind == "zero_blocks" and len(shape) > 1 and shape[0] > 2:  # token 2's whole row signed zeros,
        out[2] = np.where(np.arange(width) % 2, _F32(-0.0), _F32(0.0))  # which a writer may take for padding
    with np.errstate(all="ignore"):  # a narrower dtype rounds (and overflows) the sources
        return out.astype(NUMPY_DTYPES[dtype])


def spread_magnitudes(rows: np.ndarray) -> np.ndarray:
    """``rows`` (``[N, ...]``) with row i scaled by ``2**(3 * (i % 5) - 6)`` (exact): rows that
    collide in one slot then carry different block scales, so a writer that takes a slot's codes
    from one colliding row and its scales from another leaves a torn row."""
    factors = np.exp2(3.0 * (np.arange(rows.shape[0]) % 5) - 6).reshape((-1,) + (1,) * (rows.ndim - 1))
    with np.errstate(over="ignore"):
        return (rows.astype(np.float32) * factors.astype(np.float32)).astype(rows.dtype)


def global_scale(choice: str, source: np.ndarray, tensor: int = 0) -> np.ndarray:
    """NVFP4's per-tensor scale of case parameter ``choice`` for ``source``: float32, shape (1,)."""
    if choice not in GLOBAL_SCALES:
        raise ValueError(f"scale={choice!r} is not one of {GLOBAL_SCALES}")
    factor = SECOND_SCALE if tensor else 1.0
    if choice == "1.0":
        return np.ones(1, _F32)
    if choice == "0.37":
        return np.array([0.37 * factor], _F32)
    finite = np.abs(source.astype(np.float64))[np.isfinite(source.astype(np.float64))]
    amax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    value = np.float32(448 * 6 / amax * factor)
    return np.array([value if np.isfinite(value) and value > 0 else 1.0], _F32)


BLOCK_KNOBS = ({f for f in mx.MxKnobs.__dataclass_fields__}
               | {f for f in nvfp4.Nvfp4Knobs.__dataclass_fields__})


def resolve(contract: Contract, fmt: str, override: dict) -> tuple[dict, dict]:
    """Split an ``expected(**override)`` into (the reference's preset and knobs, the other
    overrides): the contract's ``block_preset`` and ``block_knobs``, a "preset" override
    replacing both and knob overrides replacing single knobs."""
    rest = dict(override)
    preset = rest.pop("preset", None)
    knobs = {k: rest.pop(k) for k in list(rest) if k in BLOCK_KNOBS}
    if preset is not None:
        return {"preset": preset, **knobs}, rest
    return {"preset": contract.block_preset, **dict(contract.block_knobs), **knobs}, rest


# (cause, knob, values, text) of each legitimate block-scaling knob: the diagnosis tries every value
# a writer does not declare
MX_ALTERNATIVES = (
    ("block_scaling_rule", "exponent", mx.EXPONENT_RULES, "the shared exponent follows the {!r} rule"),
    ("block_nonfinite", "zero_block", mx.ZERO_BLOCKS, "an all-zero block gets the {!r} scale"),
    ("block_nonfinite", "nonfinite", mx.NONFINITE_BLOCKS, "a block holding NaN or inf is scaled by {!r}"),
    ("block_nonfinite", "min_scale_factor", mx.MIN_SCALE_FACTORS,
     "a nonzero block with scale byte 0 is multiplied by the {!r} factor"),
)
NVFP4_ALTERNATIVES = (
    ("block_scaling_rule", "global_scale_at", nvfp4.GLOBAL_SCALE_AT, "the per-tensor scale is applied at {!r}"),
    ("block_nonfinite", "nan_element", nvfp4.NAN_ELEMENTS, "NaN elements are written as {!r} (max: code 7, "
     "+6; zero: code 0; signed_max: 7 with the NaN's sign bit, a negative NaN as 15, -6)"),
    ("block_nonfinite", "nonfinite", nvfp4.NONFINITE_BLOCKS, "a block holding NaN is scaled by {!r}"),
    ("element_rounding", "element_rounding", nvfp4.ELEMENT_ROUNDINGS, "the e2m1 codes are rounded {}"),
    ("block_nonfinite", "zero_guard", nvfp4.ZERO_GUARDS, "the element multiplier is 0 where the {} scale is"),
)


def alternatives(fmt: str, contract: Contract, dtype: str = "float32") -> list[Hypothesis]:
    """What a block-scaled writer may compute instead, for sources of ``dtype``: the other
    legitimate knob values, and the faults the diagnosis names (the shared exponent off by one,
    an element scale taken before its e4m3fn rounding, the per-tensor scale applied twice, never
    or inverted, the element product rounded to a 16-bit source's type, swapped nibbles)."""
    declared = contract.block_knob_values(fmt)
    family = block_scaled.require_format(fmt)[0]
    out = []

    def other(cause: str, knob: str, value, text: str):
        if getattr(declared, knob) != value:
            out.append(Hypothesis(cause, text, override={knob: value}))

    if family == "mx":
        for offset in (-1, 1):
            other("shared_exponent_off_by_one", "exponent_offset", offset,
                  f"the shared exponent is {offset:+d} off (E {'+' if offset > 0 else '-'} 1 for every block)")
        element = block_scaled.require_format(fmt)[1]
        other_element, offset = ("e5m2", -7) if element == "e4m3fn" else ("e4m3fn", 7)
        other("block_scaling_rule", "exponent_offset", offset,
              f"the shared exponent computed with {other_element}'s emax ({15 if other_element == 'e5m2' else 8}) "
              f"for {element}'s ({8 if element == 'e4m3fn' else 15}): E {offset:+d} in every block")
        twin = next(f for f in block_scaled.FORMATS if f != fmt and block_scaled.require_format(f)[0] == "mx")
        out.append(Hypothesis("wrong_fp8_format", f"{twin} codes written where {fmt} is asked (its elements "
                              "and shared exponents: the same widths, another element format)",
                              override={"block_format": twin}))
        other("block_scaling_rule", "exponent_clamp", "before_emax",
              "the shared exponent's clamp to [-127, 127] applied to log2(amax) before emax is subtracted: "
              "a block below 2^(emax - 127) gets E under -127, a wrapped scale byte and an infinite multiplier")
        other("block_amax_read_ahead", "tail_amax", "read_ahead",
              f"the partial last block of each head takes its scale from a whole {mx.BLOCK}-element load from its "
              "start: its amax includes the elements past the head's end (the next head's, or the next token's), "
              "masked only at the end of the tensor")
    else:
        other("block_scale_unrounded", "element_scale", "unrounded",
              "the elements are scaled by the block scale before its e4m3fn rounding, not by the stored scale")
        for uses, how in ((0, "never applied (or read as 1.0, e.g. a value kept from an earlier call "
                               "whose scale was 1.0)"), (2, "applied twice"),
                          (-1, "inverted: its reciprocal applied (the decode scale's convention, "
                               "amax / (448 * 6), taken for the encode scale's)")):
            other("global_scale_misapplied", "global_scale_uses", uses, f"the per-tensor scale is {how}")
        if dtype in ("float16", "bfloat16"):
            other("global_scale_misapplied", "global_scale_dtype", "source_dtype",
                  f"the per-tensor scale rounded to {dtype} before use (converted to the source's type, as a "
                  "kernel templated on it does)")
            other("element_rounding", "element_product", "source_dtype",
                  f"the element product x * (1 / scale) computed in {dtype} (the multiplier and the "
                  "product each rounded to it, as __hmul2), then converted to e2m1: double rounding")
        for conversion, how in (("toward_zero", "truncated"), ("nonsaturating", "not saturated (past 448: the NaN byte)"),
                                ("flush_subnormals", "flushed to 0 where it rounds to a subnormal (the block written as 0)")):
            other("block_scaling_rule", "scale_conversion", conversion, f"the e4m3fn block scale is {how}")
        other("negative_zero_mishandled", "negative_zero", "positive",
              "the e2m1 sign applied only to a nonzero magnitude: -0 and negative values that round to 0 "
              "written as +0 (code 0, not 8)")
        other("nibbles_swapped", "nibble_order", "high_first" if declared.nibble_order == "low_first" else "low_first",
              "the two codes of each byte are in swapped nibbles")
        if declared.element_rounding == "nearest_even":
            for flip, tie in zip(nvfp4.TIE_FLIPS, nvfp4.MIDPOINTS):
                other("element_rounding", "element_rounding", flip,
                      f"the e2m1 tie at {tie:g} rounded away from even, every other tie to even (one threshold "
                      "compared with > where >= belongs, or the reverse)")
    for cause, knob, values, text in MX_ALTERNATIVES if family == "mx" else NVFP4_ALTERNATIVES:
        for value in values:
            other(cause, knob, value, text.format(value if "!r" in text else value.replace("_", " ")))
    if family == "mx":
        other("fp8_conversion", "saturate", not declared.saturate,
              f"the elements {'saturate' if not declared.saturate else 'do not saturate'}")
    return out


def global_scale_hypotheses(names: tuple) -> list[Hypothesis]:
    """Each per-tensor scale read in place of the other (V quantized with K's)."""
    if len(names) != 2:
        return []
    a, b = names
    return [Hypothesis("scale_swapped", f"{dst} read from {src}",
                       views={dst: ((1,), (1,), 0, src)}) for src, dst in ((a, b), (b, a))]


def padding_into_slot_zero(index: str) -> Hypothesis:
    """sglang's MXFP8 writers' bug: the rows of padding entries quantized into slot 0."""
    return Hypothesis("padding_into_slot_zero", "the padding rows (negative slots) are quantized and "
                      "written into slot 0",
                      inputs={index: lambda a: np.where(a < 0, 0, a).astype(a.dtype)},
                      override={"padding": "none", "duplicates": "any"})
