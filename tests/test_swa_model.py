"""SwaAllocatorModel: hand-computed scenarios, rejected operations, each invariant made to fail,
and a hypothesis state machine checked against the test's own bookkeeping.

Expected mappings below are written out by hand from the documented contract (lowest free page
first, page 0 reserved, slot-by-slot mapping, page-granular clearing), not produced by the model.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from oracle.reference.swa_model import SwaAllocatorModel


def arr(*values, dtype=np.int64):
    return np.array(values, dtype=dtype)


def snapshot(m: SwaAllocatorModel):
    return (m.mapping.tobytes(), m.live_full_slots.tolist(), m.available_full, m.available_swa,
            m._full_alloc.tobytes(), m._swa_alloc.tobytes())


def has(problems: list, fragment: str) -> bool:
    return any(fragment in p for p in problems)


# ------------------------------------------------------------------ hand scenarios, page_size 1

def test_page_size_1_scenario():
    m = SwaAllocatorModel(size_full=4, size_swa=3, page_size=1)
    assert m.mapping.tolist() == [0, 0, 0, 0, 0, -1]
    assert (m.available_full, m.available_swa) == (4, 3)

    a = m.alloc(2)
    assert a.tolist() == [1, 2] and a.dtype == np.int64
    assert m.mapping.tolist() == [0, 1, 2, 0, 0, -1]

    before = snapshot(m)
    assert m.alloc(2) is None  # full has 2 pages left, swa only 1: exhausted, nothing changes
    assert snapshot(m) == before

    b = m.alloc(1)
    assert b.tolist() == [3]
    assert m.mapping.tolist() == [0, 1, 2, 3, 0, -1]
    assert (m.available_full, m.available_swa) == (1, 0)
    assert m.alloc_extend(-1, 1) is None  # swa exhausted

    m.free_swa(arr(1))  # token 1 slid out of the window
    assert m.mapping.tolist() == [0, 0, 2, 3, 0, -1]
    assert (m.available_full, m.available_swa) == (1, 1)
    assert m.live_full_slots.tolist() == [1, 2, 3]

    c = m.alloc_extend(3, 1)  # page_size 1: no room on last_loc's page, one new page each
    assert c.tolist() == [4]
    assert m.mapping.tolist() == [0, 0, 2, 3, 1, -1]  # swa slot 1 reused (lowest free)

    m.free(arr(2, 1))  # 1 already lost its swa page: only full freed there; 2 frees both
    assert m.mapping.tolist() == [0, 0, 0, 3, 1, -1]
    assert (m.available_full, m.available_swa) == (2, 1)
    assert m.live_full_slots.tolist() == [3, 4]
    assert m.translate(arr(3, 4, 1, -1)).tolist() == [3, 1, 0, -1]
    assert m.check_invariants() == []

    m.clear()
    assert m.mapping.tolist() == [0, 0, 0, 0, 0, -1]
    assert (m.available_full, m.available_swa) == (4, 3)
    assert m.live_full_slots.tolist() == []
    assert m.translate(arr(-1)).tolist() == [-1]


# ------------------------------------------------------------------ hand scenarios, page_size 4

def test_page_size_4_scenario():
    # full pages 1..4 (slots 4..19), swa pages 1..3 (slots 4..15); table length 16 + 4 + 1
    m = SwaAllocatorModel(size_full=16, size_swa=12, page_size=4)
    z = [0] * 4

    a = m.alloc(4)
    assert a.tolist() == [4, 5, 6, 7]
    assert m.mapping.tolist() == z + [4, 5, 6, 7] + z + z + z + [-1]

    m.free_swa(a[2:3])  # one slot names the page: the whole page is cleared, full page kept
    assert m.mapping.tolist() == z + z + z + z + z + [-1]
    assert m.live_full_slots.tolist() == [4, 5, 6, 7]
    assert (m.available_full, m.available_swa) == (12, 12)

    b = m.alloc_extend(-1, 6)  # no prefix: -1 goes through the sentinel; full pages 2, 3,
    assert b.tolist() == [8, 9, 10, 11, 12, 13]  # swa pages 1, 2 (lowest free)
    assert m.mapping.tolist() == z + z + [4, 5, 6, 7] + [8, 9, 0, 0] + z + [-1]

    c = m.alloc_extend(13, 3)  # mid-page: 14, 15 continue swa 10, 11, then full 4 / swa 3
    assert c.tolist() == [14, 15, 16]
    assert m.mapping.tolist() == z + z + [4, 5, 6, 7] + [8, 9, 10, 11] + [12, 0, 0, 0] + [-1]
    assert (m.available_full, m.available_swa) == (0, 0)

    before = snapshot(m)
    assert m.alloc_extend(16, 4) is None  # 3 fit on the page, the 4th needs a page: none left
    assert snapshot(m) == before

    d = m.alloc_extend(16, 3)  # fits in the rest of the page: no new pages
    assert d.tolist() == [17, 18, 19]
    assert m.mapping.tolist() == z + z + [4, 5, 6, 7] + [8, 9, 10, 11] + [12, 13, 14, 15] + [-1]

    m.free(a)  # after free_swa: only the full page is left to free
    assert m.mapping.tolist() == z + z + [4, 5, 6, 7] + [8, 9, 10, 11] + [12, 13, 14, 15] + [-1]
    assert (m.available_full, m.available_swa) == (4, 0)

    m.free_swa(arr(9))
    assert m.mapping.tolist() == z + z + z + [8, 9, 10, 11] + [12, 13, 14, 15] + [-1]
    assert (m.available_full, m.available_swa) == (4, 4)

    e = m.alloc(4)  # full page 1, swa page 1
    assert e.tolist() == [4, 5, 6, 7]
    assert m.translate(e).tolist() == [4, 5, 6, 7]
    assert m.translate(arr(8, 12, 16, 19, -1)).tolist() == [0, 8, 12, 15, -1]
    assert m.check_invariants() == []

    m.clear()
    assert m.mapping.tolist() == [0] * 20 + [-1]
    assert (m.available_full, m.available_swa) == (16, 12)


def test_alloc_extend_from_mid_page_with_non_identity_swa():
    m = SwaAllocatorModel(size_full=12, size_swa=12, page_size=4)
    m.alloc(4)  # full 4..7 -> swa 4..7
    m.free_swa(arr(4))  # swa page 1 free again, full page 1 kept
    m.alloc(4)  # full 8..11 -> swa 4..7
    r = m.alloc_extend(-1, 2)  # full 12, 13 -> swa 8, 9; 14, 15 unmapped
    assert r.tolist() == [12, 13] and m.translate(r).tolist() == [8, 9]
    s = m.alloc_extend(13, 1)
    assert s.tolist() == [14] and m.translate(s).tolist() == [10]
    assert m.mapping.tolist() == [0] * 8 + [4, 5, 6, 7] + [8, 9, 10, 0] + [-1]
    assert m.check_invariants() == []


def test_alloc_zero_tokens():
    m = SwaAllocatorModel(8, 8, 2)
    before = snapshot(m)
    assert m.alloc(0).tolist() == []
    assert m.alloc_extend(-1, 0).tolist() == []
    assert snapshot(m) == before


def test_two_models_driven_identically_agree():
    ops = [("alloc", 4), ("alloc_extend", -1, 3), ("free_swa", 4), ("alloc", 2), ("free", 8),
           ("alloc_extend", -1, 5)]
    models = [SwaAllocatorModel(16, 12, 2), SwaAllocatorModel(16, 12, 2)]
    for op in ops:
        results = []
        for m in models:
            if op[0] in ("free", "free_swa"):
                results.append(getattr(m, op[0])(arr(op[1])))
            else:
                results.append(getattr(m, op[0])(*op[1:]))
        assert [None if r is None else r.tolist() for r in results][0] == \
               [None if r is None else r.tolist() for r in results][1]
        assert models[0].mapping.tolist() == models[1].mapping.tolist()


def test_mapping_property_is_a_copy():
    m = SwaAllocatorModel(4, 4, 1)
    m.alloc(1)
    view = m.mapping
    view[1] = 99
    assert m.mapping[1] == 1
    slots = m.live_full_slots
    slots[:] = 0
    assert m.live_full_slots.tolist() == [1]


# ------------------------------------------------------------------ rejected operations

@pytest.mark.parametrize("args,exc,pattern", [
    ((0, 4, 1), ValueError, r"size_full=0"),
    ((4, 0, 1), ValueError, r"size_swa=0"),
    ((4, 4, 0), ValueError, r"page_size=0"),
    ((6, 8, 4), ValueError, r"size_full=6 is not a multiple of page_size=4"),
    ((8, 6, 4), ValueError, r"size_swa=6 is not a multiple of page_size=4"),
    ((4.0, 4, 1), TypeError, r"size_full"),
    ((4, "4", 1), TypeError, r"size_swa"),
    ((4, 4, True), TypeError, r"page_size"),
])
def test_constructor_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        SwaAllocatorModel(*args)


def _model_with_state():
    """page_size 2; request A = full 2..5 (pages 1, 2), request B = full 6 (page 3), 7 unmapped;
    A's first page has released its swa page."""
    m = SwaAllocatorModel(size_full=10, size_swa=8, page_size=2)
    m.alloc(4)
    m.alloc_extend(-1, 1)
    m.free_swa(arr(2))
    assert m.mapping.tolist() == [0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0, -1]
    assert m.check_invariants() == []
    return m


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda m: m.alloc(1.0), TypeError, r"^n must be an int"),
    (lambda m: m.alloc(-2), ValueError, r"^n=-2"),
    (lambda m: m.alloc(3), ValueError, r"^n=3 is not a multiple of page_size=2"),
    (lambda m: m.alloc(None), TypeError, r"^n must be an int"),
    (lambda m: m.alloc_extend("6", 1), TypeError, r"^last_loc must be an int"),
    (lambda m: m.alloc_extend(6.0, 1), TypeError, r"^last_loc must be an int"),
    (lambda m: m.alloc_extend(-2, 1), ValueError, r"^last_loc=-2: neither -1 nor a full slot"),
    (lambda m: m.alloc_extend(1, 1), ValueError, r"^last_loc=1: neither -1 nor a full slot"),
    (lambda m: m.alloc_extend(12, 1), ValueError, r"^last_loc=12: neither -1 nor a full slot"),
    (lambda m: m.alloc_extend(8, 1), ValueError, r"^last_loc=8: full page 4 is not allocated"),
    (lambda m: m.alloc_extend(3, 1), ValueError, r"^last_loc=3 translates to 0"),
    (lambda m: m.alloc_extend(7, 1), ValueError, r"^last_loc=7 translates to 0"),
    (lambda m: m.alloc_extend(4, 1), ValueError,
     r"^last_loc=4 is not the last written slot of its page: mapping\[5\] = 5"),
    (lambda m: m.alloc_extend(6, -1), ValueError, r"^n=-1"),
    (lambda m: m.alloc_extend(6, 1.5), TypeError, r"^n must be an int"),
    (lambda m: m.free([4]), TypeError, r"^full_slots must be a numpy array, got list"),
    (lambda m: m.free(arr(4.0, dtype=np.float64)), TypeError, r"^full_slots has dtype float64"),
    (lambda m: m.free(arr(4, dtype=np.uint32)), TypeError, r"^full_slots has dtype uint32"),
    (lambda m: m.free(np.array([[4]])), ValueError, r"^full_slots must be 1-D"),
    (lambda m: m.free(arr(4, -1)), ValueError, r"^full_slots\[1\] = -1: not a full slot"),
    (lambda m: m.free(arr(1)), ValueError, r"^full_slots\[0\] = 1: not a full slot"),
    (lambda m: m.free(arr(12)), ValueError, r"^full_slots\[0\] = 12: not a full slot"),
    (lambda m: m.free(arr(4, 9)), ValueError, r"^full_slots\[1\] = 9: full page 4 is not alloc"),
    (lambda m: m.free_swa([4]), TypeError, r"^full_slots must be a numpy array"),
    (lambda m: m.free_swa(arr(10)), ValueError, r"^full_slots\[0\] = 10: full page 5 is not"),
    (lambda m: m.free_swa(arr(4, 3)), ValueError, r"^full_slots: full page 1 \(slots 2\.\.3\) "
                                                  r"has no SWA page"),
    (lambda m: m.set_full_to_swa_mapping([1], arr(1)), TypeError, r"^full must be a numpy"),
    (lambda m: m.set_full_to_swa_mapping(arr(1), [1]), TypeError, r"^swa must be a numpy"),
    (lambda m: m.set_full_to_swa_mapping(arr(1.0, dtype=float), arr(1)), TypeError,
     r"^full has dtype float64"),
    (lambda m: m.set_full_to_swa_mapping(arr(1, 2), arr(1)), ValueError, r"^swa has shape"),
    (lambda m: m.set_full_to_swa_mapping(arr(12), arr(2)), ValueError,
     r"^full\[0\] = 12: outside the table \[0, 12\)"),
    (lambda m: m.set_full_to_swa_mapping(arr(-1), arr(2)), ValueError, r"^full\[0\] = -1"),
    (lambda m: m.set_full_to_swa_mapping(arr(8), arr(10)), ValueError,
     r"^swa\[0\] = 10: not an SWA slot; SWA slots are \[0, 10\)"),
    (lambda m: m.set_full_to_swa_mapping(arr(8, 9), arr(4, -3)), ValueError, r"^swa\[1\] = -3"),
    (lambda m: m.set_full_to_swa_mapping(arr(8, 9, 8), arr(2, 3, 2)), ValueError,
     r"^full\[2\] = 8: duplicate full slot"),
    (lambda m: m.translate([4]), TypeError, r"^loc must be a numpy array"),
    (lambda m: m.translate(arr(-2)), ValueError, r"^loc\[0\] = -2: only -1"),
    (lambda m: m.translate(arr(4, 12)), ValueError, r"^loc\[1\] = 12: past the table"),
])
def test_rejected_operations_name_the_argument_and_change_nothing(call, exc, pattern):
    m = _model_with_state()
    before = snapshot(m)
    with pytest.raises(exc, match=pattern):
        call(m)
    assert snapshot(m) == before


