"""Probes: hypotheses checked by running the kernel once more on a changed input, for bugs whose
result the reference cannot replay (a write far outside every allocation, an exception).

A probe changes one thing in a fresh build of the same case and expects the kernel to pass it;
if it does, the change names the cause. Only after a failure that no replayed hypothesis explains.
"""

from __future__ import annotations

import numpy as np

from ..buffers import to_torch
from ..reference.slots import Padding
from .hypothesis import GRID_DIMENSION_MAX, Hypothesis, by_role


def _rewrite_index(transform):
    """An edit of a fresh build: every index view's entries through ``transform``."""
    def edit(prepared) -> None:
        for view in by_role(prepared.arena.views, "index"):
            entries = prepared.arena.numpy_view(prepared.arena.snapshot(), view.name)
            tensor = prepared.arena.torch_view(view)
            tensor.copy_(to_torch(transform(np.array(entries))).to(tensor.device))
    return edit


def probes(case, contract, prepared) -> list[tuple[Hypothesis, object]]:
    """(hypothesis, edit) pairs that apply to this case."""
    out = []
    if Padding.parse(contract.padding).kind == "negative":
        entries = [prepared.numpy(v.name) for v in by_role(prepared.arena.views, "index")]
        if any(((e < -1)).any() for e in entries):
            out.append((Hypothesis("only_minus_one_padding", "only -1 treated as padding: with every "
                                   "negative padding entry replaced by -1 the kernel passes, so other "
                                   "negatives (-2, -(S+1), the index dtype's minimum) are written or "
                                   "rejected"), _rewrite_index(lambda a: np.where(a < 0, -1, a).astype(a.dtype))))
    if case.p.get("large") and contract.dcp_world == 1:
        out.append((Hypothesis("int32_offsets", "offsets past 2^31 elements wrap: the same case with its rows "
                               "past 2^31 elements moved below it passes"),
                    _rewrite_index(lambda a, unit=_large_unit(case, prepared): _below_2_31(a, unit))))
    return out


def _large_unit(case, prepared) -> int:
    """Slots per unit (row, or block when paged) of a large case's caches."""
    from ..ops import SPECS  # here: the op specs import the diagnosis

    cache = prepared.arena.views[prepared.caches[0]]
    return cache.shape[1] if SPECS[case.op].paged else 1


def _below_2_31(entries: np.ndarray, unit: int) -> np.ndarray:
    """A large case's entries with those in units past 2**31 elements (the upper half) moved to
    units of the lower half that no entry writes, each at the same place in its unit."""
    from ..ops._build import LARGE_UNITS  # here: the op specs import the diagnosis

    units = np.where(entries >= 0, entries // unit, -1)
    used = set(units.tolist())
    free = [u for u in range(1, LARGE_UNITS // 2) if u not in used]
    out = entries.copy()
    for i in np.flatnonzero(units >= LARGE_UNITS // 2):
        out[i] = free.pop() * unit + entries[i] % unit
    return out


SMALLER_N = 4099  # a case past GRID_DIMENSION_MAX tokens is run again at this N (the catalogue's largest)

# A case parameter whose removal makes a failing kernel pass, and the cause that names.
VARIANTS = (
    ("index_layout", "strided", "index_stride_ignored", "the index's stride is ignored: the same case "
     "with a contiguous index passes"),
    ("index_layout", "offset", "index_offset_ignored", "the index's storage offset is ignored: the same "
     "case with the index at offset 0 passes"),
    ("src", "fused", "source_stride_ignored", "the sources' row stride is ignored: the same case with "
     "packed sources passes"),
    ("src", "longer", "rows_past_index", "sources longer than the index are mishandled (rows past the "
     "index read or written): the same case with as many source rows as index entries passes"),
    ("cache", None, "cache_layout_ignored", "the caches' strides or storage offset are not honoured: the "
     "same case with plain caches passes"),
    ("layout", "HND", "dense_cache_assumed", "HND caches are not honoured: the same case in NHD passes"),
    ("padding", None, "padding_policy", "padding entries are not skipped as the contract declares: the "
     "same case without padding entries passes"),
    ("torch_mode", "inference", "inference_mode_unsupported", "the kernel fails only under "
     "torch.inference_mode(), where every serving engine calls it: the same case run outside it passes "
     "(a tensor's version counter read, which inference tensors lack; a check or memo kept across calls "
     "and keyed on it; a tensor made under inference mode on an earlier call changed in place outside it)"),
    ("torch_mode", "compile", "compile_unsupported", "the kernel fails only when called through "
     "torch.compile: the same case called eagerly passes (a value read while tracing baked into the "
     "graph, an op without a fake implementation, a write its op does not declare)"),
    ("dcp", True, "dcp_modulo", "the negative locs legal under the declared DCP modulo are mishandled "
     "(the other modulo): the same case without them passes"),
    # after the probe that moves the rows below 2**31 elements: where that fails too, what the
    # kernel mishandles is the large case's layout, not its offsets
    ("large", True, "cache_layout_ignored", "the large case's caches are mishandled below 2^31 elements too "
     "(rows 2^26 elements apart in one allocation shared by the caches, one cache 2^25 elements past the "
     "other): the same rows in a small cache pass"),
)


def variants(case) -> list[tuple[Hypothesis, object]]:
    """(hypothesis, case) pairs: the case without one of its layout or padding parameters."""
    from ..ops.base import Case

    params = case.p
    out = []
    if params.get("n", 0) > GRID_DIMENSION_MAX:
        out.append((Hypothesis("token_count_limit", f"more than {GRID_DIMENSION_MAX} tokens mishandled: the same "
                               f"case at N = {SMALLER_N} passes (the tokens on a launch grid's y or z dimension, "
                               f"which holds {GRID_DIMENSION_MAX}, or a token count kept in 16 bits)"),
                    Case.make(case.op, case.cls, **dict(params, n=SMALLER_N))))
    for key, value, cause, text in VARIANTS:
        if key in params and (value is None or params[key] == value):
            rest = {k: v for k, v in params.items() if k != key}
            if key == "large":
                rest.pop("n", None)
            out.append((Hypothesis(cause, text), Case.make(case.op, case.cls, **rest)))
    return out


def outside_mode(case):
    """The case run outside its torch mode (oracle.ops._modes), or None where it has none."""
    from ..ops.base import Case

    if "torch_mode" not in case.p:
        return None
    return Case.make(case.op, case.cls, **{k: v for k, v in case.p.items() if k != "torch_mode"})


__all__ = ["outside_mode", "probes", "variants"]
