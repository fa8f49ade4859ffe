"""A validating writer's slot check, done once per index and reused while torch sees no change.

A serving engine writes every layer of a forward step through one slot index: 61 calls of a
DeepSeek-V3 step pass the same ``loc`` tensor. A validating GPU writer on a long index pays for a
check grid that must complete before its first store (eagerly, on the H100, about 2-3 us of a
14 us MLA write at N = 16384; docs/benchmarks.md). :func:`reusing` wraps a writer so that its
first validating call with an index checks it on the device (one launch of
:func:`oracle.kernels.check_index`'s check, no synchronization) and keeps the verdict; a later
call with **the same tensor object, at the same version**, reads that verdict instead of checking
again, as a :class:`~oracle.kernels.checked_index.CheckedIndex` would, with nothing launched before
the writer.

**What "unchanged" means.** A verdict is reused only while all of these hold: the index is the
very tensor object that was checked, its version counter (``tensor._version``, bumped by every
in-place torch op on it or on any view of its storage: ``copy_``, ``index_put_``, ``fill_``,
``out=``, custom ops that declare the mutation) has not moved, its data pointer and length are the
same, the cache has the same number of slots and the writer the same padding policy, and the call
is on the same device and stream as the check. Anything else checks again.

**The limit.** A kernel that writes the index's memory behind torch's back (a raw Triton or CUDA
launch on its data pointer, a CUDA graph replay into a static buffer) does not bump the version.
A call after such a write reuses a stale verdict. The writer still reads the index as it is then,
and every writer skips any row whose slot lies outside the cache, so nothing is ever written outside
it; but an illegal entry written that way is skipped without an error, and the call's legal rows
are written; and a verdict that found an entry illegal keeps refusing calls (naming that entry as
it reads then) after the entry is made legal that way. Turn reuse off where an index is changed that way (``KV_ORACLE_CHECK_REUSE=0``, read
at import, or :func:`set_enabled`), or pass a new tensor (a new view is enough) each time.

Reuse applies to validating calls (``validate`` True or "sync") outside a function dynamo is tracing
(``torch.compile``: a verdict kept there would be baked into the graph) on an index longer than
``REUSE_FROM`` entries (shorter ones are scanned by every block or program of the writer, in one
launch), never while a CUDA graph is being captured (the capture leaves the check out), and
never to an index that is not a 1-D int32/int64 tensor on the cache's device (the writer refuses
those in its own words), and never to an **inference tensor** (one made under
``torch.inference_mode()``, as a serving engine's forward makes its ``loc``): torch keeps no version
counter for it, so nothing would tell a change made in place; each validating call checks such an
index again. An engine that runs under inference mode checks its step's index once with
:func:`~oracle.kernels.check_index` and passes the CheckedIndex to every layer instead. A kept
index is held until the next check finds nothing else holding it (at most ``CAPACITY`` of them):
holding it keeps its memory from being handed to another tensor.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading

import torch

from ..reference.slots import Padding
from ._checks import INDEX_DTYPES
from .checked_index import INDEX_ARGUMENTS, CheckedIndex, check_index, slots_of

ENV = "KV_ORACLE_CHECK_REUSE"
REUSE_FROM = 257  # entries: up to 256, every block of a writer scans the index itself, in one launch
CAPACITY = 64  # indices kept at most (an engine needs one per step; the bench rotates up to 8 per cell)


def enabled_by_default() -> bool:
    """Whether ``KV_ORACLE_CHECK_REUSE`` leaves reuse on (anything but 0, false, off, no)."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "off", "no")


ENABLED = enabled_by_default()
_kept: dict = {}  # id(index) -> _Kept (read without the lock on every call; changed under it)
_lock = threading.Lock()
stats = {"checked": 0, "reused": 0}  # for tests and benchmarks


def set_enabled(flag: bool) -> None:
    """Reuse checks (True, the default) or check every validating call's index (False); False also
    forgets every kept verdict."""
    global ENABLED
    ENABLED = bool(flag)
    if not ENABLED:
        forget()


def forget() -> None:
    """Forget every kept verdict (the next validating call of each index checks it again)."""
    with _lock:
        _kept.clear()


