"""The CUDA writers' Python wrappers (oracle/kernels/cuda/__init__.py) on any machine: what each
hands its op, with a recording stand-in for ``torch.ops.kv_oracle_cuda`` in place of the library
(the ops themselves run in tests/test_cuda_kernels.py on a GPU). A plain index goes as it is; a
CheckedIndex as its private copy, with its verdict only past the length every block scans itself;
a CheckedIndex checked against another cache or padding, and a bad ``validate``, are refused
before any op is called; ``validate="sync"`` raises the call's own error at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import oracle.kernels.cuda as cuda
from oracle.kernels import _deferred
from oracle.kernels.checked_index import CheckedIndex


BINDING = Path(cuda.__file__).parent / "csrc" / "binding.cpp"


def schemas() -> dict:
    """Each writer op's parameter names in order, read from the binding's schema strings."""
    text = " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', BINDING.read_text()))
    found = {}
    for op in ("store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash"):
        params = re.search(rf"\b{op}\((.*?)\) ->", text).group(1)
        found[op] = tuple(p.split("=")[0].split()[-1] for p in params.split(","))
    return found


SCHEMAS = schemas()


class RecordingOps:
    """Records each op call as (name, positional arguments, every argument by its schema name) and
    writes nothing; the op's ``default`` overload records alike."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, {**dict(zip(SCHEMAS[name], args)), **kwargs}))

        record.default = record
        return record


@pytest.fixture
def recorded(monkeypatch):
    lib = RecordingOps()
    monkeypatch.setattr(cuda._LIB, "loaded", lib)
    # a CPU-only torch has no stream to ask; the wrappers ask only under validate="sync"
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)
    return lib


def checked(n: int, num_slots: int, padding: str = "none") -> CheckedIndex:
    """A CheckedIndex as check_index leaves one (built by hand: check_index's own device paths are
    tested in tests/test_checked_index.py), its copy distinct from any caller's tensor."""
    return CheckedIndex(torch.arange(n, dtype=torch.int64) % num_slots, torch.tensor([n]), num_slots, padding)


def mla_args(n: int, num_slots: int = 300):
    return torch.zeros(num_slots, 576), torch.arange(n) % num_slots, torch.ones(n, 512), torch.ones(n, 64)


@pytest.mark.parametrize("n", [1, cuda.SCANNED_INDEX_MAX, cuda.SCANNED_INDEX_MAX + 1, 4096])
def test_a_checked_index_goes_as_its_copy_and_its_verdict_past_the_scanned_length(recorded, n):
    buf, _, nope, rope = mla_args(n, 5000)
    index = checked(n, 5000)
    cuda.set_mla_kv_buffer(buf, index, nope, rope)
    [(name, args, kwargs)] = recorded.calls
    assert name == "set_mla_kv_buffer" and args[1] is index.index and kwargs["validate"] == 1
    assert kwargs["verdict"] is (index.verdict if n > cuda.SCANNED_INDEX_MAX else None)


def test_a_plain_index_goes_as_it_is_and_validate_false_checks_nothing(recorded):
    buf, loc, nope, rope = mla_args(8)
    cuda.set_mla_kv_buffer(buf, loc, nope, rope)
    cuda.set_mla_kv_buffer(buf, loc, nope, rope, validate=False)
    (_, first, one), (_, second, two) = recorded.calls
    assert first[1] is loc and second[1] is loc and one["verdict"] is None and two["verdict"] is None
    assert (one["validate"], two["validate"]) == (1, 0)


def test_each_writer_refuses_an_index_checked_against_another_cache_or_padding(recorded):
    buf, _, nope, rope = mla_args(8, 300)
    with pytest.raises(ValueError, match=r"loc was checked against num_slots=299, but the cache has 300 slots"):
        cuda.set_mla_kv_buffer(buf, checked(8, 299), nope, rope)
    k = torch.ones(8, 2, 16)
    with pytest.raises(ValueError, match=r"loc was checked under padding='negative', but this writer's padding is 'none'"):
        cuda.store_cache(k, k, torch.zeros(300, 2, 16), torch.zeros(300, 2, 16), checked(8, 300, "negative"))
    caches = torch.zeros(20, 16, 2, 16), torch.zeros(20, 16, 2, 16)
    with pytest.raises(ValueError, match=r"slot_mapping was checked against num_slots=300, but the cache has 320"):
        cuda.reshape_and_cache_flash(k, k, *caches, checked(8, 300, "negative"), "auto", 1.0, 1.0)
    cuda.reshape_and_cache_flash(k, k, *caches, checked(8, 320, "negative"), "auto", 1.0, 1.0)
    assert [name for name, _, _ in recorded.calls] == ["reshape_and_cache_flash"]


def test_a_bad_validate_is_refused_before_any_launch(recorded):
    buf, loc, nope, rope = mla_args(4)
    with pytest.raises(ValueError, match=r"validate='yes' is not True, False or 'sync'"):
        cuda.set_mla_kv_buffer(buf, loc, nope, rope, validate="yes")
    assert recorded.calls == []


def test_sync_raises_the_calls_own_error_at_once_and_true_leaves_it_pending(recorded, monkeypatch):
    buf, loc, nope, rope = mla_args(4)
    waited = []
    monkeypatch.setattr(_deferred, "raise_at_once", waited.append)
    cuda.set_mla_kv_buffer(buf, loc, nope, rope)
    assert waited == []
    cuda.set_mla_kv_buffer(buf, loc, nope, rope, validate="sync")
    assert waited == [buf.get_device()] and len(recorded.calls) == 2


def test_an_earlier_calls_error_is_raised_before_the_launch(recorded, monkeypatch):
    def pending(device):
        raise _deferred.DeferredSlotError(f"pending on {device}")

    monkeypatch.setattr(_deferred, "take", pending)
    buf, loc, nope, rope = mla_args(4)
    with pytest.raises(_deferred.DeferredSlotError, match="pending on -1"):
        cuda.set_mla_kv_buffer(buf, loc, nope, rope)
    assert recorded.calls == []
    cuda.set_mla_kv_buffer(buf, loc, nope, rope, validate=False)  # checks nothing: nothing to raise first
    assert len(recorded.calls) == 1


@pytest.mark.parametrize("writer", ["store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash"])
def test_every_argument_goes_in_schema_order(recorded, writer):
    """Each wrapper hands its op every argument positionally, in the schema's order (the
    dispatcher binds those faster than keywords), the schema's defaults where it has no say."""
    k, loc = torch.ones(4, 2, 16), torch.arange(4)
    calls = {"store_cache": lambda: cuda.store_cache(k, k, torch.zeros(30, 2, 16), torch.zeros(30, 2, 16), loc),
             "set_mla_kv_buffer": lambda: cuda.set_mla_kv_buffer(*mla_args(4)),
             "reshape_and_cache_flash": lambda: cuda.reshape_and_cache_flash(
                 k, k, torch.zeros(2, 16, 2, 16), torch.zeros(2, 16, 2, 16), loc, "auto", 1.0, 1.0)}
    calls[writer]()
    [(name, args, named)] = recorded.calls
    assert name == writer and len(args) == len(SCHEMAS[writer]) and set(named) == set(SCHEMAS[writer])
    assert named["max_vec"] == 16 and named["pdl"] is True and named["validate"] == 1 and named["verdict"] is None
    assert named.get("path", "auto") == "auto"
