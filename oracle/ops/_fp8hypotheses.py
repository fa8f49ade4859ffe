"""The fp8 hypotheses of the writers that quantize: other behaviours a failing kernel may
implement instead of its contract's, as :class:`~oracle.diagnose.Hypothesis` objects whose
overrides :func:`oracle.ops._fp8cases.resolve` understands (a scale mode of
:func:`~oracle.ops._fp8cases.apply_scale`, a preset, single knobs, another ``format``) or whose
inputs re-read the scales (collapsed, swapped, indexed another way)."""

from __future__ import annotations

import functools

import numpy as np

from ..contract import Contract
from ..diagnose.hypothesis import Hypothesis
from ..diagnose.row_bounds import vector_tails
from ..reference import fp8 as _fp8
from ..reference.presets import PRESETS
from ._fp8cases import (MIXED_SCALES, PER_HEAD_SCALES, POWER_OF_TWO_SCALE, UNIT_FIRST_HEAD, power_of_two_exponent,
                        scale_values)


def alternatives(p: dict, contract: Contract, row_width: int | None = None) -> list[Hypothesis]:
    """The fp8 behaviours a failing kernel may implement instead of its contract's, as
    :class:`~oracle.diagnose.Hypothesis` objects whose overrides :func:`resolve` understands (a
    scale mode, a preset, single knobs, another ``format``). Empty when the case does not quantize.
    ``row_width``: the elements of a source row's last axis, where a vector loop's unscaled tail
    is worth replaying (None: not for this op).

    Approximate division is not among them: its result mixes exact and neighbouring codes element
    by element, which no single expectation reproduces (the runner's ``_within_approx_division``
    judges it against the -2 and +2 ulps bounds instead).
    """
    fmt = p.get("fp8")
    scaled = p.get("scale", "1.0") != "1.0"
    if not fmt:  # an unquantized write, which must ignore its scales (doubled on a repeat's second call)
        scaled = scaled or p.get("repeat") == "inplace"
        return [Hypothesis("scale_applied_unquantized", f"an unquantized write {how} the scale, which it "
                           "must ignore (the fp8 path's scaling applied whatever the kv_cache_dtype)",
                           {"scale": mode}) for mode, how in (("divided", "divided by"),
                                                             ("inverted", "multiplied by"))] if scaled else []
    out = []
    if scaled:
        # under head 0's scale of 1, no scale is the per-head scale collapsed to head 0 (named so, below)
        if p.get("scale") != UNIT_FIRST_HEAD:
            out.append(Hypothesis("scale_missing", "no scale (scale 1)", {"scale": "one"}))
        out.append(Hypothesis("scale_inverted", "an inverted scale (x * scale instead of x / scale)",
                              {"scale": "inverted"}))
        out += _tail_hypotheses(row_width or 0)
        if p.get("scale") == "head" and row_width and p["shape"][0] > 1:
            out += [Hypothesis("scale_misindexed", f"the per-head scale read once per {vector}-element vector "
                               "along each token's [H * D] elements (a vector that crosses into the next head "
                               "keeps the previous head's scale)", {"scale": f"vector_head={vector}"})
                    for vector, _ in vector_tails(row_width)]
        if p.get("dtype") in ("float16", "bfloat16"):
            out += [Hypothesis("fp8_conversion", f"the quotient computed in {p['dtype']} ({how}), then "
                               "converted to fp8: the scale and the quotient each rounded to "
                               f"{p['dtype']} first", {"scale": mode})
                    for mode, how in (("source_dtype_div", "x / scale in half-precision arithmetic"),
                                      ("source_dtype_mul", "x * (1 / scale) in half-precision arithmetic"))]
            out.append(Hypothesis("fp8_conversion", f"the scale rounded to {p['dtype']} (scale.to(x.dtype)), "
                                  "then x / scale in float32", {"scale": "scale_source_dtype"}))
    try:
        declared = contract.knobs(fmt)
    except (TypeError, ValueError):  # the contract's preset does not cover this format
        declared = None
    if declared is not None:
        # a power-of-two scale's reciprocal is exact: the scale ops agree there, nothing to tell apart
        out += _knob_hypotheses(declared, _fp8.get_format(fmt), scaled and p.get("scale") != POWER_OF_TWO_SCALE,
                                None if scaled else p.get("dtype"))
    for name, preset in PRESETS.items():
        if name == contract.fp8_preset or fmt not in preset.formats:
            continue
        # a preset that converts this format as the contract does explains nothing
        if declared is None or _fp8.resolve_knobs(_fp8.get_format(fmt), name, {}) != declared:
            out.append(Hypothesis("fp8_conversion", f"preset {name!r} ({_short(preset.models)})",
                                  {"preset": name}))
    out += _quotient_hypotheses(fmt, p.get("scale", "1.0"))
    covered = PRESETS[contract.fp8_preset].formats if contract.fp8_preset in PRESETS else ()
    asked = f"kv_cache_dtype {p['spelling']!r} asks for {fmt}" if p.get("spelling") else f"{fmt} is asked"
    out += [Hypothesis("wrong_fp8_format", f"{other} codes written where {asked}",
                       {"format": other})
            for other in _fp8.FORMATS if other != fmt and other in covered]
    return out


