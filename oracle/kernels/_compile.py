"""Our Python-launched writers under ``torch.compile``: opaque to dynamo, run as they run eagerly.

Dynamo traces a compiled function's Python frames on fake tensors. A Triton writer's host code
(launch plans replayed from raw pointers, a compiled kernel's own runner, the device check's
mailbox) cannot run on fake tensors, so each public Triton writer leaves the graph where it is
called: dynamo breaks the graph there and the writer runs eagerly, exactly as outside
torch.compile. (A ``fullgraph=True`` compile therefore refuses it.) Outside torch.compile the
guard costs one ``torch.compiler.is_compiling()`` call.

The CUDA writers need none of this: their ops are torch.library ops with fake implementations that
declare the caches they write, so dynamo puts them in the graph.
"""

from __future__ import annotations

import functools

import torch

_is_compiling = torch.compiler.is_compiling


def eager_under_compile(fn):
    """Decorate a public writer so that dynamo, tracing a call of it, breaks the graph and runs it
    eagerly (``torch.compiler.disable``); called eagerly it runs as it is."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _is_compiling():
            return eager(*args, **kwargs)
        return fn(*args, **kwargs)

    eager = torch.compiler.disable(fn, recursive=True)
    return wrapper


__all__ = ["eager_under_compile"]
