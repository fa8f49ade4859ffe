"""The CUDA timer's sampling order, checked without a GPU: a sample's timed calls must queue behind
the same calls issued untimed (oracle/bench/timers.py, CudaTimer), so the GPU never idles while
the host issues the sample's first call; and the A/B helper's round-robin order (alternated)."""

from __future__ import annotations

import statistics

from oracle.bench.timers import CudaTimer, alternated


class _Event:
    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def record(self):
        self.log.append(f"record {self.name}")

    def synchronize(self):
        self.log.append(f"synchronize {self.name}")

    def elapsed_time(self, other):
        assert other.name == "end"
        return 6.0  # ms


def _timer(calls: int) -> tuple[CudaTimer, list]:
    log: list = []
    timer = object.__new__(CudaTimer)  # its attributes set by hand: no GPU here
    timer.start, timer.end = _Event(log, "start"), _Event(log, "end")
    timer.replay = lambda: log.append("replay")
    timer.calls = calls
    return timer, log


def test_a_sample_issues_its_calls_untimed_first():
    timer, log = _timer(calls=3)
    assert timer.sample() == 6.0 / 1e3 / 3
    assert log == ["replay", "record start", "replay", "record end", "synchronize end"]


def test_the_untimed_calls_are_not_waited_for():
    """No synchronization between the untimed and the timed calls: the timed ones queue behind."""
    timer, log = _timer(calls=1)
    timer.sample()
    first_timed = log.index("record start")
    assert "replay" in log[:first_timed]
    assert not any(entry.startswith("synchronize") for entry in log[:first_timed])


def test_alternated_runs_every_variant_each_round_after_its_setup():
    """A/B timing: each round sets up and times every variant in turn, and each label gets one
    median per round, in microseconds of its own function."""
    order, calls = [], {"fast": 0, "slow": 0}
    state = {"knob": None}

    def make(label, spin):
        def fn(x):
            assert state["knob"] == label  # timed right after its own setup
            calls[label] += 1
            total = 0
            for i in range(spin):
                total += i * x
            return total
        return fn

    def setup(label):
        return lambda: (order.append(label), state.update(knob=label))

    variants = {"fast": (setup("fast"), make("fast", 10)), "slow": (setup("slow"), make("slow", 20000))}
    times = alternated(variants, (3,), "cpu", rounds=3, samples=2)
    assert order == ["fast", "slow"] * 3
    assert set(times) == {"fast", "slow"} and all(len(v) == 3 for v in times.values())
    assert calls["fast"] > 0 and calls["slow"] > 0
    assert statistics.median(times["slow"]) > statistics.median(times["fast"]) > 0


def test_alternated_times_a_variant_on_its_own_inputs():
    seen = {"shared": set(), "own": set()}

    def record(label):
        return lambda x: seen[label].add(x)

    variants = {"shared": (lambda: None, record("shared")), "own": (lambda: None, record("own"), (7,), ())}
    alternated(variants, (3,), "cpu", rounds=1, samples=1)
    assert seen == {"shared": {3}, "own": {7}}


def test_alternated_builds_each_rounds_timer_eager_or_graph_replayed(monkeypatch):
    """``graph=True`` asks for graph-replayed timers (eager by default), built anew each round,
    after the variant's setup, so a knob set there is what a captured graph holds."""
    import oracle.bench.timers as timers
    built = []

    class Fixed:
        def sample(self):
            return 1e-6

    def fake_make_timer(fn, args, device, rotation=(), graph=True, **_):
        built.append((state["knob"], graph, args, rotation))
        return Fixed()

    state = {"knob": None}
    monkeypatch.setattr(timers, "make_timer", fake_make_timer)
    variants = {"a": (lambda: state.update(knob="a"), print), "b": (lambda: state.update(knob="b"), print)}
    for graph in (True, False):
        built.clear()
        times = timers.alternated(variants, (3,), "cuda", ((4,),), rounds=2, samples=1, graph=graph)
        assert built == [("a", graph, (3,), ((4,),)), ("b", graph, (3,), ((4,),))] * 2
        assert times == {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    built.clear()
    timers.alternated(variants, (3,), "cuda", rounds=1, samples=1)
    assert [g for _, g, _, _ in built] == [False, False]  # eager unless asked


def test_a_checked_index_writer_is_timed_on_sets_prepared_once():
    """The bench prepares each input set of a ``.checked_index`` writer once, outside the timed
    calls (a step checks its index once for all its layers); other kernels get their sets as they
    are."""
    import torch
    from types import SimpleNamespace

    from oracle.bench.runner import prepared
    from oracle.kernels.checked_index import CheckedIndex, CheckedIndexWriter

    def sets(seed):
        return (torch.zeros(8, 4), torch.tensor([seed, 2]), torch.ones(2, 3), torch.ones(2, 1))

    def inner(*a):
        return None

    writer = SimpleNamespace(fn=CheckedIndexWriter(inner, "set_mla_kv_buffer", "none"))
    fn, args, rotation = prepared(writer, sets(0), (sets(1), sets(3)))
    assert fn is inner  # the writer itself, as each layer of a step calls it
    assert [type(s[1]) for s in (args, *rotation)] == [CheckedIndex] * 3
    assert [s[1].index.tolist() for s in (args, *rotation)] == [[0, 2], [1, 2], [3, 2]]
    plain = SimpleNamespace(fn=lambda *a: None)
    first, rest = sets(0), (sets(1),)
    assert prepared(plain, first, rest) == (plain.fn, first, rest)


def test_medians_and_an_empty_path_write_nothing(tmp_path, monkeypatch):
    from oracle.bench.timers import medians, save_alternated

    assert medians({"a": [3.0, 1.0, 2.0], "b": [5.0]}) == {"a": 2.0, "b": 5.0}
    monkeypatch.chdir(tmp_path)
    save_alternated("", 7, [{"n": 1}])  # no --json: no file, and no device queried
    assert list(tmp_path.iterdir()) == []


class _Counting:
    """A timer whose samples are given in order (seconds), one per call of sample()."""

    calls = 1

    def __init__(self, values):
        self.values = iter(values)

    def sample(self):
        return next(self.values)


def test_the_sampler_keeps_each_samples_round():
    from oracle.bench.timers import Sampler

    samples, dropped, complete, rounds = Sampler(3).collect([_Counting([1, 2, 3]), _Counting([4, 5, 6])])
    assert samples == [[1, 2, 3], [4, 5, 6]] and dropped == [0, 0] and complete
    assert rounds == [[0, 1, 2], [0, 1, 2]]


def test_a_dropped_sample_leaves_its_round_out_and_the_timer_catches_up_in_the_next():
    from oracle.bench.timers import Sampler

    sampler = Sampler(3, quiet=True)
    seen = []

    class Disturbance:  # the second timer's second sample (round 1) disturbed
        def snapshot(self):
            return len(seen)

        def disturbed(self, before, after, seconds):
            seen.append(seconds)
            return len(seen) == 4

    sampler.disturbance = Disturbance()
    samples, dropped, complete, rounds = sampler.collect([_Counting([1, 2, 3]), _Counting([4, 5, 6, 7])])
    assert samples == [[1, 2, 3], [4, 6, 7]] and dropped == [0, 1] and complete
    assert rounds == [[0, 1, 2], [0, 2, 3]]