def test_free_is_atomic_when_a_later_slot_is_bad():
    m = _model_with_state()
    before = snapshot(m)
    with pytest.raises(ValueError, match=r"full_slots\[2\] = 8"):
        m.free(arr(4, 6, 8))  # pages 2 and 3 are fine, page 4 is not: nothing is freed
    assert snapshot(m) == before


def test_double_free_and_double_free_swa():
    m = _model_with_state()
    m.free(arr(6))
    with pytest.raises(ValueError, match=r"full_slots\[0\] = 6: full page 3 is not allocated"):
        m.free(arr(6))
    m.free_swa(arr(5))
    with pytest.raises(ValueError, match=r"full page 2 \(slots 4\.\.5\) has no SWA page"):
        m.free_swa(arr(4))
    m.free(arr(2, 3, 4, 5))  # both pages, no SWA left: full pages freed
    assert m.mapping.tolist() == [0] * 12 + [-1]
    assert (m.available_full, m.available_swa) == (10, 8)


def test_operations_refuse_a_corrupt_mapping():
    m = SwaAllocatorModel(8, 8, 2)
    m.alloc(2)  # full 2, 3 -> swa 2, 3
    m.set_full_to_swa_mapping(arr(3), arr(7))  # page 1 now reaches swa pages 1 and 3
    before = snapshot(m)
    for call in (lambda: m.free(arr(2)), lambda: m.free_swa(arr(2))):
        with pytest.raises(ValueError, match=r"full page 1 maps to \[2, 7\].*corrupt"):
            call()
        assert snapshot(m) == before
    m2 = SwaAllocatorModel(8, 8, 2)
    m2.alloc_extend(-1, 1)  # full 2 -> swa 2
    m2.set_full_to_swa_mapping(arr(2), arr(3))  # right page, wrong offset
    with pytest.raises(ValueError, match=r"last_loc=2 maps to SWA slot 3 at another page offset"):
        m2.alloc_extend(2, 1)


