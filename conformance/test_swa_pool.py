"""Stateful conformance of the SWA pool: a hypothesis state machine drives the real torch pool
(:class:`oracle.kernels.swa_pool.SwaKVPool`) and the numpy model
(:class:`oracle.reference.swa_model.SwaAllocatorModel`) side by side.

Every rule applies one operation to both and demands the same outcome: the same slots (or None),
the same error type, the same translation. Translations go through the pool's cache on purpose:
fresh index tensors, views at different offsets (and strides, and shapes) of one fixed buffer, the
allocator's own returned tensors, tensors translated before and translated again after the
mapping changed, and a reused buffer whose contents change between forward steps (each forward
step calls ``invalidate_loc_cache()`` first, as sglang's graph runners do). After every step the
invariants hold on the pool's own tensors: the -1 sentinel is intact, no SWA slot is mapped from
two live full slots, freed (and never allocated) slots map to 0; and the pool's mapping, free
counts, live slots and KV buffers equal the model's.

A failure prints the shrunk step sequence (``state.free_swa(req=requests_0, part='first')``
...). Profiles (``--oracle-profile``): quick (default; derandomized, bounded for CI), full,
exhaustive. ``tests/test_swa_pool.py`` runs this machine against the mutant pools of
:mod:`oracle.mutants.swa_pool` and checks that it catches each.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant, multiple,
                                 precondition, rule, run_state_machine_as_test)

from oracle.kernels.swa_pool import SwaKVPool
from oracle.reference.swa import translate_full_to_swa
from oracle.reference.swa_model import SwaAllocatorModel

# (size_full, size_swa, page_size): the SWA pool is the smaller one, as in a hybrid model; table
# sizes 13, 14 and 20, so locs drawn from [-1, 19] are mostly valid
CONFIGS = {"page2": (12, 8, 2), "page4": (16, 12, 4), "page1": (12, 8, 1)}
MAX_LOC = 19
SHARED_LEN = 20  # the fixed buffer that views are cut from
STEP_CAPACITY = 8  # the reused per-forward index buffer
NUM_LAYERS, HEAD_NUM, HEAD_DIM = 2, 1, 2
PARTS = ("all", "first", "last")
LAYOUTS = ("contiguous", "every_other", "2-D")
# (max_examples, stateful_step_count) per --oracle-profile; quick is derandomized
PROFILES = {"quick": (150, 30), "full": (400, 40), "exhaustive": (3000, 50)}


def profile_settings(profile: str) -> settings:
    examples, steps = PROFILES[profile]
    return settings(max_examples=examples, stateful_step_count=steps, derandomize=profile == "quick",
                    deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
                    phases=[phase for phase in Phase if phase.name != "explain"],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class Request:
    """The full slots one allocation returned: the allocator's own tensor, kept as it was (frees
    and extensions do not change it), as the serving engine keeps ``out_cache_loc``."""

    def __init__(self, loc: torch.Tensor):
        self.loc = loc

    def __repr__(self) -> str:
        return f"Request({self.loc.tolist()})"


def _describe(outcome) -> str:
    if isinstance(outcome, BaseException):
        return f"{type(outcome).__name__}: {outcome}"
    if isinstance(outcome, torch.Tensor):
        return f"tensor {outcome.tolist()} ({outcome.dtype}, shape {tuple(outcome.shape)})"
    if isinstance(outcome, np.ndarray):
        return f"array {outcome.tolist()} (shape {outcome.shape})"
    return repr(outcome)


class SwaPoolMachine(RuleBasedStateMachine):
    """The real pool (``pool_cls`` on ``device``) against ``SwaAllocatorModel``."""

    pool_cls = SwaKVPool
    device = "cpu"

    requests = Bundle("requests")
    index_tensors = Bundle("index_tensors")

    # -- set-up ------------------------------------------------------------------------------

    @initialize(config=st.sampled_from(list(CONFIGS)))
    def init_pool(self, config):
        size_full, size_swa, page_size = CONFIGS[config]
        self.page_size = page_size
        self.table = size_full + page_size
        self.pool = self.pool_cls(size_full, size_swa, page_size, self.device, num_layers=NUM_LAYERS,
                                  head_num=HEAD_NUM, head_dim=HEAD_DIM, dtype=torch.float32)
        self.model = SwaAllocatorModel(size_full, size_swa, page_size)
        # a buffer with fixed contents that views are cut from: every loc of the table and -1
        values = [(7 * i) % (self.table + 1) - 1 for i in range(SHARED_LEN)]
        self.shared = torch.tensor(values, dtype=torch.int64, device=self.device)
        # the per-forward index buffer, rewritten in place each forward step (a CUDA-graph input)
        self.step_buffer = torch.zeros(STEP_CAPACITY, dtype=torch.int64, device=self.device)
        # translated just before and just after every mutation: a stale cache shows at once
        self.probe = torch.arange(-1, self.table, dtype=torch.int64, device=self.device)
        shape = (size_swa + page_size, HEAD_NUM, HEAD_DIM)
        self.expected_k = [np.zeros(shape, np.float32) for _ in range(NUM_LAYERS)]
        self.expected_v = [np.zeros(shape, np.float32) for _ in range(NUM_LAYERS)]
        self.writes = 0

    # -- helpers -----------------------------------------------------------------------------

    def tensor(self, values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def both(self, what: str, on_pool, on_model):
        """Run one operation on both; the same error type, or both results (pool, model)."""
        try:
            want = on_model()
        except (TypeError, ValueError) as exc:
            want = exc
        try:
            got = on_pool()
        except Exception as exc:  # noqa: BLE001 - any pool error is an outcome to compare
            got = exc
        if isinstance(want, BaseException) or isinstance(got, BaseException):
            assert type(got) is type(want), (
                f"{what}: the pool gave {_describe(got)}; the model {_describe(want)}")
            return None
        return got, want

    def mutate(self, what: str, on_pool, on_model):
        """:meth:`both` for an operation that may change the mapping, watched by the probe (every
        table slot and -1): translated just before, so that it is the cache entry, and again
        just after, when it must show the new mapping, not the cached one."""
        self.translate(f"the probe before {what}", self.probe)
        outcome = self.both(what, on_pool, on_model)
        self.translate(f"the probe, translated again after {what}", self.probe)
        return outcome

    def check_slots(self, what: str, got, want) -> None:
        if want is None or got is None:
            assert got is None and want is None, (
                f"{what}: the pool gave {_describe(got)}; the model {_describe(want)}")
            return
        assert got.dtype == torch.int64 and got.device.type == torch.device(self.device).type, (
            f"{what}: the pool returned {got.dtype} on {got.device}; expected int64 on {self.device}")
        assert got.tolist() == want.tolist(), (
            f"{what}: the pool gave slots {got.tolist()}; the model {want.tolist()}")

    def translate(self, what: str, loc: torch.Tensor):
        """Translate ``loc`` (its current contents) on both; returns the pool's result or None."""
        contents = loc.cpu().numpy()
        outcome = self.both(what, lambda: self.pool.translate_loc_from_full_to_swa(loc),
                            lambda: self.model.translate(contents))
        if outcome is None:
            return None
        got, want = outcome
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == want.shape \
            and got.dtype == torch.int64, (
                f"{what} of {contents.tolist()}: the pool gave {_describe(got)}; expected int64 "
                f"of shape {want.shape}")
        if got.cpu().tolist() != want.tolist():
            try:
                fresh = translate_full_to_swa(self.pool.full_to_swa_index_mapping.cpu().numpy(),
                                              contents)
            except ValueError as exc:
                why = f"the pool's own mapping is broken ({exc})"
            else:
                why = ("the pool's own mapping already differs from the model's"
                       if got.cpu().tolist() == fresh.tolist() else
                       f"a stale or colliding cache entry: the pool's current mapping gives "
                       f"{fresh.tolist()}")
            raise AssertionError(f"{what} of {contents.tolist()}: the pool gave "
                                 f"{got.cpu().tolist()}, the model {want.tolist()}; {why}")
        return got

    def slots_of(self, req: Request, part: str) -> torch.Tensor:
        return {"all": req.loc, "first": req.loc[:1], "last": req.loc[-1:]}[part]

    def swap(self, first: int, second: int):
        """A remap that keeps every invariant: of the live full pages that map into an SWA page,
        ascending, the ``first``-th and ``second``-th (modulo their count) trade SWA pages,
        offsets kept. Returns ``(full, swa)`` for ``set_full_to_swa_mapping``; when fewer than
        two distinct pages qualify, the entries of the one page (or none) rewritten unchanged,
        which is still a mutation."""
        ps, mapping = self.page_size, self.model.mapping
        live = self.model.live_full_slots
        pages = sorted({int(s) // ps for s in live if mapping[s] != 0})
        if not pages:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a, b = pages[first % len(pages)], pages[second % len(pages)]
        if a == b:
            full = np.arange(a * ps, (a + 1) * ps, dtype=np.int64)
            return full, mapping[full]
        swa_of = {p: int(mapping[p * ps:(p + 1) * ps].max()) // ps for p in (a, b)}
        full, new = [], []
        for page, other in ((a, swa_of[b]), (b, swa_of[a])):
            for slot in range(page * ps, (page + 1) * ps):
                if mapping[slot] != 0:
                    full.append(slot)
                    new.append(other * ps + slot % ps)
        return np.array(full, dtype=np.int64), np.array(new, dtype=np.int64)

    # -- allocation rules --------------------------------------------------------------------

    @rule(target=requests, pages=st.integers(0, 3))
    def alloc(self, pages):
        n = pages * self.page_size
        outcome = self.mutate(f"alloc({n})", lambda: self.pool.alloc(n), lambda: self.model.alloc(n))
        if outcome is None:
            return multiple()
        self.check_slots(f"alloc({n})", *outcome)
        return multiple() if outcome[0] is None else Request(outcome[0])

    @rule(target=requests, tokens=st.integers(0, 9))
    def alloc_new_request(self, tokens):
        """``alloc_extend(-1, tokens)``: a request with no prefix (-1 through the sentinel)."""
        outcome = self.mutate(f"alloc_extend(-1, {tokens})", lambda: self.pool.alloc_extend(-1, tokens),
                            lambda: self.model.alloc_extend(-1, tokens))
        if outcome is None:
            return multiple()
        self.check_slots(f"alloc_extend(-1, {tokens})", *outcome)
        return multiple() if outcome[0] is None else Request(outcome[0])

    @rule(target=requests, req=requests, tokens=st.integers(0, 6))
    def extend(self, req, tokens):
        """``alloc_extend(last slot of req, tokens)``; rejected by both when that slot is no longer
        the end of a live, mapped page."""
        last = int(req.loc[-1]) if req.loc.numel() else -1
        what = f"alloc_extend({last}, {tokens})"
        outcome = self.mutate(what, lambda: self.pool.alloc_extend(last, tokens),
                            lambda: self.model.alloc_extend(last, tokens))
        if outcome is None:
            return multiple()
        self.check_slots(what, *outcome)
        return multiple() if outcome[0] is None else Request(outcome[0])

    @rule(req=requests, part=st.sampled_from(PARTS))
    def free(self, req, part):
        slots = self.slots_of(req, part)
        self.mutate(f"free({slots.tolist()})", lambda: self.pool.free(slots),
                  lambda: self.model.free(slots.cpu().numpy()))

    @rule(req=requests, part=st.sampled_from(PARTS))
    def free_swa(self, req, part):
        slots = self.slots_of(req, part)
        self.mutate(f"free_swa({slots.tolist()})", lambda: self.pool.free_swa(slots),
                  lambda: self.model.free_swa(slots.cpu().numpy()))

    @precondition(lambda self: self.model.available_full < self.model.size_full)
    @rule()
    def clear(self):
        """Everything free (only when something is allocated: clearing an empty pool is dull)."""
        self.mutate("clear()", self.pool.clear, self.model.clear)

    @rule(first=st.integers(0, 3), second=st.integers(0, 3))
    def remap_swap_pages(self, first, second):
        """``set_full_to_swa_mapping``: two mapped live full pages (by rank) trade SWA pages."""
        full, swa = self.swap(first, second)
        self.mutate(f"set_full_to_swa_mapping({full.tolist()}, {swa.tolist()})",
                  lambda: self.pool.set_full_to_swa_mapping(self.tensor(full), self.tensor(swa)),
                  lambda: self.model.set_full_to_swa_mapping(full, swa))

    @rule(first=st.integers(0, 3), second=st.integers(0, 3), dtype=st.sampled_from(["int64", "int32"]))
    def register_swapped_mapping(self, first, second, dtype):
        """``register_mapping``: a whole new table (as HiCache rebuilds one) in which two mapped
        live full pages (by rank) trade SWA pages."""
        full, swa = self.swap(first, second)
        table = self.model.mapping
        table[full] = swa
        new = self.tensor(table.tolist(), getattr(torch, dtype))
        everything = np.arange(self.table, dtype=np.int64)
        self.mutate("register_mapping", lambda: self.pool.register_mapping(new),
                  lambda: self.model.set_full_to_swa_mapping(everything, table[:-1]))

    # -- translation rules -------------------------------------------------------------------

    @rule(target=index_tensors, locs=st.lists(st.integers(-1, MAX_LOC), max_size=6),
          dtype=st.sampled_from(["int64", "int32"]))
    def translate_fresh(self, locs, dtype):
        """A new index tensor; kept in the bundle to be translated again later."""
        loc = self.tensor(locs, getattr(torch, dtype))
        self.translate("translate (fresh tensor)", loc)
        return loc

    def view(self, offset: int, length: int, layout: str) -> torch.Tensor:
        """``length`` elements of the shared buffer from ``offset``: contiguous, every other
        element, or 2-D (two rows, or one when ``length`` is odd). Same offset and length give
        the same ``data_ptr()`` and ``numel()`` in every layout."""
        if layout == "contiguous":
            return self.shared[offset:offset + length]
        if layout == "every_other":
            return self.shared[offset:offset + 2 * length:2]
        rows = 2 if length % 2 == 0 else 1
        return self.shared[offset:offset + length].view(rows, length // rows)

    @rule(target=index_tensors, length=st.integers(1, 6), offset=st.integers(0, 8),
          layout=st.sampled_from(LAYOUTS), second_offset=st.integers(0, 8),
          second_layout=st.sampled_from(LAYOUTS))
    def translate_two_views(self, length, offset, layout, second_offset, second_layout):
        """Two views of the one fixed shared buffer, translated one after the other (the locs of
        two batches cut from one buffer): views at different offsets share the storage's base
        pointer, and views at one offset in different layouts share ``data_ptr()`` and numel."""
        first = self.view(offset, length, layout)
        self.translate(f"translate shared view ({layout}, offset {offset}, length {length})", first)
        second = self.view(second_offset, length, second_layout)
        self.translate(f"translate shared view ({second_layout}, offset {second_offset}, length "
                       f"{length}) just after one ({layout}, offset {offset})", second)
        return second

    @rule(req=requests)
    def translate_request(self, req):
        """The allocator's own returned tensor (how out_cache_loc reaches the SWA layers)."""
        self.translate("translate (a request's slots)", req.loc)

    @rule(loc=index_tensors)
    def translate_again(self, loc):
        """A tensor translated before, translated again: whatever changed since, the result
        must be today's mapping."""
        self.translate("translate (again)", loc)

    @rule(locs=st.lists(st.integers(-1, MAX_LOC), min_size=1, max_size=STEP_CAPACITY),
          swa_layers=st.integers(1, 3))
    def forward_step(self, locs, swa_layers):
        """A forward step: new contents written in place into the reused index buffer, then
        ``invalidate_loc_cache()`` (as the step starts), then one translation per SWA layer; the
        layers after the first hit the cache and get the very same tensor."""
        view = self.step_buffer[:len(locs)]
        view.copy_(self.tensor(locs))
        self.pool.invalidate_loc_cache()
        first = self.translate("forward step, first SWA layer", view)
        for layer in range(1, swa_layers):
            again = self.translate(f"forward step, SWA layer {layer + 1}", view)
            if first is not None:
                assert again is first, (f"forward step, SWA layer {layer + 1}: the translation was "
                                        "recomputed; the cache should have served it")

    @rule(bad=st.sampled_from([-2, -3, "sentinel index", "past the table"]), where=st.integers(0, 2))
    def translate_bad_loc(self, bad, where):
        """A loc that is neither -1 nor in the table: both must raise ValueError."""
        value = {"sentinel index": self.table, "past the table": self.table + 1}.get(bad, bad)
        locs = [self.page_size, -1, 0]
        locs.insert(where, value)
        loc = self.tensor(locs)
        outcome = self.both(f"translate {locs}", lambda: self.pool.translate_loc_from_full_to_swa(loc),
                            lambda: self.model.translate(loc.cpu().numpy()))
        assert outcome is None, f"translate {locs}: the model raises ValueError"

    # -- writing -----------------------------------------------------------------------------

    @rule(req=requests, layer=st.integers(0, NUM_LAYERS - 1))
    def write_kv(self, req, layer):
        """``set_kv_buffer``: the request's rows land at the model's SWA slots. Skipped when the
        slots do not translate to distinct nonzero SWA slots (the padding slot would be written
        several times)."""
        if req.loc.numel() == 0:
            return
        swa = self.model.translate(req.loc.cpu().numpy())
        if np.any(swa <= 0) or np.unique(swa).size != swa.size:
            return
        n = req.loc.numel()
        self.writes += 1
        k = np.arange(n * HEAD_NUM * HEAD_DIM, dtype=np.float32).reshape(n, HEAD_NUM, HEAD_DIM) \
            + 1000 * self.writes
        v = -k
        self.pool.set_kv_buffer(layer, req.loc, torch.from_numpy(k).to(self.device),
                                torch.from_numpy(v).to(self.device))
        self.expected_k[layer][swa] = k
        self.expected_v[layer][swa] = v

    # -- invariants, after every step --------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        """After every step: the pool's own invariants (read from its tensors), then agreement
        with the model and with the KV rows written so far."""
        mapping = self.pool.full_to_swa_index_mapping
        self.sentinel_intact(mapping)
        table = mapping.cpu().numpy()
        live = self.pool.live_full_slots.cpu().numpy()
        self.no_swa_slot_mapped_twice(table, live)
        self.freed_slots_map_to_zero(table, live)
        self.agrees_with_model(table, live)
        self.kv_buffers_agree()

    def sentinel_intact(self, mapping: torch.Tensor):
        assert mapping.dtype == torch.int64 and tuple(mapping.shape) == (self.table + 1,), (
            f"the mapping is {mapping.dtype} of shape {tuple(mapping.shape)}; expected int64 "
            f"({self.table + 1},)")
        assert int(mapping[-1]) == -1, f"sentinel broken: mapping[-1] = {int(mapping[-1])}"

    def no_swa_slot_mapped_twice(self, table: np.ndarray, live: np.ndarray):
        values = table[live]
        values = values[values != 0]
        uniq, counts = np.unique(values, return_counts=True)
        if np.any(counts > 1):
            dup = uniq[counts > 1][0]
            raise AssertionError(f"SWA slot {int(dup)} is mapped from several live full slots: "
                                 f"{[int(s) for s in live if table[s] == dup]}")

    def freed_slots_map_to_zero(self, table: np.ndarray, live: np.ndarray):
        dead = np.ones(self.table, dtype=bool)
        dead[live] = False
        stray = np.flatnonzero(dead & (table[:-1] != 0))
        assert stray.size == 0, (f"free (or never allocated) full slots map to nonzero: "
                                 f"{ {int(s): int(table[s]) for s in stray} }")

    def agrees_with_model(self, table: np.ndarray, live: np.ndarray):
        want = self.model.mapping
        assert np.array_equal(table, want), (
            f"mapping: the pool has {table.tolist()}; the model {want.tolist()}")
        assert np.array_equal(live, self.model.live_full_slots), (
            f"live full slots: the pool has {live.tolist()}; the model "
            f"{self.model.live_full_slots.tolist()}")
        got = (self.pool.available_full, self.pool.available_swa)
        want = (self.model.available_full, self.model.available_swa)
        assert got == want, f"free slots (full, swa): the pool has {got}; the model {want}"
        problems = self.model.check_invariants()
        assert problems == [], f"the model's own invariants: {problems}"

    def kv_buffers_agree(self):
        for layer in range(NUM_LAYERS):
            for name, got, want in (("k", self.pool.k_buffer[layer], self.expected_k[layer]),
                                    ("v", self.pool.v_buffer[layer], self.expected_v[layer])):
                got = got.cpu().numpy()
                if not np.array_equal(got, want):
                    slot = int(np.flatnonzero(np.any(got != want, axis=(1, 2)))[0])
                    raise AssertionError(f"layer {layer} {name} buffer, SWA slot {slot}: "
                                         f"{got[slot].tolist()}, expected {want[slot].tolist()}")


def machine_for(pool_cls, device: str = "cpu") -> type:
    """The machine driving ``pool_cls`` (the real pool, or a mutant) on ``device``."""
    return type(f"SwaPoolMachine_{pool_cls.__name__}", (SwaPoolMachine,),
                {"pool_cls": pool_cls, "device": device})


DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="no CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
def test_swa_pool_state_machine(request, device):
    """The real pool agrees with the model through every random sequence of the profile. The pool
    is kv-oracle's own torch code, not a registered kernel: a run that selects kernels by name, or
    backends other than torch, is not about it (a vendor's translate_full_to_swa gets the catalogue's
    cases, the repeat class's two calls on one mapping among them)."""
    backends = request.config.getoption("oracle_backend", None)
    if request.config.getoption("oracle_kernel", None) or (backends and "torch" not in backends.split(",")):
        pytest.skip("the SWA pool is kv-oracle's own torch pool; --oracle-kernel / --oracle-backend select others")
    profile = request.config.getoption("oracle_profile", "quick")
    run_state_machine_as_test(machine_for(SwaKVPool, device), settings=profile_settings(profile))
