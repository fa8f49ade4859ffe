"""Hypotheses for the second call of a ``repeat`` case: the kernel read the first call's inputs
(state kept between calls, keyed on a tensor's address, shape or fingerprint)."""

from __future__ import annotations

from .hypothesis import Hypothesis


STALE_ROLES = ("source", "index", "scale")


def stale_hypotheses(prepared) -> list[Hypothesis]:
    """For the second call of a ``repeat`` case (``prepared.earlier`` set): the kernel read the
    first call's values of an input instead of its own (a translation or a scale memoized on the
    tensor's address, a copy of the index kept from the first call): each input alone, each role's
    inputs together (K's and V's scales), and all of them at once."""
    if prepared.earlier is None:
        return []
    arena = prepared.arena
    stale, kept_ends = {}, {}
    for view in arena.views.values():
        if view.role in STALE_ROLES:
            old, now = arena.numpy_view(prepared.earlier, view.name).copy(), prepared.numpy(view.name)
            if old.tobytes() != now.tobytes():
                stale[view.name] = old
                if view.role == "index" and old.size > 2 and old.flat[0] == now.flat[0] and old.flat[-1] == now.flat[-1]:
                    kept_ends[view.name] = (f"; {view.name} has the first call's length and first and last entries, "
                                            "so a memo keyed on those (a fingerprint of the index) takes it for the "
                                            "same index")
    groups = [(name,) for name in stale]
    for role in STALE_ROLES:  # e.g. K's and V's scales memoized together
        names = tuple(name for name in stale if arena.views[name].role == role)
        if len(names) > 1:
            groups.append(names)
    if len(stale) > 1:
        groups.append(tuple(stale))
    return [Hypothesis("stale_state", f"the second call read the first call's {' and '.join(names)}, "
                       "redrawn in place since (same address, same size): state kept between calls, "
                       "as a memo keyed on a tensor's address, shape or first use"
                       + next((kept_ends[name] for name in names if name in kept_ends), ""),
                       inputs={name: lambda a, old=stale[name]: old for name in names})
            for names in dict.fromkeys(groups)]