def _tail_hypotheses(width: int) -> list[Hypothesis]:
    """A vector loop of V elements along each row of ``width`` elements whose scalar tail (the last
    ``width % V``) forgot the scale, for each V that leaves a tail of its own."""
    return [Hypothesis("part_unscaled", f"the last {width - whole} elements of each row of {width} (past its "
                       f"last whole {vector}-element vector) stored without the scale",
                       {"scale": f"tail_unscaled={vector}"})
            for vector, whole in vector_tails(width)]


def _power_of_two(choice: str) -> int:
    """k where a case's scale is the number 2**k (0 for any other scale)."""
    try:
        return power_of_two_exponent(np.array([float(choice)]))
    except ValueError:
        return 0


def _above_one(choice: str) -> bool:
    """Whether a case's scale is a number above 1 (where a source clamped to the fp8 range before
    the division differs from a saturated quotient)."""
    try:
        return float(choice) > 1
    except ValueError:
        return False


def _quotient_hypotheses(fmt: str, scale: str) -> list[Hypothesis]:
    """NaN quotients written as a number (a clamp through ``fmaxf``/``fminf``, which return the
    operand that is not NaN, or ``nan_to_num``), an e5m2 quotient clamped at e4m3fn's 448 and an
    e4m3fn one at e4m3fnuz's 240, a hand-written conversion's subnormal boundary one binade off,
    under a scale above 1 the source clamped before the division, and under a power-of-two scale
    the division done on the exponent field."""
    values = _fp8.code_values(fmt)
    top = float(values[np.isfinite(values)].max())
    smallest_normal = float(np.exp2(_fp8.get_format(fmt).binary.min_exponent))
    out = [Hypothesis("nan_mishandled", f"NaN written as {text} ({how})", {"scale": mode})
           for mode, text, how in ((f"clamp={top!r};nan={-top!r}", f"-max ({-top:g})",
                                    "the quotient clamped as fminf(fmaxf(q, -max), max), which drops NaN"),
                                   (f"clamp={top!r};nan={top!r}", f"+max ({top:g})",
                                    "the quotient clamped as fmaxf(fminf(q, max), -max), which drops NaN"),
                                   ("nan=0.0", "0", "nan_to_num"),
                                   (f"nan_signed={top!r}", "max with the NaN's own sign",
                                    "NaN taken for a huge finite value: a saturation that tests the exponent field "
                                    "alone, or a power-of-two scale applied by subtracting from the exponent field"))]
    for side, bound in (("upper", "q > max ? max : q"), ("lower", "q < -max ? -max : q")):
        out.append(Hypothesis("fp8_conversion", f"the saturation written as a one-sided clamp ({bound}, {top:g}) "
                              "before a conversion that does not saturate: the other side's overflow and inf "
                              "written as NaN or inf", {"scale": f"clamp_{side}={top!r}", "saturate": False, "inf": None}))
    out += [Hypothesis("subnormals_mishandled", f"quotients below the smallest normal ({smallest_normal:g}) {how}",
                       {"scale": f"{step}={smallest_normal!r}"})
            for step, how in (("halved_subnormal_quantum", "written as the code of twice their value: a "
                               "subnormal branch that takes the minimum exponent as -bias, not 1 - bias"),
                              ("top_subnormals_unhidden", "in the top binade encoded as normals of exponent "
                               "field 0 (their implicit bit dropped): a normal/subnormal threshold one binade "
                               "low"),
                              ("minimum_exponent_off", "in the top binade encoded as normals of exponent field "
                               "0, and those below it as the code of twice their value: a conversion whose "
                               "minimum exponent is -bias, not 1 - bias, in its threshold and its subnormal "
                               "branch alike"))]
    if fmt == "e4m3fn":
        out.append(Hypothesis("fp8_conversion", "quotients clamped to [-240, 240], e4m3fnuz's range (a max shared "
                              "by both e4m3 flavours), before the e4m3fn conversion", {"scale": "clamp=240.0"}))
    power = _power_of_two(scale)
    if power:
        out += [Hypothesis("fp8_conversion", f"the division by 2**{power} done by subtracting {power} from the "
                           f"float32 exponent field, {how}; a scale that is no power of two divided",
                           {"scale": mode})
                for mode, how in (("exponent_field", "unguarded (zeros, subnormals, inf and NaN wrap)"),
                                  ("exponent_field_guarded", "zeros, inf and NaN passed through (subnormals "
                                   "and the smallest normals wrap)"))]
    if _above_one(scale):
        out.append(Hypothesis("fp8_conversion", f"the source clamped to [-max, max] ({top:g}) before its division by "
                              "the scale, not the quotient (a saturation applied to x: wrong wherever the scale is "
                              "not 1)", {"scale": f"clamp_source={top!r}"}))
    if top > 448:
        out.append(Hypothesis("fp8_conversion", "quotients clamped to [-448, 448], e4m3fn's range, "
                              f"before the {fmt} conversion", {"scale": "clamp=448.0"}))
    return out


