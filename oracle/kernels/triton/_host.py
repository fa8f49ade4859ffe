"""Host-side argument work of the Triton writers: padding policies, devices, index and row
shapes, the bitwise views, the fp8 format codes, the start of a call's device slot check
(:mod:`._validate`), and whether calls may be replayed from launch plans (:mod:`._plans`).
Everything here depends on metadata only, never on device values."""

from __future__ import annotations

import copy
import functools
import os

import torch

from .._checks import INDEX_DTYPES
from ..checked_index import CheckedIndex
from ..checked_index import resolve as resolve_checked
from . import _plans, _runtime, _validate, tiles

# KV_ORACLE_TRITON_PLANS=0 turns the launch plans off (every call runs the wrapper in full)
PLANS = os.environ.get("KV_ORACLE_TRITON_PLANS", "1").strip().lower() not in ("0", "false", "off", "no")

_settings_planned = None  # (PREFETCH, a copy of TUNING) the current plans were made under


def plans_enabled() -> bool:
    """Whether writer calls may be replayed from their plans (:mod:`._plans`): not with
    ``PLANS`` off, nor while a Triton launch hook is installed. A change of ``tiles.PREFETCH`` or
    ``tiles.TUNING`` (tuning scripts and tests set them) forgets every plan first."""
    global _settings_planned
    if not PLANS or _runtime.hooks_installed():
        return False
    seen = _settings_planned
    if seen is None or seen[0] is not tiles.PREFETCH or seen[1] != tiles.TUNING:
        _plans.clear()
        _settings_planned = (tiles.PREFETCH, copy.deepcopy(tiles.TUNING))
    return True

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

@functools.lru_cache(maxsize=64)
def parse_padding(spec: str) -> "Padding":
    """The parsed policy (cached: the writers parse theirs on every call)."""
    return Padding(spec)


class Padding:
    """A parsed padding policy: which slots the host accepts besides ``[0, num_slots)`` and
    which the kernel skips."""

    def __init__(self, spec: str):
        self.spec = spec
        self.negative = spec == "negative"
        self.reserved = None
        self.kind = spec if spec in ("none", "negative") else "reserved"
        if spec.startswith("reserved:"):
            try:
                self.reserved = int(spec.split(":", 1)[1])
            except ValueError:
                self.reserved = None
            if self.reserved is None or self.reserved < 0:
                raise ValueError(f"padding={spec!r}: reserved:K needs a slot K >= 0")
        elif spec not in ("none", "negative"):
            raise ValueError(f"padding={spec!r} is not 'none', 'negative' or 'reserved:K'")


def capturing(tensor: torch.Tensor) -> bool:
    # torch's C query directly: torch.cuda.is_current_stream_capturing() adds microseconds per call
    return tensor.is_cuda and torch._C._cuda_isCurrentStreamCapturing()


def device_of(*tensors: torch.Tensor) -> torch.device:
    index = tensors[0].get_device()  # an int: cheaper than comparing torch.device objects
    if index >= 0 and all(t.get_device() == index for t in tensors):
        return tensors[0].device  # all on one CUDA device
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(f"tensors on different devices: {', '.join(devices)}")
    if device.type != "cuda" and not _runtime.interpreting():
        raise ValueError(f"tensors are on {device}; the Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")
    return device


def check_index(name: str, index: torch.Tensor) -> None:
    if not isinstance(index, torch.Tensor) or index.dtype not in INDEX_DTYPES:
        got = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        raise TypeError(f"{name} has dtype {got}; expected torch.int32 or torch.int64")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")


def reads_device(validate: bool, tensor: torch.Tensor) -> bool:
    """Whether the checks that read device values (slot ranges, scales, the sentinel) run: not
    with ``validate=False`` (the caller vouches for them, as serving engines do in decode), and
    not while a CUDA graph is being captured (reading would break the capture)."""
    return validate and not capturing(tensor)


def index_arg(index) -> tuple:
    """A writer's index argument as (the tensor it reads, the CheckedIndex it came in, or None):
    a :class:`~oracle.kernels.checked_index.CheckedIndex` is read through its private copy."""
    if type(index) is CheckedIndex:
        return index.index, index
    return index, None


