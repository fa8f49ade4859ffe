"""Errors that a GPU writer finds on the device and the host raises later, without synchronizing.

A validating writer must reject a call whose index holds an illegal slot, and write nothing for
it. Reading the index on the host to find out costs a synchronization (tens of microseconds, and a
CUDA graph cannot capture it). So our GPU writers check their slots on the device instead: a check
decides, before any store, whether every slot of the call is legal; if one is not, no program of
the call stores anything, and one program writes the error into this module's **mailbox**, a few
words of pinned host memory per device that the GPU writes directly (zero-copy).

The host raises what the mailbox holds, as a :class:`DeferredSlotError` (a ``ValueError`` naming
the argument, the entry and its value, in the reference's own words):

- at the start of the next validating call on that device (reading host memory: no
  synchronization), or
- when the caller asks: :func:`raise_deferred_errors` synchronizes the device and raises; this is
  "the next synchronization" of the contract field ``errors="deferred"``, and the conformance
  suite calls it after every call of such a kernel;
- at once, where the caller asks for it: ``validate="sync"`` on one call, or the environment
  variable ``KV_ORACLE_SYNC_ERRORS=1`` (read at import; :func:`set_sync` at run time) for every
  call (each validating call then synchronizes its stream after the launch, as a host-side check
  would).

Nothing here uses a device-side assert: the CUDA context stays usable after an error.

Mailbox layout (int64 words): ``[0]`` error kind (0: none; :data:`SLOT`: a slot out of range;
:data:`SCALE`: a per-tensor scale that is not a finite float32 > 0). For a slot: ``[1]`` the
entry (position in the index), ``[2]`` its value, ``[3]`` the number of slots, ``[4]`` the
argument code (:data:`ARGUMENTS`), ``[5]`` the padding code (:data:`PADDINGS`), ``[6]`` the
reserved slot of ``reserved:K``. For a scale: ``[1]`` the argument code (:data:`SCALE_ARGUMENTS`),
``[2]`` the float32 bits of its value, ``[3]`` its element, ``[4]`` the scale's length (0 or 1:
a per-tensor scale). A kernel writes the other words before word 0.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

WORDS = 8
SLOT = 1  # error kind: an index entry outside the slots its padding policy allows
SCALE = 2  # error kind: a per-tensor scale that is not a finite float32 > 0
ARGUMENTS = ("loc", "slot_mapping")  # argument code -> the argument's name in the op's signature
# scale code -> its name (the CUDA kernels use 3 and 4: kScaleArgumentK, kScaleArgumentV in kv_cuda.h)
SCALE_ARGUMENTS = ("global_scale", "k_global_scale", "v_global_scale", "k_scale", "v_scale", "scale")
PADDINGS = ("none", "negative", "reserved")  # padding code -> policy kind

SYNC_ENV = "KV_ORACLE_SYNC_ERRORS"


class DeferredSlotError(ValueError):
    """A slot (or a per-tensor scale) a writer found illegal on the device; nothing of that call
    was written."""


def sync_by_default() -> bool:
    """Whether ``KV_ORACLE_SYNC_ERRORS`` asks every validating call to raise at once."""
    return os.environ.get(SYNC_ENV, "").strip().lower() in ("1", "true", "on", "yes")


# Read once, when this module is imported (a per-call environment lookup costs microseconds of a
# decode step); set_sync() changes it for the process.
SYNC = sync_by_default()


def set_sync(flag: bool) -> None:
    """Make every validating call raise at once (True) or defer its error (False)."""
    global SYNC
    SYNC = bool(flag)


_lock = threading.Lock()
_boxes: dict = {}  # device index (-1: the CPU, for the Triton interpreter) -> (tensor, numpy view)


def mailbox(device: torch.device) -> torch.Tensor:
    """The mailbox of ``device``: int64[WORDS], pinned host memory the GPU can write (a plain CPU
    tensor for the CPU), zeroed, allocated once per device and kept for the process."""
    index = device.index if device.type == "cuda" else -1
    if index is None:
        index = torch.cuda.current_device()
    found = _boxes.get(index)
    if found is None:
        with _lock:
            found = _boxes.get(index)
            if found is None:
                box = torch.zeros(WORDS, dtype=torch.int64, pin_memory=index >= 0)
                found = _boxes[index] = (box, box.numpy())
    return found[0]


def mailboxes() -> list:
    """Every mailbox allocated so far (they live as long as the process)."""
    return [box for box, _ in list(_boxes.values())]


def sync_requested(validate) -> bool:
    """Whether a validating call raises its own error at once: ``validate="sync"`` or
    :data:`SYNC`. Every other value but True (and False, which checks nothing) is an error."""
    if validate is not True and validate != "sync":
        raise ValueError(f"validate={validate!r} is not True, False or 'sync'")
    return validate == "sync" or SYNC


def raise_at_once(device_index: int) -> None:
    """Synchronize the current stream of ``device_index`` (-1: the CPU, nothing to wait for) and
    raise what the mailbox holds: the call just launched, checked as a host-side check would."""
    if device_index >= 0:
        torch.cuda.current_stream(device_index).synchronize()
    take(device_index)


def message(words) -> str:
    """The error a mailbox holds, in the reference's words (oracle.reference.slots)."""
    kind, row, value, num_slots, argument, padding, reserved = (int(w) for w in words[:7])
    if kind == SCALE:
        code, bits, element, length = row, value, num_slots, argument  # a scale's words
        name = SCALE_ARGUMENTS[code] if 0 <= code < len(SCALE_ARGUMENTS) else f"scale {code}"
        if length > 1:  # a per-head scale: name its element
            name = f"{name}[{element}]"
        number = float(np.array([bits & 0xFFFFFFFF], np.uint32).view(np.float32)[0])
        return (f"{name} = {number!r} must be a finite float32 > 0; found on the device, nothing of "
                "that call was written")
    name = ARGUMENTS[argument] if 0 <= argument < len(ARGUMENTS) else f"argument {argument}"
    kind = PADDINGS[padding] if 0 <= padding < len(PADDINGS) else "none"
    policy = f"reserved:{reserved}" if kind == "reserved" else kind
    return (f"{name}[{row}] = {value} is out of range [0, {num_slots}) under padding='{policy}'; "
            "found on the device, nothing of that call was written")


def take(device_index: int) -> None:
    """Raise and clear the error the mailbox of ``device_index`` holds, if the GPU has written one
    (reads host memory only: never synchronizes)."""
    found = _boxes.get(device_index)
    if found is None or not found[1][0]:
        return
    words = found[1].copy()
    found[1][:] = 0
    raise DeferredSlotError(message(words))


def raise_deferred_errors(device=None) -> None:
    """Synchronize ``device`` (default: every device with a mailbox) and raise the error any
    earlier validating call left there, clearing it. The contract's ``raise_deferred`` for our
    GPU writers."""
    if device is None:
        indices = sorted(_boxes)
    else:
        device = torch.device(device)
        indices = [device.index if device.type == "cuda" and device.index is not None
                   else (torch.cuda.current_device() if device.type == "cuda" else -1)]
    for index in indices:
        if index >= 0:
            torch.cuda.synchronize(index)
        take(index)