def _knob_hypotheses(declared: _fp8.Fp8Knobs, form: _fp8.Fp8Format, scaled: bool,
                     exact_in: str | None = None) -> list[Hypothesis]:
    """One knob changed from the contract's ``declared`` (validated) knobs at a time; no rounding
    through ``exact_in``, the 16-bit type an unscaled source's quotient already is."""
    out = []
    if scaled:
        other = "mul_reciprocal" if declared.scale_op == "div" else "div"
        out.append(Hypothesis("fp8_conversion", f"scale_op={other!r}", {"scale_op": other}))
    for inter in (None, "float16", "bfloat16", "float16_rz", "bfloat16_rz"):
        if inter != declared.intermediate and (inter is None or exact_in is None or not inter.startswith(exact_in)):
            what = ("single rounding" if inter is None else f"double rounding through {inter}" if "_rz" not in inter
                    else f"the quotient first truncated to {inter[:-3]} (rounded toward zero: cvt.rz, or the float32 "
                    "bits' top half), then rounded to fp8")
            out.append(Hypothesis("fp8_conversion", f"intermediate={inter!r} ({what})",
                                  {"intermediate": inter}))
    out.append(Hypothesis("fp8_conversion", f"saturate={not declared.saturate}",
                          {"saturate": not declared.saturate, "inf": None}))
    if declared.rounding != "toward_zero":
        out.append(Hypothesis("round_toward_zero", "fp8 codes rounded toward zero (the mantissa "
                              "truncated) instead of to nearest even", {"rounding": "toward_zero"}))
    if declared.rounding != "ties_away":
        out.append(Hypothesis("ties_away", "fp8 ties rounded away from zero (round half up on the "
                              "magnitude) instead of to even", {"rounding": "ties_away"}))
    if declared.rounding != "ties_toward_zero":
        out.append(Hypothesis("ties_toward_zero", "fp8 ties rounded toward zero (round half down on the "
                              "magnitude, an integer rounding (v + half - 1) >> shift) instead of to even",
                              {"rounding": "ties_toward_zero"}))
    if declared.rounding != "ties_upward":
        out.append(Hypothesis("ties_upward", "fp8 ties rounded toward +inf (floor(q + 0.5) on the signed "
                              "quotient: positive ties away from zero, negative ones toward it) instead of to even",
                              {"rounding": "ties_upward"}))
    if declared.negative_zero == "keep" and not form.fnuz:
        out.append(Hypothesis("negative_zero_mishandled", "a -0 input written as +0 (a zero test before the "
                              "conversion, x == 0 giving code 0), while negatives that round to 0 keep their sign",
                              {"scale": "zero_input_positive"}))
    if declared.subnormals != "flush":
        out.append(Hypothesis("subnormals_flushed", "fp8 subnormal results flushed to zero of "
                              "their sign", {"subnormals": "flush"}))
    if declared.subnormals != "truncate" and declared.rounding != "toward_zero":
        out.append(Hypothesis("subnormals_truncated", "values below the smallest normal rounded toward "
                              "zero (the mantissa shifted into the subnormal field without rounding), "
                              "normal ones to nearest", {"subnormals": "truncate"}))
    if form.name == "e5m2":  # e5m2 is float16's top byte: the classic shortcut through float16 bits
        out += [Hypothesis("fp8_conversion", f"the e5m2 code taken as the top byte of the float16 value {how} "
                           "(float16 rounding first; past 65504 float16's inf; NaN float16's quiet 0x7E)",
                           {"intermediate": "float16", "saturate": False, "inf": None, "nan": "0x7E|sign", **extra})
                for how, extra in (("(bits >> 8: truncated)", {"rounding": "toward_zero"}),
                                   ("rounded to nearest even on its low byte", {}))]
    if declared.carry == "kept" and declared.rounding != "toward_zero":
        out.append(Hypothesis("fp8_conversion", "the rounding's carry out of the mantissa lost (the mantissa "
                              "rounded apart from the exponent: a value that rounds up to 2^(e+1) written as 2^e)",
                              {"carry": "dropped"}))
    if form.fnuz and declared.fnuz_datapath == "own":
        twin = _fp8.OCP_TWIN[form.name]
        top, values = _fp8.FORMATS[twin].max_code, _fp8.code_values(form.name)
        out.append(Hypothesis("fp8_conversion", f"{form.name} codes built from {twin}'s codes of 2q (the OCP "
                              f"datapath, bias one higher, specials patched): the range ends at {twin}'s largest "
                              f"code, 0x{top:02X} ({values[top]:g}), not 0x{form.max_code:02X} "
                              f"({values[form.max_code]:g})", {"fnuz_datapath": "ocp"}))
    if not declared.saturate and declared.overflow_test == "rounded":
        out.append(Hypothesis("fp8_conversion", "overflow tested on the unrounded quotient (|q| > max before "
                              "rounding): quotients just past max, which round to it, written as overflow",
                              {"overflow_test": "unrounded"}))
    if declared.negative_zero != "positive" and not form.fnuz:  # fnuz has no -0 to lose
        out.append(Hypothesis("negative_zero_mishandled", "-0 written as +0 (0x00 instead of 0x80)",
                              {"negative_zero": "positive"}))
    if declared.negative_zero != "signed" and form.fnuz:
        out.append(Hypothesis("negative_zero_mishandled", f"a negative zero result written as 0x80, "
                              f"which is {form.name}'s NaN (the sign bit kept on a zero)",
                              {"negative_zero": "signed"}))
    out += [Hypothesis("nan_mishandled", text, {"nan": spelling})
            for spelling, text in _other_nans(declared.nan, form)]
    if declared.nan.endswith("|sign") and declared.negative_zero == "keep":
        out.append(Hypothesis("fp8_conversion", "the sign set from x < 0 (a sign-magnitude conversion): -0 "
                              "and negative NaN written without their sign", {"scale": "sign_from_lt0"}))
    return out


