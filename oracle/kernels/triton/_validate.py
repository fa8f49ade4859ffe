"""The host side of the Triton writers' device-side slot check (:mod:`._kernels`, ``CHECK``).

A validating call never reads the index on the host. :func:`plan` decides how the device checks
it and returns the writer's extra arguments and constexprs:

- up to :data:`FUSED_CHECK_MAX` entries, ``CHECK = 1``: every program of the writer scans the whole
  index (a few L2 reads next to its own slot load), so the call stays one launch;
- above, ``CHECK = 2``: :func:`plan` first launches ``check_slots`` (one program per chunk of at
  least :data:`CHUNK` entries, at most :data:`MAX_CHUNKS` of them), which leaves each chunk's first
  illegal entry in a small verdict buffer; the writer, launched with programmatic dependent launch
  on sm_90+ (its L2 prefetch overlaps the check), reads the verdict after ``griddepcontrol.wait``.

An index checked beforehand (:func:`oracle.kernels.check_index`) longer than FUSED_CHECK_MAX brings
its own verdict words: the writer reads them as ``CHECK = 2`` and nothing else is launched (a shorter
one is scanned by every program as usual: a few L2 reads, where the verdict, written long before,
may take a trip to DRAM).

Either way an illegal slot stops every store of the call, and the first one lands in the
mailbox of :mod:`oracle.kernels._deferred`; :func:`finish` raises it at once when the caller asked
for it (``validate="sync"``, ``KV_ORACLE_SYNC_ERRORS=1``) or on the CPU interpreter, where the
launch has already run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _deferred
from .._checks import check_scale_values
from . import _plans, _runtime

FUSED_CHECK_MAX = 256  # entries every program scans itself; above, a separate check grid
CHUNK = 1024  # entries per check program at least: one step of CHECK_SCAN loads
MAX_CHUNKS = 64  # check programs at most (the writer reads one verdict word per program)
CHECK_SCAN = 1024  # entries a check program loads per step
# When the check grid lets the writer launch (under PDL): True at once, before the check's own wait
# (the writer's launch and L2 prefetch then overlap the kernels before the check); False after that
# wait. benchmarks/check_order.py times both; docs/benchmarks.md.
CHECK_EARLY = True


@dataclass
class Check:
    """What one writer launch carries for the device check: ``args`` (verdict, verdict count,
    mailbox, argument code, padding code: appended to the writer's arguments), ``meta`` (its
    constexprs), whether the writer must be launched with PDL, whether to raise at once, and
    whether ``args`` hold the mailbox (``reports``: a validating call outside CUDA-graph capture,
    whose kernels then also check the call's scales)."""

    args: tuple
    meta: dict
    pdl: bool = False
    sync: bool = False
    device_index: int = -1
    reports: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _split(n: int) -> tuple:
    """(programs, entries per program, the scan's STEPS) of a check over ``n > 0`` entries: the
    check grid and check_index's copy split alike, so a writer reads either's verdict words the
    same way."""
    chunks = min(MAX_CHUNKS, _cdiv(n, CHUNK))
    chunk = _cdiv(n, chunks)
    return chunks, chunk, _pow2(_cdiv(chunk, CHECK_SCAN))


def unchecked(placeholder: torch.Tensor) -> Check:
    """No device check (``validate=False``): placeholder pointers, ``CHECK = 0``."""
    return Check((placeholder, 0, placeholder, 0, 0),
                 {"CHECK": 0, "NEGATIVE_OK": 0, "CHECK_BLOCK": 16, "SYS_FENCE": 0})


_verdicts: dict = {}  # (device index, stream) -> int64[MAX_CHUNKS] reused by calls in stream order
_plans.keep_constants(_verdicts.values)  # kept for the process: a plan may hold one
_plans.keep_constants(_deferred.mailboxes)


def _verdict_buffer(device: torch.device, interpreting: bool) -> torch.Tensor:
    """A verdict buffer for one call (never captured: see :func:`plan`). Calls on one stream run in
    order, so they share one buffer (under the interpreter, calls run one after another)."""
    index = device.index
    key = (device.type, index, None if interpreting else torch.cuda.current_stream(index).cuda_stream)
    found = _verdicts.get(key)
    if found is None:
        found = _verdicts[key] = torch.empty(MAX_CHUNKS, dtype=torch.int64, device=device)
    return found


_metas: dict = {}


def _meta(check: int, negative: int, block: int, interpreting: bool) -> dict:
    """The writer's check constexprs (one dict per combination, shared: callers copy to change)."""
    key = (check, negative, block, interpreting)
    found = _metas.get(key)
    if found is None:
        found = _metas[key] = {"CHECK": check, "NEGATIVE_OK": negative, "CHECK_BLOCK": block,
                               "SYS_FENCE": 0 if interpreting else 1}
    return found


def _begin(validate, device: torch.device, interpreting: bool) -> tuple:
    """(raise at once, the mailbox, the device index) of a validating call, after raising the
    error an earlier call left in the mailbox, if the GPU has written one by now."""
    sync = _deferred.sync_requested(validate) or interpreting  # the interpreter has already run it
    box = _deferred.mailbox(device)
    device_index = device.index if device.type == "cuda" else -1
    _plans.note("take", device_index)
    _deferred.take(device_index)
    return sync, box, device_index


def scale_check(placeholder: torch.Tensor, validate, device: torch.device, interpreting: bool,
                capturing: bool) -> Check:
    """The check of a call with scales but no slots (the quantizers): no slot check (``CHECK =
    0``), but the mailbox for the kernels' scale check, unless ``validate`` is False or a CUDA
    graph is being captured."""
    if validate is False or capturing:
        return unchecked(placeholder)
    sync, box, device_index = _begin(validate, device, interpreting)
    return Check((placeholder, 0, box, 0, 0), dict(_meta(0, 0, 16, interpreting)), sync=sync,
                 device_index=device_index, reports=True)


def empty_call_scales(validate, named_scales, capturing: bool) -> None:
    """A validating call that launches nothing (nothing to write) still rejects a scale that is
    not finite and > 0 (``named_scales``: (argument name, tensor) pairs): read on the host, the one
    case where a scale is (such a call moves no data; not while a CUDA graph is being captured).
    The read depends on data, not on the call's signature: the call is never replayed from a plan."""
    if validate is False or capturing:
        return
    _plans.spoil()
    for name, scale in named_scales:
        check_scale_values(name, scale)


def plan(kernels, launch, index: torch.Tensor, n: int, num_slots: int, padding, argument: str, validate,
         device: torch.device, interpreting: bool, pdl_capable: bool, pdl: bool,
         verdict: torch.Tensor | None = None) -> Check:
    """The device check of a validating call (``validate`` True or "sync") outside CUDA-graph
    capture; launches the check grid where the index is longer than FUSED_CHECK_MAX.
    ``launch(kernel, grid, device, *args, **meta)`` launches a Triton kernel as the writers do.
    ``verdict``: the int64[1..64] verdict of an index checked beforehand (oracle.kernels.check_index),
    which the writer reads as it reads a check grid's (``CHECK = 2``), with nothing launched here."""
    sync, box, device_index = _begin(validate, device, interpreting)
    pad_code = _deferred.PADDINGS.index(padding.kind)  # the writer passes the reserved slot itself
    negative = 1 if padding.kind == "negative" else 0
    code = _deferred.ARGUMENTS.index(argument)
    if verdict is not None and n > FUSED_CHECK_MAX:  # a short index is scanned by every program all the same
        words = verdict.shape[0]
        return Check((verdict, words, box, code, pad_code), _meta(2, negative, max(16, _pow2(words)), interpreting),
                     sync=sync, device_index=device_index, reports=True)
    if n <= FUSED_CHECK_MAX:  # one step covers the index
        meta = _meta(1, negative, max(16, _pow2(n)), interpreting)
        return Check((index, 0, box, code, pad_code), meta, sync=sync, device_index=device_index, reports=True)
    meta = dict(_meta(2, negative, 16, interpreting))
    chunks, chunk, steps = _split(n)
    verdict = _verdict_buffer(device, interpreting)
    overlap = pdl_capable and not interpreting  # the writer waits for the check grid by PDL
    launch(kernels.check_slots, (chunks,), device, index, index.stride(0), n, num_slots, chunk, verdict,
           NEGATIVE_OK=negative, BLOCK=CHECK_SCAN, STEPS=steps,
           PDL=bool(pdl and overlap), TRIGGER=(2 if CHECK_EARLY else 1) if overlap else 0)
    meta["CHECK_BLOCK"] = max(16, _pow2(chunks))
    return Check((verdict, chunks, box, code, pad_code), meta, pdl=overlap, sync=sync, device_index=device_index,
                 reports=True)


def copy_and_check(index: torch.Tensor, num_slots: int, negative_ok: bool) -> tuple:
    """(a contiguous copy of ``index``, its verdict words) in one launch of ``copy_and_check`` on
    the current stream, a word per chunk of CHUNK entries or more (MAX_CHUNKS at most), as the
    check grid leaves them: oracle.kernels.check_index on a GPU where the Triton kernels are in use
    and the CUDA library is not loaded. The caller has checked ``index`` (1-D, int32 or int64)."""
    n = index.shape[0]
    copy = torch.empty(n, dtype=index.dtype, device=index.device)
    if n == 0:
        return copy, torch.zeros(1, dtype=torch.int64, device=index.device)
    chunks, chunk, steps = _split(n)
    verdict = torch.empty(chunks, dtype=torch.int64, device=index.device)
    _runtime.launch(_runtime.kernels().copy_and_check, (chunks,), index.device, index, index.stride(0), n,
                    num_slots, chunk, copy, verdict, NEGATIVE_OK=1 if negative_ok else 0, BLOCK=CHECK_SCAN,
                    STEPS=steps)
    return copy, verdict


def finish(check: Check) -> None:
    """After the writer's launch: raise the call's own error at once where that was asked for (the
    stream is synchronized first on a GPU)."""
    if check.sync:
        _plans.note("raise", check.device_index)
        _deferred.raise_at_once(check.device_index)
