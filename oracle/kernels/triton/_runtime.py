"""Where the Triton kernels run and how they are launched: the kernel module (imported, with
triton, on first use), whether it is Triton's CPU interpreter, :func:`launch` (through the cached
compiled kernel on a GPU, :mod:`._launch`) and whether a Triton launch hook is installed.
Each launch is noted for the launch plan of the call being planned (:mod:`._plans`)."""

from __future__ import annotations

import numpy as np
import torch

from . import _plans

KERNEL_FP8 = {"e4m3fn": 1, "e5m2": 2}  # formats the kernels implement (Triton float8e4nv, float8e5)

INTERPRETER_FP8 = ("the Triton interpreter's fp8 conversion is wrong for several % of inputs "
                   "(triton#8322; 464 -> NaN, inf -> 256, mantissa carries dropped), so the fp8 paths "
                   "are refused under TRITON_INTERPRET=1; they run on CUDA")

_kernels = None


def kernels():
    """The kernel module (imports triton on first use)."""
    global _kernels
    if _kernels is None:
        from . import _kernels as module

        _kernels = module
    return _kernels


_interpreting = None


def interpreting() -> bool:
    """Whether the kernels run on Triton's CPU interpreter (TRITON_INTERPRET=1 when they were
    defined) rather than compiled for a GPU (fixed once the kernels are imported)."""
    global _interpreting
    if _interpreting is None:
        from triton.runtime.interpreter import InterpretedFunction

        _interpreting = isinstance(kernels().paged_write, InterpretedFunction)
    return _interpreting


def launch(kernel, grid, device: torch.device, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)`` on ``device``: on a GPU through the cached compiled kernel
    (:mod:`._launch`), which costs about half the JIT's host time per call. A true ``PDL``
    constexpr also asks for programmatic dependent launch (sm_90+); the interpreter has no
    launches to overlap, so there it is turned off, and so are the L2 prefetches (``PF_*``: inline
    PTX, which it cannot run). The launch is noted for the call's plan (:mod:`._plans`)."""
    if interpreting():  # CPU tensors, or CUDA tensors the interpreter copies to the host
        if meta.get("PDL"):
            meta["PDL"] = False
        for name in meta:
            if name.startswith("PF_") and name != "PF_SECTOR":
                meta[name] = 0
        # numpy runs the interpreter's float arithmetic: inf * 0 (a NaN a convention may want)
        # and overflow to inf are results, not errors
        with np.errstate(all="ignore"):
            kernel[grid](*args, **meta)
        _plans.note("launch", kernel, grid, args, meta, None)
        return
    if meta.get("PDL"):
        meta["launch_pdl"] = True
    if _launcher is None:
        _import_launcher()
    index = device.index
    if index != torch._C._cuda_getDevice():  # the current device, without torch.cuda's lazy-init checks
        _plans.spoil()  # a replay launches on the current device: plan only calls made there
        with torch.cuda.device(index):
            _launcher(kernel).launch(grid, index, args, meta)
        return
    entry = _launcher(kernel).launch(grid, index, args, meta)
    if entry is None:
        _plans.spoil()
    else:
        _plans.note("launch", kernel, grid, args, meta, entry)


_launcher = None  # ._launch.launcher, imported (with triton) on the first GPU launch
_hooks_installed = None  # ._launch.hooks_installed, likewise


def _import_launcher() -> None:
    global _launcher, _hooks_installed
    from ._launch import hooks_installed, launcher

    _launcher, _hooks_installed = launcher, hooks_installed


def hooks_installed() -> bool:
    """Whether a Triton launch hook is installed (never before the first GPU launch imports the
    launcher: the interpreter has no hooks)."""
    return _hooks_installed is not None and _hooks_installed()