def _other_nans(declared: str, form: _fp8.Fp8Format) -> list[tuple[str, str]]:
    """(``nan`` knob value, text) for each NaN byte of ``form`` other than ``declared``: every NaN
    magnitude with the input's sign, without it, and always negative; the sign dropped first.
    Where the preset leaves ``overflow_nan`` unset, the NaNs overflow and inf make follow."""
    if form.fnuz:
        return []  # a single NaN, 0x80
    declared_byte = _fp8.NaNEncoding.parse(declared, form).byte
    magnitudes = [int(m) for m in np.flatnonzero(np.isnan(_fp8.code_values(form.name)[:0x80]))]
    out = []
    if declared.endswith("|sign"):
        out.append((declared[: -len("|sign")], f"NaN written as 0x{declared_byte:02X} with its sign "
                                               "dropped"))
    for m in magnitudes:
        for spelling, how in ((f"0x{m:02X}|sign", "with the input's sign"),
                              (f"0x{m:02X}", "without sign"), (f"0x{m | 0x80:02X}", "always negative")):
            if spelling != declared and spelling not in (o[0] for o in out):
                out.append((spelling, f"NaN written as {spelling.split('|')[0]} {how}"))
    return out


def scale_hypotheses(p: dict, names: tuple, heads: int) -> list[Hypothesis]:
    """Hypotheses about which fp8 scale the kernel read, for a spec whose scale inputs are
    ``names`` (one per quantized tensor, in the order of :func:`scale_values`' ``tensor``) and
    whose sources have ``heads`` heads.

    - "head" scales (more than one head): all collapsed to their first head's ("scale_collapsed").
    - Two tensors with different scales: each one's scale used for the other, one hypothesis per
      direction ("scale_swapped"). The replacement is the other tensor's scale as
      :func:`scale_values` builds it for this case; a scale input of another shape than that is a
      ValueError (not this case's scale: no hypothesis to replay).
    """
    choice = p.get("scale", "1.0")
    if not p.get("fp8") or choice == "1.0":
        return []
    out = []
    if choice in MIXED_SCALES and heads > 1:
        per_head = names[1] if choice == "k_tensor_v_head" else names[0]
        out.append(Hypothesis("scale_collapsed", f"{per_head}, a per-head scale, read as a per-tensor one (its "
                              "head 0's value for every head): both scales' kind taken from the other's shape",
                              inputs={per_head: _first_head}))
    if choice in ("head", UNIT_FIRST_HEAD) and heads > 1:
        unit = (", 1.0 here, so no head is scaled (a unit-scale fast path decided on scale[0] alone)"
                if choice == UNIT_FIRST_HEAD else "")
        out.append(Hypothesis("scale_collapsed", f"the per-head scale collapsed to head 0's{unit} ("
                              + ", ".join(names) + ")", inputs={name: _first_head for name in names}))
    if choice in PER_HEAD_SCALES and heads > 1:
        out.append(Hypothesis("scale_misindexed", "the per-head scale broadcast over each [H * D] row as "
                              "scale[j % H] (torch's repeat where repeat_interleave was meant)",
                              {"scale": "repeated"}))
        per_head = [name for name in names if choice in ("head", UNIT_FIRST_HEAD)
                    or name == names[choice == "k_tensor_v_head"]]
        if p.get("n", 0) > 1:
            out.append(Hypothesis("scale_misindexed", "the per-head scale repeated over head-major rows, token n of "
                                  "head h scaled by scale[(h * N + n) % H] (an HND write that flattens [H, N] rows, "
                                  "its row scales built token-major: repeat where repeat_interleave was meant)",
                                  {"scale": "head_major"}))
        if 1 < p.get("n", 0) <= heads:  # scale[n] exists for every token only where N <= H
            out.append(Hypothesis("scale_misindexed", "the per-head scale applied along the token axis, token n "
                                  "scaled by scale[n] (broadcast as [N, 1, 1], or its kind told from its length "
                                  "checked against N before H)", {"scale": "token_axis"}))
        for tile in (t for t in SCALE_TILES if t < heads):  # a tile's (or a table's) own head offsets
            out.append(Hypothesis("scale_misindexed", f"the per-head scale read as scale[h % {tile}] (offsets local "
                                  f"to a tile, or a table, of {tile} heads)",
                                  inputs={name: functools.partial(_wrapped, tile) for name in per_head}))
        groups = {}  # heads in groups, the rest in a scalar tail: by the rest's size
        for tile in (t for t in SCALE_TILES if t < heads and heads % t):
            groups.setdefault(heads % tile, []).append(tile)
        for rest, tiles in groups.items():
            out.append(Hypothesis("scale_misindexed", f"the last {rest} head(s) (past the last whole group of "
                                  f"{' or '.join(map(str, tiles))}) scaled by head 0's scale: a tail loop taken from "
                                  "the per-tensor path", inputs={name: functools.partial(_tail_heads_first, tiles[0])
                                                                 for name in per_head}))
    if len(names) == 2:
        out += [Hypothesis("scale_missing", f"{name} not applied (stored as x, not x / {name}); "
                           f"{other} applied", inputs={name: _ones})
                for name, other in zip(names, names[::-1])]
        values = [scale_values(choice, heads, t) for t in (0, 1)]
        for t, (name, used) in enumerate(zip(names, names[::-1])):
            out.append(Hypothesis("scale_swapped", f"{used} used for {name}",
                                  inputs={name: functools.partial(_replaced, values[1 - t],
                                                                  any_shape=choice in MIXED_SCALES)}))
    return out


