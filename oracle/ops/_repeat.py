"""The calls a ``repeat`` case makes before the one it judges.

**In place** (``repeat``): the second call of a case, every input redrawn in place, the caches
left as the first call wrote them.

Serving engines call a writer again and again on the same tensors: the index, the sources and a
mapping are rewritten in place between steps, at the same addresses and of the same sizes. A kernel
that keeps state between calls (a translation memoized on ``mapping.data_ptr()``, a scale read to
the host once, an index checked once per address) is right on its first call and wrong on the
next. So a repeat case builds its inputs twice, from two seeds, with the same layout: the first
call runs on the first set; then every allocation that holds no cache takes the bytes of the
second set, the per-tensor and per-head scales are doubled (a redrawn scale of 1.0 or 0.0123 would
otherwise be the same), and the second call is judged. Under ``repeat="bad"`` the second set holds
an illegal slot (the op's ``out_of_range`` bad input), which a validating kernel must reject with
nothing written.

**After another variant** (``after="<param>=<value>"``): a kernel that keeps something made for
one call (a lookup table, a compiled variant, a launch plan) keyed without the fp8 or block
format, the strides or cache layout, or the source dtype writes the next call of another variant
as the first. Serving processes mix them (an fp8 KV cache beside bf16 activations, NVFP4 beside
MXFP8 layers, sources sliced from a fused projection beside contiguous ones). Such a
case makes three calls on fresh tensors: its own variant (the ordinary case), the variant named
by ``after`` (``fp8=e5m2``: the same case in e5m2), and its own variant again, each judged. The
first call passing and a later one failing is what an earlier call left behind
(:func:`oracle.diagnose.engine.explain` names it ``earlier_call_state``).

**Interior** (``repeat="interior"``): the second call's inputs redrawn as in place, but its index
is the first call's with the entries between its first and last in reverse order: the same
length, the same ends, the same slots. A kernel that memoizes the slot decomposition of an index
under a cheap fingerprint (its length and its ends, as "every layer of a step shares the index,
and steps differ at their ends") writes the second call's rows at the first call's slots.

**Rewrite** (``repeat="rewrite"``): the second call writes the same slots again, with what the
first call wrote changed only in places. A kernel that skips a write where the cache already holds
what it would write (a dirty check that saves bandwidth when a step is replayed, or a prefix cache
hit) must compare the bits of every element. Compared as floats, -0 and +0 are equal, so a zero
whose sign changed is never rewritten; compared over a prefix of the row, a row that changed only
at its end is kept stale. So every third element of each float source is a zero before the first
call, of alternating signs; between the calls each zero of the even rows (tokens) flips its sign,
and the odd rows change only in their last element, negated; the index, the scales and everything
else stay as they were.
"""

from __future__ import annotations

import numpy as np
import torch

from ..buffers import Arena
from ..contract import Contract
from .base import Case, OpSpec, Prepared

SECOND_SEED = 0x9E3779B9  # xored into the case's seed for the second set of inputs
SCALE_FACTOR = 2.0  # the scales of the second call: exact in float32, so only the scale changes


def first_call_inputs(case: Case, prepared: Prepared) -> None:
    """Change ``prepared``'s inputs, in place, into the first call's of a repeat case: for
    ``repeat="rewrite"``, every third element of each float source (in its logical order) a zero,
    +0 and -0 in turn; for the others nothing."""
    if case.p.get("repeat") != "rewrite":
        return
    for source in _float_sources(prepared):
        order = torch.arange(source.numel(), device=source.device).reshape(source.shape)
        source.masked_fill_(order % 3 == 0, 0.0)
        source.masked_fill_(order % 6 == 3, -0.0)


def _float_sources(prepared: Prepared) -> list:
    arena = prepared.arena
    return [arena.torch_view(view) for view in arena.views.values()
            if view.role == "source" and view.dtype in ("float32", "float16", "bfloat16")]


def _rewrite_in_place(prepared: Prepared) -> None:
    """The second call's inputs of a ``repeat="rewrite"`` case: in even rows (tokens) of every
    float source each zero with its sign flipped, in odd rows the last element negated."""
    for source in _float_sources(prepared):
        even = source[0::2]
        zero, negative = even == 0, torch.signbit(even)
        even.masked_fill_(zero & negative, 0.0)
        even.masked_fill_(zero & ~negative, -0.0)
        odd = source[1::2]
        odd[(slice(None),) + (-1,) * (source.dim() - 1)].neg_()


def redraw_in_place(spec: OpSpec, case: Case, prepared: Prepared, contract: Contract) -> None:
    """Give ``prepared`` the second call's inputs, in place (same tensors, same addresses), and
    record the memory as it was before the first call in ``prepared.earlier``. Raises
    RuntimeError where the spec builds the second set in another layout (a catalogue bug)."""
    arena = prepared.arena
    prepared.earlier = prepared.before
    if case.p.get("repeat") == "rewrite":
        _rewrite_in_place(prepared)
        return
    params = {k: v for k, v in case.p.items() if k != "repeat"}
    if case.p.get("repeat") == "bad":
        params["bad"] = "out_of_range"
    second_case = Case.make(case.op, case.cls, **params)
    seed = (case.seed ^ SECOND_SEED) & 0xFFFFFFFF
    second = Arena(arena.device, seed)
    spec.build(second_case, second, np.random.default_rng(seed), contract)
    if second.views != arena.views or {n: r.payload for n, r in second.regions.items()} != {
            n: r.payload for n, r in arena.regions.items()}:
        raise RuntimeError(f"{case.op} {case.id}: the second set of inputs has another layout")
    caches = {view.region for view in arena.views.values() if view.role == "cache"}
    for name, region in arena.regions.items():
        if name not in caches:
            region.tensor.copy_(second.regions[name].tensor)
    for view in arena.views.values():
        if view.role == "scale" and view.dtype == "float32":
            arena.torch_view(view).mul_(SCALE_FACTOR)
    if case.p.get("repeat") == "interior":
        _interior_reversed(prepared)


def _interior_reversed(prepared: Prepared) -> None:
    """Every index of a ``repeat="interior"`` case's second call: the first call's entries with
    those between the first and the last in reverse order (the same length, ends and slots)."""
    arena = prepared.arena
    for view in arena.views.values():
        if view.role == "index":
            entries = arena.numpy_view(prepared.earlier, view.name).copy()
            flat = entries.reshape(-1)
            flat[1:-1] = flat[1:-1][::-1].copy()
            arena.torch_view(view).copy_(torch.from_numpy(entries).to(arena.torch_view(view).device))


def calls_before(case: Case) -> tuple[Case, Case] | None:
    """The ordinary case and the other variant an ``after`` case calls before it (in that
    order), as ordinary cases of the same class; None for any other case."""
    after = case.p.get("after")
    if after is None:
        return None
    key, _, value = str(after).partition("=")
    if key == "shape":  # written as its case id writes it, 1x64
        value = tuple(int(n) for n in value.split("x"))
    own = {k: v for k, v in case.p.items() if k != "after"}
    return Case.make(case.op, case.cls, **own), Case.make(case.op, case.cls, **{**own, key: value})


__all__ = ["first_call_inputs", "redraw_in_place", "calls_before", "SCALE_FACTOR"]
