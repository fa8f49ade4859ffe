"""Launch plans: a writer call's host work done once per call signature, replayed after that.

What a writer's host wrapper does (metadata checks, the padding policy, the tile, the grid, the
check plan, Triton's argument binder) depends only on the call's **signature**:

- each tensor's dtype, shape, strides, device, and whether its data pointer is 16-byte aligned
  (Triton compiles a different binary when it is not);
- which tensor arguments share a data pointer (a :class:`~oracle.kernels.checked_index.CheckedIndex`
  counts as its copy and its verdict, with the slots and padding it was checked against);
- every other argument's value, keywords included;
- whether a CUDA graph is being captured, the current device and stream.

The first call of a signature runs the wrapper in full while a :class:`Recorder` notes what it did,
in order: the deferred-error check (``take``), each kernel launch (its compiled kernel, grid,
arguments and constexprs), and the raise-at-once. The record becomes a :class:`Plan`; a later call
with the same signature replays it with its own tensors' data pointers (on a GPU straight into
the compiled kernel's launcher, passing pointers as integers, so neither Triton's binder nor its
per-pointer driver query runs), or its own tensors (under the interpreter). A wrapper that raises
records nothing: bad metadata always goes through the wrapper, and a signature is only replayed
after the wrapper accepted it. Slot values are data, not signature: they are checked on the device
on every validating call, replayed or not.

A call is never replayed when: ``validate="sync"`` or ``KV_ORACLE_SYNC_ERRORS`` is on (those calls
synchronize anyway), a launch hook is installed (profilers read the metadata Triton builds), an
argument is a tensor subclass or unhashable, or the wrapper launched through a tensor it made
itself. :func:`clear` forgets every plan (the tuning scripts call it after changing a default).
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from .. import _deferred
from ..checked_index import CheckedIndex as _Checked

MAX_PLANS = 256  # per op; a full table is cleared (signatures rarely number more than a few)

_local = threading.local()
_tables: list = []  # every op's plan table, for clear()
_constants: list = []  # callables returning the tensors a plan may keep (mailboxes, verdict buffers)

# Plan outcome counters, for tests and the host-cost benchmark: built, replayed, unplannable
stats = {"built": 0, "replayed": 0, "unplannable": 0}


def clear() -> None:
    """Forget every plan (after changing a tuning default, so calls see the new one)."""
    for table in _tables:
        table.clear()


def keep_constants(source) -> None:
    """Register ``source()``, an iterable of long-lived tensors (mailboxes, verdict buffers) that a
    plan may hold on to instead of mapping them to an argument."""
    _constants.append(source)


class Unplannable(Exception):
    """The record cannot be replayed for another call (the wrapper used a tensor it made itself)."""


class Recorder:
    """What one wrapper call did, in order: ``("take", device_index)``, ``("launch", kernel, grid,
    args, meta, entry)`` (``entry``: the compiled launcher, or None under the interpreter), and
    ``("raise", device_index)``."""

    def __init__(self):
        self.events: list = []
        self.ok = True


def recorder() -> Recorder | None:
    """The recorder of the call being planned on this thread, if any."""
    return getattr(_local, "recorder", None)


def note(*event) -> None:
    """Record ``event`` if a call is being planned on this thread."""
    found = getattr(_local, "recorder", None)
    if found is not None:
        found.events.append(event)


def spoil() -> None:
    """Mark the call being planned as unreplayable (e.g. it launched with a hook installed)."""
    found = getattr(_local, "recorder", None)
    if found is not None:
        found.ok = False


_Tensor = torch.Tensor
_get_device = torch._C._cuda_getDevice if hasattr(torch._C, "_cuda_getDevice") else None


def _signature(args: tuple, kwargs: dict):
    """(key, tensors, pointers, current CUDA device or -1) of a call, or None where it cannot be
    planned. This runs on every call, so it reads each tensor's metadata once, with the cheapest
    accessors torch has (about 0.4 us per tensor)."""
    key = []
    add = key.append
    tensors = []
    pointers = []
    on = -2  # the first tensor's device index (-1: the CPU)
    for a in args:
        if type(a) is _Checked:  # a checked index: its copy and verdict are tensors of the call
            part_key, parts, part_pointers, d = a.signature
            key.extend(part_key)
            tensors.extend(parts)
            pointers.extend(part_pointers)
            if on == -2:
                on = d
            continue
        if type(a) is _Tensor:
            parts = (a,)
        elif isinstance(a, _Tensor):
            return None  # a subclass (a parameter, a fake tensor): not planned
        else:
            add(a)
            continue
        for t in parts:
            p = t.data_ptr()
            d = t.get_device()
            add((t.dtype, t.shape, t.stride(), d, p & 15))
            tensors.append(t)
            pointers.append(p)
            if on == -2:
                on = d
    if kwargs:
        for name, a in kwargs.items():
            if isinstance(a, _Tensor):
                return None  # tensors by keyword: rare; not planned
            add((name, a))
    if len(set(pointers)) != len(pointers):  # aliases: which argument shares whose pointer
        first: dict = {}
        add(tuple(first.setdefault(p, i) for i, p in enumerate(pointers)))
    device = -1
    if on >= 0:
        device = _get_device()
        add((torch._C._cuda_isCurrentStreamCapturing(), device, torch._C._cuda_getCurrentRawStream(device)))
    return tuple(key), tensors, pointers, device


class Plan:
    """A recorded call, replayable with another call's tensors of the same signature."""

    def __init__(self, events: list, tensors: list, pointers: list, device: int):
        constants = {t.data_ptr(): t for source in _constants for t in source()}
        where = {}
        for i, p in enumerate(pointers):
            where.setdefault(p, i)  # aliases map to the first argument holding the pointer
        self.steps = []
        for event in events:
            if event[0] != "launch":
                self.steps.append(event)
                continue
            _, kernel, grid, args, meta, entry = event
            slots = []  # (position in args, argument index, dtype view or None)
            fixed = list(args)
            for pos, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    continue
                p = a.data_ptr()
                j = where.get(p)
                if j is None:
                    if p in constants and constants[p] is a:
                        # compiled: as its address. Pinned host memory (the mailbox) has the same
                        # address on the device under unified addressing, as the CUDA writers
                        # also rely on
                        fixed[pos] = a if entry is None else p
                        continue
                    raise Unplannable(f"argument {pos} of {getattr(kernel, '__name__', kernel)} is a tensor "
                                      "the wrapper made")
                source = tensors[j]
                view = None if a.dtype == source.dtype else a.dtype
                if a.shape != source.shape or a.stride() != source.stride():
                    raise Unplannable(f"argument {pos} is a reshaped view of argument {j}")
                slots.append((pos, j, view))
                fixed[pos] = None  # filled per call: a plan must not keep the first call's tensors alive
            if entry is None:  # the interpreter: kernel[grid](*args, **meta) with tensors
                self.steps.append(("interpret", kernel, grid, fixed, slots, meta))
            else:
                # head: what the launcher takes between the grid and the arguments; tail: after them
                launch, head, tail = entry
                full = [grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                        *head, *fixed, *tail]
                offset = 3 + len(head)
                self.steps.append(("gpu", launch, full, tuple((offset + pos, j) for pos, j, _ in slots)))
        self.device = device

    def replay(self, tensors: list, pointers: list) -> None:
        for step in self.steps:
            kind = step[0]
            if kind == "gpu":
                _, launch, full, slots = step
                full = full.copy()  # the plan may be replayed by two threads at once
                for pos, j in slots:
                    full[pos] = pointers[j]
                launch(*full)
            elif kind == "take":
                _deferred.take(step[1])
            elif kind == "raise":
                _deferred.raise_at_once(step[1])
            else:
                _, kernel, grid, fixed, slots, meta = step
                args = list(fixed)
                for pos, j, view in slots:
                    args[pos] = tensors[j] if view is None else tensors[j].view(view)
                with np.errstate(all="ignore"):  # as _runtime.launch runs the interpreter
                    kernel[grid](*args, **meta)


def planned(enabled):
    """Decorate a writer wrapper: replay its plan for a known signature, else run it and plan.
    ``enabled()`` says whether plans may be used at all (e.g. no launch hook installed)."""

    def decorate(fn):
        table: dict = {}
        _tables.append(table)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            validate = kwargs.get("validate", True)
            if validate == "sync" or _deferred.SYNC or not enabled():
                return fn(*args, **kwargs)
            found = _signature(args, kwargs)
            if found is None:
                return fn(*args, **kwargs)
            key, tensors, pointers, device = found
            try:
                plan = table.get(key)
            except TypeError:  # an unhashable argument
                return fn(*args, **kwargs)
            if plan is not None:
                stats["replayed"] += 1
                plan.replay(tensors, pointers)
                return None
            rec = _local.recorder = Recorder()
            try:
                result = fn(*args, **kwargs)
            finally:
                _local.recorder = None
            if rec.ok and result is None:
                try:
                    new = Plan(rec.events, tensors, pointers, device)
                except Unplannable:
                    stats["unplannable"] += 1
                else:
                    if len(table) >= MAX_PLANS:
                        table.clear()
                    table[key] = new
                    stats["built"] += 1
            return result

        wrapper.plans = table
        return wrapper

    return decorate