# ------------------------------------------------------------------ each invariant can fail

def _healthy(page_size=2):
    m = SwaAllocatorModel(size_full=8, size_swa=8, page_size=page_size)
    m.alloc(2 * page_size)
    assert m.check_invariants() == []
    return m


def test_invariant_sentinel():
    m = copy.deepcopy(_healthy())
    m._mapping[-1] = 0
    assert has(m.check_invariants(), "sentinel broken: mapping[10] = 0")


def test_invariant_mapping_dtype_and_length():
    m = copy.deepcopy(_healthy())
    m._mapping = m._mapping.astype(np.int32)
    assert has(m.check_invariants(), "mapping has dtype int32")
    m._mapping = np.zeros(5, dtype=np.int64)
    assert has(m.check_invariants(), "expected int64 (11,)")


def test_invariant_slot_zero():
    m = _healthy()
    m.set_full_to_swa_mapping(arr(0), arr(0))
    assert m.check_invariants() == []  # writing 0 to slot 0 is harmless
    m.set_full_to_swa_mapping(arr(0), arr(6))
    assert has(m.check_invariants(), "slot 0 (padding) maps to 6, not 0")


def test_invariant_freed_full_slots_map_to_zero():
    m = _healthy()
    m.free(arr(4))  # full page 2 freed
    assert m.check_invariants() == []
    m.set_full_to_swa_mapping(arr(5), arr(5))
    assert has(m.check_invariants(), "full slots outside allocated pages map to nonzero: {5: 5}")
    m2 = _healthy()
    m2.set_full_to_swa_mapping(arr(8), arr(7))  # page 4, never allocated
    assert has(m2.check_invariants(), "{8: 7}")


