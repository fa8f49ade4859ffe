"""Our own kernels, grouped by backend, each registered through the public plug-in API
(``oracle.register``) exactly as a vendor's: ``torch_native`` (the baseline), ``cpu`` (C++),
``triton``, ``cuda``, and the SWA pool.

:func:`raise_deferred_errors` serves every GPU backend: it synchronizes and raises the error a
validating writer found on the device (see :mod:`oracle.kernels._deferred`). Importing this
package imports no torch; calling it does.
"""


def raise_deferred_errors(device=None) -> None:
    """Synchronize ``device`` (default: every device a validating writer used) and raise, as a
    ``DeferredSlotError`` (a ValueError), the error an earlier call found on the device."""
    from ._deferred import raise_deferred_errors as raise_pending

    raise_pending(device)


def __getattr__(name):
    if name == "DeferredSlotError":
        from ._deferred import DeferredSlotError

        return DeferredSlotError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DeferredSlotError", "raise_deferred_errors"]
