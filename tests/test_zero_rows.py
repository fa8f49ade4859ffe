"""Meta-tests: tokens whose rows are all zeros are no padding.

A "CUDA-graph padding" shortcut that skips a token because its key row (or every row) is all zeros
passes every case of random values. The ``padding`` class has a ``values="zero_rows"`` case for
every writer that copies rows; these kernels must fail it, named ``zero_rows_skipped``, and the
torch baselines must pass it.
"""

import numpy as np
import pytest
import torch

from oracle.buffers import Arena
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.ops._build import ZERO_ROWS_EVERY
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

ALL = ("float32", "float16", "bfloat16", "uint8")
WRITERS = sorted(op for op, spec in SPECS.items() if spec.sources and spec.index_dtypes and not spec.block_formats)


def zero_rows_case(op: str):
    return next(c for c in catalogue(op, "quick") if c.p.get("values") == "zero_rows")


@pytest.mark.parametrize("op", WRITERS)
def test_every_copying_writer_gets_tokens_whose_rows_are_all_zeros(op):
    case = zero_rows_case(op)
    contract = Contract(op=op, name="probe", backend="test")
    arena = Arena("cpu", case.seed)
    prepared = SPECS[op].build(case, arena, np.random.default_rng(case.seed), contract)
    prepared.before = arena.snapshot()
    sources = [v for v in arena.views.values() if v.role == "source"]
    zero = [np.all(prepared.numpy(v.name).reshape(v.shape[0], -1) == 0, axis=1) for v in sources]
    shared = np.logical_and.reduce(zero)
    assert shared[1::ZERO_ROWS_EVERY].all() and not shared.all(), op
    first = prepared.numpy(sources[0].name).reshape(sources[0].shape[0], -1)
    signs = np.signbit(first.astype(np.float32))
    assert signs[1].any() and not signs[1].all(), "token 1 mixes +0 and -0"
    assert any((z & ~shared).any() for z in zero), "a token whose rows are zeros in one source alone"


def store_cache_skips_zero_keys(k, v, k_cache, v_cache, loc):
    live = ~(k.reshape(k.shape[0], -1) == 0).all(dim=1)  # +0 and -0 alike
    tn.store_cache(k[live], v[live], k_cache, v_cache, loc[live])


def paged_skips_zero_bit_rows(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    bits = lambda t: t.reshape(t.shape[0], -1).view(torch.int16 if t.element_size() == 2 else torch.int32)  # noqa: E731
    padded = (bits(key) == 0).all(dim=1) & (bits(value) == 0).all(dim=1)  # +0 in every element of both
    slots = torch.where(padded, torch.full_like(slot_mapping, -1), slot_mapping)
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale)


def mla_skips_zero_nope(kv_buffer, loc, nope, rope):
    live = ~(nope.reshape(nope.shape[0], -1) == 0).all(dim=1)
    tn.set_mla_kv_buffer(kv_buffer, loc[live], nope[live], rope[live])


@pytest.mark.parametrize("op, fn, fields, words", [
    ("store_cache", store_cache_skips_zero_keys, dict(dtypes=ALL), "whose k's row is all zeros (as floats"),
    ("reshape_and_cache_flash", paged_skips_zero_bit_rows, dict(padding="negative"), "every source's row is all zeros (as bits"),
    ("set_mla_kv_buffer", mla_skips_zero_nope, {}, "whose nope's row is all zeros (as floats"),
])
def test_a_kernel_that_takes_zero_rows_for_padding_is_caught_and_named(op, fn, fields, words):
    case = zero_rows_case(op)
    wrong = Kernel(Contract(op=op, name="zero." + fn.__name__, backend="test", **fields), fn, "test")
    outcome = run_case(wrong, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "zero_rows_skipped", outcome.message
    assert words in outcome.cause["text"], outcome.cause["text"]
    right = Kernel(Contract(op=op, name="zero.baseline", backend="test", **fields), getattr(tn, op), "test")
    assert run_case(right, case).status == PASS
    for other in catalogue(op, "quick", wrong.contract):  # random rows hold no zero row: only this case fails
        if other.cls == "dtypes" and other.p.get("values", "random") == "random":
            assert run_case(wrong, other).status == PASS, other.id
            break
