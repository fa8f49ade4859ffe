"""``quantize_fp8(out, x, scale, fmt)``: fp8 quantization into a preallocated output.

x ``[N, H, D]`` float32, float16 or bfloat16, any row stride; out uint8 of x's shape, written
with the codes of ``fp8(x / scale)``; scale a float32 tensor of shape [1] or [H] (per head, also
checked unchanged); fmt a format name ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz").

Cases outside the "fp8" class quantize to e4m3fn with the per-tensor scale 0.0123 (so ordinary
activations reach the top of the format and a few saturate).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import reference
from ..buffers import NUMPY_DTYPES, Arena
from ..contract import Contract
from ..diagnose.row_bounds import VECTOR_LENGTHS
from ..diagnose.hypothesis import Hypothesis
from . import _build, _fp8cases, _fp8hypotheses
from ._bad_scales import BAD_SCALES, spoil
from .base import Case, OpSpec, Prepared


class QuantizeFp8(OpSpec):
    name = "quantize_fp8"
    signature = "quantize_fp8(out, x, scale, fmt)"
    dtypes = ("bfloat16", "float16", "float32")
    index_dtypes = ()
    fp8 = True
    fp8_scales = _fp8cases.SCALES
    fp8_tail_shape = (13, 46)
    default_shape = (8, 128)  # (heads, head_dim)
    shapes = ((1, 64), (8, 128), (32, 128), (8, 256), (1, 46), (13, 46), (8, 96), (1, 97))
    sources = ("x",)
    scale_arguments = ("scale",)
    # padded: a row stride no multiple of H * D or of D; interleaved: heads apart (the per-head
    # scale case runs there: a head computed from an element's offset is wrong)
    source_layouts = ("fused", "padded", "interleaved")
    aliasing = ("offset", "padded")  # out at a storage offset; out's rows past their end (a strided out)

    def p_with_defaults(self, case: Case) -> dict:
        p = super().p_with_defaults(case)
        p.setdefault("fp8", "e4m3fn")
        p.setdefault("scale", "0.0123")
        return _fp8cases.with_defaults(p, case.p)

    def row_bytes(self, case: Case) -> int:
        p = self.p_with_defaults(case)
        heads, dim = p["shape"]
        return math.gcd(heads * dim * NUMPY_DTYPES[p["dtype"]].itemsize, heads * dim)

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        heads, dim = p["shape"]
        n, dtype, fmt, bad = p["n"], p["dtype"], p["fp8"], p.get("bad")
        scale_np = _fp8cases.scale_values(p["scale"], heads)
        x_np = _fp8cases.values(rng, p["values"], fmt, (n, heads, dim), dtype, scale_np)
        if bad in BAD_SCALES:
            scale_np, = spoil(bad, [scale_np])
        scale = arena.tensor("scale", scale_np, role="scale")
        (x,) = _build.rows(arena, ("x",), (x_np,), p["src"])
        out_dtype = "float16" if bad == "out_dtype" else "uint8"
        (out,) = _build.caches(arena, ("out",), ((n, heads, dim),), out_dtype, p["cache"])
        if bad == "x_dtype":
            x = x.to(torch.float64)
        elif bad == "scale_dtype":
            scale = scale.to(torch.float64)
        elif bad == "shape_mismatch":
            out = out[:, :, : dim - 1]
        elif bad == "fmt":
            fmt = "e4m3"
        return Prepared(arena, (out, x, scale, fmt), ("out",))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        """Overrides: those of :func:`_fp8cases.resolve`, and ``flat_tail=V`` with ``tail={...}``
        (the last ``numel % V`` elements of the flattened tensor, past its last whole V-element
        vector, converted under the ``tail`` overrides: a vector loop's scalar remainder that
        converts another way)."""
        flat_tail, tail = override.pop("flat_tail", None), override.pop("tail", {})
        if flat_tail:
            body = self.expected(prepared, case, contract, **override)["out"]
            rest = body.size % flat_tail
            if not rest or rest == body.size:
                raise ValueError(f"flat_tail={flat_tail}: no remainder of its own in {body.size} elements")
            out = body.reshape(-1).copy()
            out[-rest:] = self.expected(prepared, case, contract, **(override | tail))["out"].reshape(-1)[-rest:]
            return {"out": out.reshape(body.shape)}
        fmt = self.p_with_defaults(case)["fp8"]
        fmt, mode, fp8_args, rest = _fp8cases.resolve(contract, fmt, override)
        if rest:
            raise ValueError(f"quantize_fp8 has no {sorted(rest)} to override")
        x, scale = _fp8cases.apply_scale(mode, prepared.numpy("x"), prepared.numpy("scale"))
        with np.errstate(all="ignore"):  # special values overflow and divide NaN on purpose
            return {"out": reference.quantize(x, fmt, scale=scale, head_axis=-2, **fp8_args)}

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The fp8 hypotheses (:func:`_fp8hypotheses.alternatives`) and a per-head scale collapsed to
        head 0."""
        p = self.p_with_defaults(case)
        return (_fp8hypotheses.alternatives(p, contract, row_width=p["shape"][1])
                + _fp8hypotheses.scale_hypotheses(p, self.scale_arguments, p["shape"][0])
                + _fp8hypotheses.zero_head_hypotheses(p, ("x",)))

    def layout_alternatives(self, case: Case, contract: Contract, prepared: Prepared) -> list[Hypothesis]:
        """The flattened tensor's scalar remainder converted another way (:func:`_flat_tail_hypotheses`):
        whether a way changes anything depends on the remainder's values, so these are offered
        for the built case, after the others."""
        p = self.p_with_defaults(case)
        return (_flat_tail_hypotheses(p, contract) + _address_head_hypotheses(p, prepared)
                + _chunk_head_hypotheses(p))

    def bad_inputs(self) -> tuple:
        return ("x_dtype", "scale_dtype", "out_dtype", "shape_mismatch", "fmt", *BAD_SCALES)