def _ones(scale: np.ndarray) -> np.ndarray:
    return np.ones_like(scale)


def zero_head_hypotheses(p: dict, sources: tuple) -> list[Hypothesis]:
    """A head whose amax is 0 written as code 0 without converting it (a zero-amax fast path):
    its -0 elements come out +0. The ``special`` sources hold such a head (:func:`values`)."""
    if not p.get("fp8") or p.get("values") != "special" or p["fp8"].endswith("fnuz"):  # fnuz: no -0 code
        return []
    return [Hypothesis("negative_zero_mishandled", "a head whose elements are all ±0 written as +0 codes (a "
                       "fast path for an amax of 0 that skips the conversion and its sign)",
                       inputs={name: _zero_heads_positive for name in sources})]


def _zero_heads_positive(x: np.ndarray) -> np.ndarray:
    zero = (x == 0).all(axis=-1, keepdims=True)
    return np.where(zero, np.zeros_like(x), x)


SCALE_TILES = (2, 4, 8, 16)  # heads per program, or entries of a staged scale table


def _wrapped(tile: int, scale: np.ndarray) -> np.ndarray:
    """``scale`` as read at ``h % tile``."""
    flat = scale.reshape(-1)
    return flat[np.arange(flat.size) % tile].reshape(scale.shape)


def _tail_heads_first(tile: int, scale: np.ndarray) -> np.ndarray:
    """``scale`` with the heads past the last whole group of ``tile`` given head 0's value."""
    flat = scale.reshape(-1).copy()
    flat[flat.size - flat.size % tile:] = flat[0]
    return flat.reshape(scale.shape)


def _first_head(scale: np.ndarray) -> np.ndarray:
    return np.full_like(scale, scale.reshape(-1)[0])


def _replaced(other: np.ndarray, scale: np.ndarray, any_shape: bool = False) -> np.ndarray:
    """``other`` read in place of ``scale``, which must have its shape unless ``any_shape`` (scales
    of two kinds: a per-tensor one read where a per-head one lies, or the reverse)."""
    if scale.shape != other.shape and not any_shape:
        raise ValueError(f"a scale of shape {scale.shape}, not the case's {other.shape}")
    return other.astype(scale.dtype, copy=True)


def _short(models: str) -> str:
    """A preset's description up to its first clause break."""
    for mark in (":", ";", ", as in"):
        models = models.split(mark)[0]
    return models.strip()