def begin_check(argument: str, index: torch.Tensor, n: int, num_slots: int, padding: Padding, validate,
                device: torch.device, placeholder: torch.Tensor, pdl: bool,
                checked: CheckedIndex | None = None) -> _validate.Check:
    """The device check of a writer call (:mod:`._validate`): none with ``validate=False`` or
    while a CUDA graph is being captured (the graph then replays the writer as it was before the
    check existed: a decode graph's slots are its engine's; the kernel still drops any slot outside
    the cache), else planned (and, for a long index, the check grid launched) before the writer's
    launch. ``checked`` (the index came as a CheckedIndex, :func:`index_arg`): refused unless it was
    checked against ``num_slots`` under ``padding``; its verdict then stands for the check grid."""
    verdict = None
    if checked is not None:
        _, verdict = resolve_checked(argument, checked, num_slots, padding.spec)
    if validate is False or capturing(index):
        return _validate.unchecked(placeholder)
    return _validate.plan(_runtime.kernels(), _runtime.launch, index, n, num_slots, padding, argument, validate, device,
                          _runtime.interpreting(), pdl_capable(device), pdl, verdict)


@functools.lru_cache(maxsize=16)
def _pdl_capable_index(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_capable(device: torch.device) -> bool:
    """Whether launches on ``device`` can use programmatic dependent launch (sm_90+)."""
    return device.type == "cuda" and not _runtime.interpreting() and _pdl_capable_index(device.index)


def launch_pdl(pdl, device: torch.device) -> bool:
    """A writer's ``pdl`` keyword resolved: None (the default) launches with programmatic
    dependent launch wherever ``device`` has it, True or False as asked."""
    return pdl_capable(device) if pdl is None else bool(pdl)


def kernel_format(fmt: str, allow_interpreter_fp8: bool) -> int:
    """The kernel's FP8 code for a validated format name; raises where the kernels cannot
    produce it (after validation, before any launch)."""
    if fmt not in _runtime.KERNEL_FP8:
        raise NotImplementedError(f"fp8 format {fmt!r}: the Triton kernels write e4m3fn and e5m2 "
                                  "only (Triton has no fnuz conversion on NVIDIA GPUs)")
    if _runtime.interpreting() and not allow_interpreter_fp8:
        raise NotImplementedError(_runtime.INTERPRETER_FP8)
    return _runtime.KERNEL_FP8[fmt]


# dtypes a compiled kernel loads and stores bitwise as they are (the copy paths always store into a
# cache of the source's own dtype, so no conversion is emitted; no NaN is canonicalized)
_NATIVE_BITS = frozenset((torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.uint8,
                          torch.int8, torch.int16, torch.int32, torch.int64))


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The same view as integers of the same width (strides and offset unchanged). On a GPU the
    common dtypes go as they are: the view costs a microsecond of host time per tensor, and the
    compiled copy moves their bits unchanged (the conformance suite's special values, NaN payloads
    included, check it); the interpreter computes through numpy, so it always gets integers."""
    if tensor.dtype in _NATIVE_BITS and not _runtime.interpreting():
        return tensor
    return tensor.view(_INT_OF_SIZE[tensor.element_size()])


def rows3(name: str, t: torch.Tensor) -> tuple[tuple, tuple]:
    """(shape, strides) of ``t`` as ``[N, H, D]`` (1-D rows are ``[N, 1, D]``)."""
    if t.dim() == 3:
        return tuple(t.shape), tuple(t.stride())
    if t.dim() == 2:
        return (t.shape[0], 1, t.shape[1]), (t.stride(0), 0, t.stride(1))
    if t.dim() == 1:
        return (t.shape[0], 1, 1), (t.stride(0), 0, 0)
    raise ValueError(f"{name} has shape {tuple(t.shape)}; the Triton writer takes rows of up to two "
                     "dims ([N, H, D])")


# --- launching -----------------------------------------------------------------------------

def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride()


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes ``t`` may address (empty for an empty tensor)."""
    if t.numel() == 0:
        return 0, 0
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 1)
    return start, start + (last + 1) * t.element_size()


def one_launch(sources: tuple, destinations: tuple) -> bool:
    """Whether the two sides of a K/V write may share a launch: each (K, V) pair of ``sources``
    and of ``destinations`` has one layout, and no K destination's bytes overlap its V twin's.
    Where they overlap (the caches aliased, as a caller may pass one buffer for both), the
    programs of one launch would race on the shared rows: two launches, V after K, write as
    ``k_cache[loc] = k; v_cache[loc] = v`` does."""
    if not all(same_layout(a, b) for a, b in sources + destinations):
        return False
    for a, b in destinations:
        (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
        if a0 < b1 and b0 < a1:
            return False
    return True