def kept() -> int:
    """How many indices have kept verdicts."""
    return len(_kept)


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _Kept:
    """One index's verdicts: what the index was when checked, and a CheckedIndex (of the index
    itself, not a copy) per (number of slots, padding as the writer spelled it)."""

    __slots__ = ("index", "version", "pointer", "entries", "device", "stream", "checks")

    def __init__(self, index: torch.Tensor, device: int, stream: int):
        self.index, self.version, self.pointer = index, index._version, index.data_ptr()
        self.entries, self.device, self.stream, self.checks = index.numel(), device, stream, {}

    def current(self, index: torch.Tensor) -> bool:
        """Whether ``index`` (this very tensor) is as it was checked, on the stream it was checked on."""
        return (index._version == self.version and index.data_ptr() == self.pointer
                and index.numel() == self.entries
                and (_raw_stream(self.device) if self.device >= 0 else -1) == self.stream)

    def unheld(self) -> bool:
        """Whether nothing but this entry holds its index: the entry, and each CheckedIndex twice
        (its field and its signature), and getrefcount's own argument."""
        return sys.getrefcount(self.index) <= 2 + 2 * len(self.checks)


def _check(index: torch.Tensor, device: int, num_slots: int, spelled: str, spec: str) -> CheckedIndex | None:
    """Check ``index`` on its device and keep the verdict (forgetting indices nothing else holds
    any more); None while a CUDA graph is being captured."""
    if device >= 0 and torch._C._cuda_isCurrentStreamCapturing():
        return None
    verdict = check_index(index, num_slots, padding=spec).verdict
    checked = CheckedIndex(index, verdict, num_slots, spec)
    stream = _raw_stream(device) if device >= 0 else -1
    with _lock:  # another thread's check may change the table meanwhile
        for key in [key for key, entry in _kept.items() if entry.index is not index and entry.unheld()]:
            del _kept[key]
        entry = _kept.get(id(index))
        if entry is None or entry.index is not index or not entry.current(index):
            if len(_kept) >= CAPACITY:
                del _kept[next(iter(_kept))]  # the oldest
            entry = _kept[id(index)] = _Kept(index, device, stream)
        entry.checks[(num_slots, spelled)] = checked
        stats["checked"] += 1
    return checked


def reusing(op: str, padding: str | None = None, reuse_from=None):
    """Decorate a writer of ``op`` (a key of :data:`~oracle.kernels.checked_index.INDEX_ARGUMENTS`,
    whose positional conventions it follows) so that its validating calls reuse their index's check
    (see the module docstring). ``padding``: the writer's fixed policy, else its ``padding`` keyword
    (its default when the call leaves it out). ``reuse_from(args)``: the shortest index the call
    checks for reuse, where the writer checks longer ones than REUSE_FROM in one launch too."""
    position, cache_at, lead = INDEX_ARGUMENTS[op]

    def decorate(fn):
        default = padding
        if default is None:
            default = inspect.signature(fn).parameters["padding"].default
        policies: dict = {}  # the writer's padding spellings -> the CheckedIndex's

        def first_call(args: tuple, kwargs: dict, index: torch.Tensor):
            """The index checked for reuse (a CheckedIndex), or None where it is not reused."""
            if index.dim() != 1 or index.dtype not in INDEX_DTYPES:
                return None
            if reuse_from is not None and index.shape[0] < reuse_from(args):
                return None
            cache = args[cache_at]
            num_slots = slots_of(cache, lead)
            device = index.get_device()
            if num_slots is None or device != cache.get_device():
                return None
            spelled = kwargs.get("padding", default)
            spec = policies.get(spelled) if isinstance(spelled, str) else None
            if spec is None:
                try:
                    spec = policies[spelled] = str(Padding.parse(spelled))
                except (TypeError, ValueError):
                    return None  # the writer refuses the padding in its own words
            return _check(index, device, num_slots, spelled, spec)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not ENABLED or len(args) <= position or kwargs.get("validate", True) is False or _is_compiling():
                return fn(*args, **kwargs)  # traced by dynamo: a kept verdict would become a graph constant
            index = args[position]
            if type(index) is not _Tensor or index.numel() < REUSE_FROM or index.is_inference():
                return fn(*args, **kwargs)  # every short call kept cheap; an inference tensor has no version
            entry = _kept.get(id(index))
            checked = None
            # every layer of a step after the first comes this way (_Kept.current, inlined)
            if (entry is not None and entry.index is index and index._version == entry.version
                    and index.data_ptr() == entry.pointer and index.numel() == entry.entries
                    and (_raw_stream(entry.device) if entry.device >= 0 else -1) == entry.stream):
                cache = args[cache_at]
                if type(cache) is _Tensor and cache.get_device() == entry.device:
                    shape = cache.shape
                    if len(shape) >= lead:
                        checked = entry.checks.get((shape[0] if lead == 1 else shape[0] * shape[1],
                                                    kwargs.get("padding", default)))
                        if checked is not None:
                            stats["reused"] += 1
            if checked is None:
                checked = first_call(args, kwargs, index)
                if checked is None:
                    return fn(*args, **kwargs)
            return fn(*args[:position], checked, *args[position + 1:], **kwargs)

        wrapper.reuses_checks = True
        return wrapper

    return decorate