def test_invariant_entries_point_into_allocated_swa_pages():
    m = _healthy()  # swa pages 1, 2 allocated; 3, 4 free
    m.set_full_to_swa_mapping(arr(2, 3), arr(6, 7))  # full page 1 -> swa page 3 (free)
    problems = m.check_invariants()
    assert has(problems, "entries point outside allocated SWA pages: {2: 6, 3: 7}")
    m2 = copy.deepcopy(_healthy())
    m2._mapping[3] = -3  # direct: negative entry in the table proper
    assert has(m2.check_invariants(), "entries point outside allocated SWA pages: {3: -3}")


def test_invariant_no_swa_slot_from_two_live_full_slots():
    m = _healthy(page_size=1)  # full 1, 2 -> swa 1, 2
    m.set_full_to_swa_mapping(arr(2), arr(1))
    assert has(m.check_invariants(), "SWA slot 1 is mapped from several live full slots: [1, 2]")


def test_invariant_page_offsets():
    m = _healthy()  # full 2, 3 -> swa 2, 3
    m.set_full_to_swa_mapping(arr(2, 3), arr(3, 2))  # same page, swapped: no duplicate
    problems = m.check_invariants()
    assert has(problems, "full slot 2 (offset 0) maps to SWA slot 3 (offset 1)")
    assert not has(problems, "several live full slots")


