"""The CUDA timer's sampling order, checked without a GPU: a sample's timed calls must queue behind
the same calls issued untimed (oracle/bench/timers.py, CudaTimer), so the GPU never idles while
the host issues the sample's first call."""

from __future__ import annotations

from oracle.bench.timers import CudaTimer


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
