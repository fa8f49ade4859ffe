"""A slot index checked once on the device and written through many times: :func:`check_index`.

A validating GPU writer checks its index on every call, on the device, before its first store
(:mod:`oracle.kernels._deferred`). For a long index that check is a grid of its own that must
complete before the writer stores anything: eagerly, on the H100, about 2 us of a 14 us MLA write
at N = 16384 (docs/benchmarks.md). A serving engine writes every layer of one forward step with the
same slot index, so it can check the index once per step instead:

    checked = oracle.kernels.check_index(loc, num_slots=kv_buffer.shape[0])
    for layer in layers:
        set_mla_kv_buffer(layer.kv_buffer, checked, nope, rope)   # any writer that takes one

:func:`check_index` copies the index into private memory and computes, on the device, the first
entry that is illegal under the padding policy (or ``len(index)`` when none is), without
synchronizing: in one launch where the CUDA library of :mod:`oracle.kernels.cuda` is loaded, or
else where the Triton writers have compiled for a GPU in this process (the ``copy_and_check``
kernel), else with torch ops. The writers read the private copy and its verdict (an index of 256 entries
or fewer is scanned by every block or program as a plain one is: that costs a few L2 reads): a
call with an illegal entry still writes nothing and reports it to the mailbox, as a per-call check
does, so the contract of a validating call is unchanged; only the scan is shared. Changing the caller's index
after the check changes nothing that is written: the writers use the copy that was checked. The
copy and the verdict are made on the current stream, like any tensor: a writer on another stream
needs that stream to wait for it first (an event, or ``torch.cuda.Stream.wait_stream``).

Legality is the reference's (:mod:`oracle.reference.slots`): an entry is legal when it lies in
``[0, num_slots)``, or, under ``padding="negative"``, when it is negative (a skipped slot). Under
``"reserved:K"`` the reserved slot is legal only inside the range, so legality is the same as
under ``"none"``; a writer still refuses an index checked under another policy than its own, and a
cache with another number of slots than the one checked, with a ValueError naming both.

The Triton writers of ``store_cache``, ``set_mla_kv_buffer``, ``concat_and_cache_mla``,
``reshape_and_cache_flash`` and ``reshape_and_cache_block``, and the CUDA writers of the first, the
second and the fourth, take a :class:`CheckedIndex` wherever they take an index;
:class:`CheckedIndexWriter` registers each as ``<name>.checked_index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..reference.slots import Padding
from ._checks import INDEX_DTYPES, require_index


@dataclass(frozen=True, eq=False)
class CheckedIndex:
    """An index checked on the device by :func:`check_index` (build one with it, not by hand).

    ``index``: the private copy the writers read (1-D, contiguous, the caller's dtype);
    ``verdict``: int64[k] on the same device (1 <= k <= 64), each word the first illegal entry of
    one chunk of the index or ``len(index)``, so its minimum is the first illegal entry or
    ``len(index)`` (one word from torch ops and from the CUDA kernel, which folds its chunks' words
    on the device; one per chunk from the Triton kernel);
    ``num_slots`` and ``padding``: what it was checked against."""

    index: torch.Tensor
    verdict: torch.Tensor
    num_slots: int
    padding: str
    # (key, tensors, data pointers, device index) as the Triton launch plans read a call's
    # arguments (oracle/kernels/triton/_plans.py), computed once: the copy and the verdict are
    # private, so none of it changes while the CheckedIndex lives
    signature: tuple = field(init=False, repr=False, compare=False)
    entries: int = field(init=False, repr=False, compare=False)  # len(index), read on every call

    def __post_init__(self):
        parts = (self.index, self.verdict)
        pointers = tuple(t.data_ptr() for t in parts)
        key = (("checked", self.num_slots, self.padding),) + tuple(
            (t.dtype, t.shape, t.stride(), t.get_device(), p & 15) for t, p in zip(parts, pointers))
        object.__setattr__(self, "signature", (key, parts, pointers, self.index.get_device()))
        object.__setattr__(self, "entries", self.index.shape[0])

    def __len__(self) -> int:
        return self.entries

    @property
    def device(self) -> torch.device:
        return self.index.device

    def __repr__(self) -> str:
        return (f"CheckedIndex({len(self)} entries, {self.index.dtype}, {self.device}, "
                f"num_slots={self.num_slots}, padding={self.padding!r})")


def check_index(index: torch.Tensor, num_slots: int, *, padding: str = "none") -> CheckedIndex:
    """Copy ``index`` and check it on its device against ``num_slots`` under ``padding`` ("none",
    "negative" or "reserved:K"), without synchronizing; see the module docstring. Raises a
    TypeError or ValueError naming the argument for a bad index, ``num_slots`` or ``padding``."""
    require_index("index", index)
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 0:
        raise ValueError(f"num_slots={num_slots!r} must be an int >= 0")
    policy = Padding.parse(padding)
    fused = _fused_check(index)
    if fused is not None:  # one launch: the copy and the check
        copy, verdict = fused(index, num_slots, policy.kind == "negative")
        return CheckedIndex(copy, verdict, int(num_slots), str(policy))
    copy = torch.clone(index, memory_format=torch.contiguous_format)
    n = copy.shape[0]
    illegal = copy >= num_slots
    if policy.kind != "negative":
        illegal |= copy < 0
    position = torch.arange(n, dtype=torch.int64, device=copy.device)
    verdict = torch.where(illegal, position, n).amin(dim=0, keepdim=True) if n else \
        torch.zeros(1, dtype=torch.int64, device=copy.device)
    return CheckedIndex(copy, verdict, int(num_slots), str(policy))


def _fused_check(index: torch.Tensor):
    """A one-launch copy and check for a CUDA index, ``(index, num_slots, negative_ok) -> (copy,
    verdict)``: the CUDA library's (``torch.ops.kv_oracle_cuda.check_index``) where that library is
    loaded already (its writers are in use), else the Triton kernel's where the Triton writers have
    compiled for a GPU in this process (oracle.kernels.triton._validate.copy_and_check), else None:
    torch ops then do it in about seven launches, tens of microseconds of host time once per step.
    Neither library is loaded or compiled for the check alone."""
    if not index.is_cuda:
        return None
    from . import cuda

    lib = cuda._LIB.loaded
    if lib is not None:
        return lib.check_index
    from .triton import _runtime

    if _runtime._kernels is None or _runtime.interpreting():
        return None
    from .triton import _validate

    return _validate.copy_and_check


def slots_of(cache, lead: int) -> int | None:
    """The slots of ``cache``: its first dim (``lead`` 1) or its first two (``lead`` 2, blocks x
    tokens); None where it is not a tensor of that rank (the writer then refuses it itself)."""
    if not isinstance(cache, torch.Tensor):
        return None
    shape = cache.shape  # cheaper than size(0): this runs on every call of a step
    try:
        return shape[0] if lead == 1 else shape[0] * shape[1]
    except IndexError:
        return None


def resolve(argument: str, index, num_slots: int, padding: str):
    """A writer's ``argument`` as (the index tensor to read, the verdict tensor or None): a plain
    tensor as it is, a :class:`CheckedIndex` as its copy and verdict once it is known to have been
    checked against ``num_slots`` under ``padding`` (else a ValueError naming both)."""
    if type(index) is not CheckedIndex:
        return index, None
    if index.num_slots == num_slots and index.padding == padding:  # every call of a step: keep it short
        return index.index, index.verdict
    if index.num_slots != num_slots:
        raise ValueError(f"{argument} was checked against num_slots={index.num_slots}, but the cache has "
                         f"{num_slots} slots; check it against the cache it writes")
    if index.padding != padding and index.padding != str(Padding.parse(padding)):  # parsed only to tell
        raise ValueError(f"{argument} was checked under padding={index.padding!r}, but this writer's "
                         f"padding is {str(Padding.parse(padding))!r}")
    return index.index, index.verdict


# op -> (position of its index argument, position of the cache that bounds it, the cache's leading
# dims that count slots): the positional conventions of oracle.kernels.torch_native
INDEX_ARGUMENTS = {"store_cache": (4, 2, 1), "set_mla_kv_buffer": (1, 0, 1), "concat_and_cache_mla": (3, 2, 2),
                   "reshape_and_cache_flash": (4, 2, 2), "reshape_and_cache_block": (6, 2, 2)}


CHECKED_NOTE = ("the index checked by oracle.kernels.check_index before the call (a step checks it once for all "
                "its layers): the writer reads the checked copy and its verdict word instead of checking the index")


class CheckedIndexWriter:
    """A writer called with its index checked by :func:`check_index` first: what
    ``<name>.checked_index`` registers, so the conformance suite runs every case through the path a
    step that checks its index once takes. :meth:`prepare` does the check (once per step: the
    benchmarks call it outside the timed calls); calling the writer prepares its arguments first,
    unless the index is a CheckedIndex already. An index or cache the check cannot take (not a 1-D
    integer tensor, a cache of the wrong rank) goes to the writer as it is, which refuses it in its
    own words."""

    def __init__(self, fn, op: str, padding: str):
        if op not in INDEX_ARGUMENTS:
            raise ValueError(f"op={op!r} has no index argument; expected one of {sorted(INDEX_ARGUMENTS)}")
        self.fn, self.op, self.padding = fn, op, padding
        self.position = INDEX_ARGUMENTS[op][0]
        self.__name__ = getattr(fn, "__name__", op)

    def prepare(self, args: tuple) -> tuple:
        """``args`` with the index replaced by its CheckedIndex."""
        position, cache_at, lead = INDEX_ARGUMENTS[self.op]
        index, num_slots = args[position], slots_of(args[cache_at], lead)
        if not (type(index) is torch.Tensor and index.dtype in INDEX_DTYPES and index.dim() == 1
                and num_slots is not None):
            return args
        return args[:position] + (check_index(index, num_slots, padding=self.padding),) + args[position + 1:]

    def __call__(self, *args, **kwargs):
        if type(args[self.position]) is CheckedIndex:  # checked once already: the usual case
            return self.fn(*args, **kwargs)
        return self.fn(*self.prepare(args), **kwargs)


__all__ = ["CHECKED_NOTE", "CheckedIndex", "CheckedIndexWriter", "INDEX_ARGUMENTS", "check_index", "resolve",
           "slots_of"]