def test_invariant_one_swa_page_per_full_page_and_no_sharing():
    m = _healthy()  # full 2,3 -> swa 2,3 ; full 4,5 -> swa 4,5
    m.set_full_to_swa_mapping(arr(3, 5), arr(0, 3))  # full 5 -> swa 3, which full 3 gave up
    problems = m.check_invariants()
    assert has(problems, "SWA page 1 is shared by full pages [1, 2]")
    assert has(problems, "full page 2 maps into several SWA pages [1, 2]")
    assert not has(problems, "several live full slots")


def test_invariant_leaked_swa_page():
    m = _healthy()
    m.set_full_to_swa_mapping(arr(4, 5), arr(0, 0))  # full page 2 forgets swa page 2
    assert m.check_invariants() == ["allocated SWA pages reached from no full slot (leaked): [2]"]
    m2 = copy.deepcopy(_healthy())
    m2._swa_alloc[4] = True  # direct: a page marked allocated that nobody maps to
    assert m2.check_invariants() == ["allocated SWA pages reached from no full slot (leaked): [4]"]


def test_invariant_reserved_page():
    m = copy.deepcopy(_healthy())
    m._full_alloc[0] = True
    assert has(m.check_invariants(), "page 0 (the reserved padding page) is marked allocated")


def test_deepcopy_corruption_leaves_the_original_alone():
    m = _healthy()
    c = copy.deepcopy(m)
    c._mapping[-1] = 0
    c._swa_alloc[4] = True
    assert m.check_invariants() == [] and c.check_invariants() != []


