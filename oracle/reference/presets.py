"""Named fp8 conversion behaviours, so a kernel's contract can say which one it implements.

Each preset is the set of :class:`~oracle.reference.fp8_formats.Fp8Knobs` one real implementation
uses, per format (torch 2.13 saturates e4m3fn only). Facts: ../shared/peer-semantics.md, "fp8
conversion facts" and section 4; every row there was measured on all 2**32 float32 inputs.

A preset's knobs apply only where the caller names none; its ``inf`` goes with its ``saturate``, so
a caller that names ``saturate`` without ``inf`` gets that mode's own inf rule
(:func:`oracle.reference.fp8.resolve_knobs`). Saturating presets name ``inf`` explicitly; the
non-saturating ones leave it to the mode (inf for e5m2, NaN for e4m3fn and fnuz).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fp8_formats import FORMATS, Fp8Knobs

OCP = ("e4m3fn", "e5m2")


@dataclass(frozen=True)
class Preset:
    name: str
    models: str  # the real implementations it describes
    default: Fp8Knobs
    per_format: dict = field(default_factory=dict)
    formats: tuple = tuple(FORMATS)

    def knobs(self, fmt: str) -> Fp8Knobs:
        if fmt not in self.formats:
            raise ValueError(f"preset {self.name!r} does not cover format {fmt!r} "
                             f"(it covers {', '.join(self.formats)})")
        return self.per_format.get(fmt, self.default)


_NONSAT_TORCH = Fp8Knobs(saturate=False)  # NaN 0x7F|sign (fnuz 0x80), e5m2 overflow -> inf

PRESETS = {p.name: p for p in [
    Preset("ocp_satfinite",
           "the OCP FP8 saturating conversion: overflow and inf to ±max, NaN 0x7F|sign (fnuz 0x80); "
           "the reference default",
           Fp8Knobs(saturate=True, inf="max")),
    Preset("ml_dtypes",
           "ml_dtypes 0.6 astype: overflow and inf to NaN (e4m3fn), inf (e5m2) or 0x80 (fnuz); "
           "NaN 0x7F|sign, e5m2 0x7E|sign",
           Fp8Knobs(saturate=False), {"e5m2": Fp8Knobs(saturate=False, nan="0x7E|sign")}),
    Preset("torch_2_11",
           "torch <= 2.11 Tensor.to() on CPU and CUDA: like ml_dtypes but e5m2 NaN is 0x7F|sign",
           _NONSAT_TORCH),
    Preset("torch_2_11_cuda",
           "torch 2.11 x.float() / scale then Tensor.to() on CUDA (H100, measured by this suite): "
           "as torch_2_11, but NaN inputs come out 0x7F without sign (the CUDA division returns the "
           "canonical NaN), while overflow still gives 0x7F|sign (e4m3fn)",
           Fp8Knobs(saturate=False, nan="0x7F", overflow_nan="0x7F|sign"), formats=OCP),
    Preset("torch_2_13",
           "torch 2.13 Tensor.to() on CPU: e4m3fn saturates (overflow and inf to ±448, "
           "PyTorch #178817); e5m2 and fnuz as torch 2.11",
           _NONSAT_TORCH, {"e4m3fn": Fp8Knobs(saturate=True, inf="max")}),
    Preset("cuda_satfinite",
           "CUDA __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...) on sm_90, as in vLLM's "
           "reshape_and_cache(_flash) and concat_and_cache_mla: saturates, inf to ±max, "
           "NaN 0x7F without sign",
           Fp8Knobs(saturate=True, inf="max", nan="0x7F"), formats=OCP),
    Preset("cuda_nosat",
           "CUDA __nv_cvt_float_to_fp8(..., __NV_NOSAT, ...) on sm_90: overflow and inf to NaN "
           "(e4m3) or inf (e5m2), NaN 0x7F without sign",
           Fp8Knobs(saturate=False, nan="0x7F"), formats=OCP),
    Preset("triton_sm90",
           "Triton 3.6 tl.store of float32 into a float8e4nv/float8e5 pointer on sm_90: saturates, "
           "inf to ±max, NaN 0x7F without sign",
           Fp8Knobs(saturate=True, inf="max", nan="0x7F"), formats=OCP),
    Preset("onnx_saturate",
           "ONNX Cast with saturate=1: overflow to ±max; inf to ±max (e4m3fn), inf (e5m2), "
           "NaN (fnuz)",
           Fp8Knobs(saturate=True, inf="nan"),
           {"e4m3fn": Fp8Knobs(saturate=True, inf="max"), "e5m2": Fp8Knobs(saturate=True, inf="inf")}),
]}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not a known fp8 preset; expected one of {sorted(PRESETS)}")
    return PRESETS[name]
