"""Our own kernels, grouped by backend, each registered through the public plug-in API
(``oracle.register``) exactly as a vendor's: ``torch_native`` (the baseline), ``cpu`` (C++),
``triton``, ``cuda``, and the SWA pool.

:func:`raise_deferred_errors` serves every GPU backend: it synchronizes and raises the error a
validating writer found on the device (see :mod:`oracle.kernels._deferred`);
:func:`check_index` checks a slot index once for many writes (:mod:`oracle.kernels.checked_index`);
a validating GPU writer does so by itself for an index tensor that torch sees unchanged
(:mod:`oracle.kernels.check_reuse`).
Importing this package imports no torch; calling it does.
"""


def raise_deferred_errors(device=None) -> None:
    """Synchronize ``device`` (default: every device a validating writer used) and raise, as a
    ``DeferredSlotError`` (a ValueError), the error an earlier call found on the device."""
    from ._deferred import raise_deferred_errors as raise_pending

    raise_pending(device)


def check_index(index, num_slots: int, *, padding: str = "none"):
    """Copy ``index`` and check it on its device once, for many writes: a ``CheckedIndex`` that
    the Triton and CUDA writers take in its place (see :mod:`oracle.kernels.checked_index`)."""
    from .checked_index import check_index as check

    return check(index, num_slots, padding=padding)


def __getattr__(name):
    if name == "DeferredSlotError":
        from ._deferred import DeferredSlotError

        return DeferredSlotError
    if name == "CheckedIndex":
        from .checked_index import CheckedIndex

        return CheckedIndex
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckedIndex", "DeferredSlotError", "check_index", "raise_deferred_errors"]