# ------------------------------------------------------------------ state machine

class SwaMachine(RuleBasedStateMachine):
    """Drives two models identically; the test keeps its own bookkeeping:
    ``expected``: handed-out full slot -> SWA slot (0 once its page's SWA page is released),
    ``requests``: request id -> its full slots in token order. Pages in use and the next pages to
    hand out (lowest free first) are derived from that bookkeeping, not from the model."""

    @initialize(ps=st.sampled_from([1, 2, 4]), full_pages=st.integers(1, 6),
                 swa_pages=st.integers(1, 6))
    def setup(self, ps, full_pages, swa_pages):
        self.ps, self.nfp, self.nsp = ps, full_pages, swa_pages
        self.model = SwaAllocatorModel(full_pages * ps, swa_pages * ps, ps)
        self.twin = SwaAllocatorModel(full_pages * ps, swa_pages * ps, ps)
        self.expected: dict[int, int] = {}
        self.requests: dict[int, list[int]] = {}
        self.next_id = 0

    # -- bookkeeping derived by the test ---------------------------------------------------

    def used_full_pages(self):
        return {s // self.ps for s in self.expected}

    def used_swa_pages(self):
        return {w // self.ps for w in self.expected.values() if w}

    def lowest_free(self, used, total, count):
        free = [p for p in range(1, total + 1) if p not in used]
        return free[:count] if len(free) >= count else None

    def page_slots(self, pages):
        return [p * self.ps + i for p in pages for i in range(self.ps)]

    def both(self, name, *args):
        out = getattr(self.model, name)(*args)
        twin = getattr(self.twin, name)(*args)
        assert (out is None) == (twin is None)
        if out is not None:
            assert out.tolist() == twin.tolist()
        return out

    def expect_rejection(self, name, *args):
        before = snapshot(self.model)
        with pytest.raises(ValueError):
            getattr(self.model, name)(*args)
        assert snapshot(self.model) == before

    # -- rules ---------------------------------------------------------------------------------

    @rule(pages=st.integers(0, 3))
    def alloc(self, pages):
        full = self.lowest_free(self.used_full_pages(), self.nfp, pages)
        swa = self.lowest_free(self.used_swa_pages(), self.nsp, pages)
        out = self.both("alloc", pages * self.ps)
        if full is None or swa is None:
            assert out is None
            return
        assert out.tolist() == self.page_slots(full)
        if pages:
            self.expected.update(zip(self.page_slots(full), self.page_slots(swa)))
            self.requests[self.next_id] = self.page_slots(full)
            self.next_id += 1

    @rule(data=st.data(), n=st.integers(0, 9))
    def alloc_extend(self, data, n):
        rid = data.draw(st.sampled_from([None] + sorted(self.requests)))
        last = -1 if rid is None else self.requests[rid][-1]
        if last != -1 and self.expected[last] == 0:
            self.expect_rejection("alloc_extend", last, n)  # its SWA page was released
            return
        room = 0 if last == -1 else self.ps - 1 - last % self.ps
        k = min(room, n)
        need = -(-(n - k) // self.ps)
        full = self.lowest_free(self.used_full_pages(), self.nfp, need)
        swa = self.lowest_free(self.used_swa_pages(), self.nsp, need)
        out = self.both("alloc_extend", last, n)
        if full is None or swa is None:
            assert out is None
            return
        want_full = [last + 1 + i for i in range(k)] + self.page_slots(full)[:n - k]
        want_swa = ([self.expected[last] + 1 + i for i in range(k)]
                    + self.page_slots(swa)[:n - k])
        assert out.tolist() == want_full
        self.expected.update(zip(want_full, want_swa))
        if n:
            if rid is None:
                rid, self.next_id = self.next_id, self.next_id + 1
                self.requests[rid] = []
            self.requests[rid] += want_full

    @rule(data=st.data())
    def free(self, data):
        if not self.requests:
            return
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        slots = self.requests.pop(rid)
        # every page of the request, named by a random handed-out slot of it, in random order
        by_page = {}
        for s in slots:
            by_page.setdefault(s // self.ps, []).append(s)
        chosen = [data.draw(st.sampled_from(v)) for v in by_page.values()]
        chosen = data.draw(st.permutations(chosen))
        self.both("free", np.array(chosen, dtype=data.draw(st.sampled_from([np.int32, np.int64]))))
        for s in slots:
            del self.expected[s]

    @rule(data=st.data())
    def free_swa(self, data):
        if not self.requests:
            return
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        pages = sorted({s // self.ps for s in self.requests[rid]})
        chosen = data.draw(st.lists(st.sampled_from(pages), min_size=1, unique=True))
        slots = np.array([p * self.ps + data.draw(st.integers(0, self.ps - 1)) for p in chosen])
        released = [p for p in chosen if all(self.expected.get(s, 0) == 0
                                              for s in self.page_slots([p]))]
        if released:
            self.expect_rejection("free_swa", slots)
            return
        self.both("free_swa", slots)
        for s in self.page_slots(chosen):
            if s in self.expected:
                self.expected[s] = 0

    @rule(slot=st.integers(0, 40))
    def free_unowned_is_rejected(self, slot):
        if slot // self.ps in self.used_full_pages():
            return
        self.expect_rejection("free", np.array([slot]))

    @rule()
    def clear(self):
        self.both("clear")
        self.expected.clear()
        self.requests.clear()

    # -- checks after every step ---------------------------------------------------------------

    @invariant()
    def agrees_with_bookkeeping(self):
        if not hasattr(self, "model"):
            return
        m = self.model
        assert m.check_invariants() == []
        table = self.nfp * self.ps + self.ps
        everything = np.arange(table)
        want = [self.expected.get(s, 0) for s in range(table)]
        assert m.translate(everything).tolist() == want
        assert m.translate(np.array([-1])).tolist() == [-1]
        assert m.mapping.tolist() == want + [-1]
        assert m.live_full_slots.tolist() == self.page_slots(sorted(self.used_full_pages()))
        assert m.available_full == (self.nfp - len(self.used_full_pages())) * self.ps
        assert m.available_swa == (self.nsp - len(self.used_swa_pages())) * self.ps
        assert self.twin.mapping.tolist() == m.mapping.tolist()


SwaMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25,
                                        derandomize=True, deadline=None)
TestSwaMachine = SwaMachine.TestCase