def _address_head_hypotheses(p: dict, prepared: Prepared) -> list[Hypothesis]:
    """A per-head scale indexed by the head an element's offset from x's start would have in
    dense rows, ``(offset // D) % H``: right while x's row stride is a multiple of ``H * D`` and its
    heads are D apart."""
    heads, dim = p["shape"]
    row_stride, head_stride = prepared.arena.views["x"].strides[:2]
    if p.get("scale") != "head" or heads < 2 or (row_stride % (heads * dim) == 0 and head_stride == dim):
        return []
    apart = f"rows {row_stride}" + (f", heads {head_stride}" if head_stride != dim else "")
    return [Hypothesis("scale_misindexed", f"the per-head scale indexed by (offset // {dim}) % {heads}, from each "
                       f"element's offset in x ({apart} elements apart): the head it would have in "
                       "dense rows, not its own", {"scale": f"address_head={row_stride},{head_stride}"})]


CHUNKS = (1024, 2048, 4096, 8192)  # elements of the flat chunks a kernel may split x into


def _chunk_head_hypotheses(p: dict) -> list[Hypothesis]:
    """A per-head scale indexed by the head of an element's offset inside its flat chunk of C
    elements, ``(local // D) % H`` (work split into chunks, each indexed from its own start):
    right while C is a multiple of ``H * D``."""
    heads, dim = p["shape"]
    if p.get("scale") != "head" or heads < 2:
        return []
    return [Hypothesis("scale_misindexed", f"the per-head scale indexed by ({chunk}-element chunk offset // {dim}) "
                       f"% {heads}: x split into flat chunks of {chunk} elements, each element's head taken from its "
                       "offset inside its chunk, not in x", {"scale": f"chunk_head={chunk}"})
            for chunk in CHUNKS if p["n"] * heads * dim > chunk and chunk % (heads * dim)]


def _flat_tail_hypotheses(p: dict, contract: Contract) -> list[Hypothesis]:
    """A vector loop over the flattened tensor whose scalar remainder (the last ``numel % V``
    elements) converts another way: rounding toward zero or ties away, the other saturation, or
    no scale; for each vector length V that leaves a remainder of its own."""
    heads, dim = p["shape"]
    try:
        declared = contract.knobs(p["fp8"])
    except (TypeError, ValueError):
        return []
    ways = [("rounded toward zero", {"rounding": "toward_zero"}), ("with ties away from zero", {"rounding": "ties_away"}),
            (f"{'not ' if declared.saturate else ''}saturated", {"saturate": not declared.saturate, "inf": None})]
    if p.get("scale", "1.0") != "1.0":
        ways.append(("without the scale", {"scale": "one"}))
    return [Hypothesis("fp8_conversion", f"the last {rest} elements of the flattened tensor (past its last whole "
                       f"{vector}-element vector: a scalar remainder loop) converted {how}",
                       {"flat_tail": vector, "tail": change})
            for vector, rest in _remainders(p["n"] * heads * dim) for how, change in ways]


def _remainders(total: int) -> list[tuple[int, int]]:
    """(vector, remainder) for each vector length of the flattened loop that leaves a remainder of
    its own (neither none nor everything)."""
    seen, out = set(), []
    for vector in VECTOR_LENGTHS:
        rest = total % vector
        if 0 < rest < total and rest not in seen:
            seen.add(rest)
            out.append((vector, rest))
    return out