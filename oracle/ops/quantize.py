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
from ..diagnose.hypothesis import Hypothesis
from . import _build, _fp8cases
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
        scale = arena.tensor("scale", scale_np, role="scale")
        x_np = _fp8cases.values(rng, p["values"], fmt, (n, heads, dim), dtype, scale_np)
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
        fmt = self.p_with_defaults(case)["fp8"]
        fmt, mode, fp8_args, rest = _fp8cases.resolve(contract, fmt, override)
        if rest:
            raise ValueError(f"quantize_fp8 has no {sorted(rest)} to override")
        x, scale = _fp8cases.apply_scale(mode, prepared.numpy("x"), prepared.numpy("scale"))
        with np.errstate(all="ignore"):  # special values overflow and divide NaN on purpose
            return {"out": reference.quantize(x, fmt, scale=scale, head_axis=-2, **fp8_args)}

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The fp8 hypotheses (:func:`_fp8cases.alternatives`) and a per-head scale collapsed to
        head 0."""
        p = self.p_with_defaults(case)
        return (_fp8cases.alternatives(p, contract, row_width=p["shape"][1])
                + _fp8cases.scale_hypotheses(p, ("scale",), p["shape"][0]))

    def bad_inputs(self) -> tuple:
        return ("x_dtype", "scale_dtype", "out_dtype", "shape_mismatch", "fmt")
