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

**What "unchanged" means.** An entry is reused only while all of these hold: the index is the very
tensor object that was checked (held by a weak reference, so a new tensor at a recycled address is
never taken for it), its version counter (``tensor._version``, bumped by every in-place torch op on
it or on any view of its storage: ``copy_``, ``index_put_``, ``fill_``, ``out=``, custom ops that
declare the mutation) has not moved, its data pointer, shape and strides are the same, it is
checked against the same number of slots under the same padding, and the call is on the same
device and stream as the check. Anything else checks again.

**The limit.** A kernel that writes the index's memory behind torch's back (a raw Triton or CUDA
launch on its data pointer, a CUDA graph replay into a static buffer) does not bump the version.
A call after such a write reuses a stale verdict. The writer still reads the index as it is then,
and every writer skips any row whose slot lies outside the cache, so nothing is ever written outside
it; but an illegal entry written that way is skipped without an error, and the call's legal rows
are written. Turn reuse off where an index is changed that way (``KV_ORACLE_CHECK_REUSE=0``, read
at import, or :func:`set_enabled`), or pass a fresh tensor (a new view is enough) each time.

Reuse applies to validating calls (``validate`` True or "sync") on an index longer than
``REUSE_FROM`` entries (shorter ones are scanned by every block or program of the writer, in one
launch), never while a CUDA graph is being captured (the capture leaves the check out), and
never to an index that is not a 1-D int32/int64 tensor on the cache's device (the writer refuses
those in its own words).
"""

from __future__ import annotations

import functools
import inspect
import os
import weakref

import torch

from ..reference.slots import Padding
from ._checks import INDEX_DTYPES
from .checked_index import INDEX_ARGUMENTS, CheckedIndex, check_index, slots_of

ENV = "KV_ORACLE_CHECK_REUSE"
REUSE_FROM = 257  # entries: up to 256, every block of a writer scans the index itself, in one launch
CAPACITY = 64  # entries kept at most (an engine needs one per step; the bench rotates up to 8 per cell)


def enabled_by_default() -> bool:
    """Whether ``KV_ORACLE_CHECK_REUSE`` leaves reuse on (anything but 0, false, off, no)."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "off", "no")


ENABLED = enabled_by_default()
_entries: dict = {}  # (id(index), num_slots, padding) -> _Entry
stats = {"checked": 0, "reused": 0}  # for tests and benchmarks


def set_enabled(flag: bool) -> None:
    """Reuse checks (True, the default) or check every validating call's index (False); False also
    forgets every kept verdict."""
    global ENABLED
    ENABLED = bool(flag)
    if not ENABLED:
        _entries.clear()


def forget() -> None:
    """Forget every kept verdict (the next validating call of each index checks it again)."""
    _entries.clear()


class _Entry:
    """A kept verdict: what its index was when checked (held weakly: the entry must not keep the
    caller's tensor alive) and the CheckedIndex's fields but the index itself."""

    __slots__ = ("ref", "version", "pointer", "entries", "strides", "stream", "fields", "key", "pointers")

    def __init__(self, ref, index: torch.Tensor, stream: int, checked: CheckedIndex):
        self.ref, self.version, self.pointer = ref, index._version, index.data_ptr()
        self.entries, self.strides, self.stream = index.numel(), index.stride(), stream
        self.fields = {name: value for name, value in vars(checked).items() if name not in ("index", "signature")}
        self.key, _, self.pointers, _ = checked.signature

    def checked(self, index: torch.Tensor) -> CheckedIndex:
        """The CheckedIndex of ``index`` (the very tensor checked), without recomputing its
        signature: the frozen dataclass's fields set as __post_init__ would set them (this runs on
        every reusing call)."""
        checked = _new(CheckedIndex)
        fields = self.fields.copy()
        fields["index"] = index
        fields["signature"] = (self.key, (index, fields["verdict"]), self.pointers, self.stream[0])
        _set(checked, "__dict__", fields)
        return checked


_Tensor = torch.Tensor
_new, _set = object.__new__, object.__setattr__
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _drop(key, ref) -> None:
    found = _entries.get(key)
    if found is not None and found.ref is ref:
        del _entries[key]


def checked_for(index: torch.Tensor, num_slots: int, padding: str, device: int) -> CheckedIndex | None:
    """The CheckedIndex a validating call on ``index`` (a 1-D int32/int64 tensor longer than
    REUSE_FROM, on its cache's device, whose index ``device`` is: -1 for the CPU) reads: the kept
    one where ``index`` is unchanged since its check (see the module docstring), else a new check's
    (kept for the next call); None while a CUDA graph is being captured. Its ``index`` is the
    caller's tensor itself, not a copy."""
    key = (id(index), num_slots, padding)
    found = _entries.get(key)
    stream = (device, _raw_stream(device) if device >= 0 else -1)
    if (found is not None and found.ref() is index and found.version == index._version
            and found.stream == stream and found.pointer == index.data_ptr() and found.entries == index.numel()
            and found.strides == index.stride()):
        stats["reused"] += 1
        return found.checked(index)
    if device >= 0 and torch._C._cuda_isCurrentStreamCapturing():
        return None
    verdict = check_index(index, num_slots, padding=padding).verdict
    checked = CheckedIndex(index, verdict, num_slots, padding)
    if len(_entries) >= CAPACITY:
        del _entries[next(iter(_entries))]  # the oldest
    _entries[key] = _Entry(weakref.ref(index, functools.partial(_drop, key)), index, stream, checked)
    stats["checked"] += 1
    return checked


def reusing(op: str, padding: str | None = None, reuse_from=None):
    """Decorate a writer of ``op`` (a key of :data:`~oracle.kernels.checked_index.INDEX_ARGUMENTS`,
    whose positional conventions it follows) so that its validating calls reuse their index's check
    (see the module docstring). ``padding``: the writer's fixed policy, else its ``padding`` keyword
    (its default when the call leaves it out). ``reuse_from(args)``: the shortest index the call
    reuses a check for, where the writer checks longer ones than REUSE_FROM in one launch too."""
    position, cache_at, lead = INDEX_ARGUMENTS[op]

    def decorate(fn):
        default = padding
        if default is None:
            default = inspect.signature(fn).parameters["padding"].default
        policies: dict = {}  # the writer's padding spellings -> the CheckedIndex's

        def policy(spec: str) -> str:
            found = policies.get(spec)
            if found is None:
                found = policies[spec] = str(Padding.parse(spec))
            return found

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not ENABLED or len(args) <= position or kwargs.get("validate", True) is False:
                return fn(*args, **kwargs)
            index = args[position]
            if type(index) is not _Tensor or index.numel() < REUSE_FROM:  # every short call: kept cheap
                return fn(*args, **kwargs)
            if index.dim() != 1 or (reuse_from is not None and index.shape[0] < reuse_from(args)):
                return fn(*args, **kwargs)
            cache = args[cache_at]
            num_slots = slots_of(cache, lead)
            device = index.get_device()
            if num_slots is None or index.dtype not in INDEX_DTYPES or device != cache.get_device():
                return fn(*args, **kwargs)
            try:
                spec = policy(kwargs.get("padding", default))
            except (TypeError, ValueError):
                return fn(*args, **kwargs)  # the writer refuses the padding in its own words
            checked = checked_for(index, num_slots, spec, device)
            if checked is None:
                return fn(*args, **kwargs)
            return fn(*args[:position], checked, *args[position + 1:], **kwargs)

        wrapper.reuses_checks = True
        return wrapper

    return decorate
