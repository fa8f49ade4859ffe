"""The torch modes a case is called in (its ``torch_mode`` parameter: the ``contexts`` class).

A serving engine runs its forward inside ``torch.inference_mode()``, and may compile it with
``torch.compile``; a writer that works when a test calls it plainly can fail either way. A case
whose ``torch_mode`` is ``"inference"`` builds its inputs and calls its kernel inside that mode; one
whose mode is ``"compile"`` calls its kernel through ``torch.compile``. The runner and a bundle's
replay both take the mode from here, so a failure replays as it failed.
"""

from __future__ import annotations

import torch

MODE_IDS = {"inference": "inference_mode", "compile": "torch_compile"}  # torch_mode -> its part of a case id
# torch.compile's backend for the "compile" mode: dynamo's capture and AOT autograd's
# functionalization (where an op that does not declare its mutation loses its write) without
# inductor's code generation, which would take seconds a case on the CPU and changes no write
COMPILE_BACKEND = "aot_eager"


def call_context(case):
    """The torch mode a case's inputs are made and its kernel called in: ``torch.inference_mode()``
    for ``torch_mode="inference"`` (every serving engine's forward runs in it: its tensors carry no
    version counter and no autograd state), else outside it, also where the caller is inside it (a
    probe of an inference-mode case runs the case again outside)."""
    return torch.inference_mode(case.p.get("torch_mode") == "inference")


def as_called(case, fn):
    """``fn`` as ``case`` calls it: for ``torch_mode="compile"`` through ``torch.compile`` (backend
    :data:`COMPILE_BACKEND`, static shapes, graph breaks allowed), as an engine that compiles its
    forward calls a writer; a repeat case's second call replays what the first compiled."""
    if case.p.get("torch_mode") != "compile":
        return fn
    return torch.compile(fn, backend=COMPILE_BACKEND, dynamic=False)


def fresh_compile(case) -> None:
    """Before a ``torch_mode="compile"`` case: forget what earlier cases compiled, so that this one
    compiles its own graph (and no recompilation limit sends it back to eager calls)."""
    if case.p.get("torch_mode") == "compile":
        torch.compiler.reset()


__all__ = ["MODE_IDS", "COMPILE_BACKEND", "call_context", "as_called", "fresh_compile"]
