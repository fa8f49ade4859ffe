"""Meta-tests: more tokens than a launch grid's y or z dimension holds (65535).

A kernel that puts the tokens on grid y (``grid = (heads, N)``) fails to launch past 65535, one
that clamps the grid there drops the rest, and one that counts the tokens in 16 bits writes N mod
65536 of them. The full profile's ``sizes`` class has a case past that limit for every op with an
index, in its narrowest rows; each of these kernels must fail it with its cause named, and the torch baseline must pass.
"""

import pytest

from oracle.cases import GRID_LIMIT_N, catalogue
from oracle.contract import Contract
from oracle.diagnose.hypothesis import GRID_DIMENSION_MAX
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

ALL = ("float32", "float16", "bfloat16", "uint8")


def kernel(fn) -> Kernel:
    return Kernel(Contract(op="store_cache", name="grid." + fn.__name__, backend="test", dtypes=ALL), fn, "test")


def grid_case(op: str):
    return next(c for c in catalogue(op, "full") if c.cls == "sizes" and c.p.get("n") == GRID_LIMIT_N)


@pytest.mark.parametrize("op", sorted(op for op, spec in SPECS.items() if spec.index_dtypes))
def test_every_indexed_op_has_a_case_past_the_grid_limit_in_narrow_rows(op):
    case = grid_case(op)
    assert case.p["n"] > GRID_DIMENSION_MAX
    spec = SPECS[op]
    assert case.p.get("shape") == (spec.float_slots_shape or spec.large_n_shape or None)
    assert not any(c.p.get("n", 0) > GRID_DIMENSION_MAX for c in catalogue(op, "quick"))


def tokens_on_grid_y(k, v, k_cache, v_cache, loc):
    if loc.numel() > GRID_DIMENSION_MAX:  # what a launch of grid (heads, N) does there
        raise RuntimeError("CUDA error: invalid configuration argument")
    tn.store_cache(k, v, k_cache, v_cache, loc)


def grid_clamped(k, v, k_cache, v_cache, loc):
    n = min(loc.numel(), GRID_DIMENSION_MAX)  # grid.y = min(N, 65535), one token a block
    tn.store_cache(k[:n], v[:n], k_cache, v_cache, loc[:n])


def count_in_16_bits(k, v, k_cache, v_cache, loc):
    n = loc.numel() & 0xFFFF  # a uint16 token count
    tn.store_cache(k[:n], v[:n], k_cache, v_cache, loc[:n])


def test_a_launch_with_the_tokens_on_grid_y_is_caught_and_named():
    outcome = run_case(kernel(tokens_on_grid_y), grid_case("store_cache"))
    assert outcome.status == FAIL and outcome.cause["id"] == "token_count_limit", outcome.message
    assert "N = 4099 passes" in outcome.cause["text"]


@pytest.mark.parametrize("fn, dropped", [(grid_clamped, GRID_LIMIT_N - GRID_DIMENSION_MAX),
                                         (count_in_16_bits, 65536)])
def test_a_grid_clamped_at_the_limit_or_a_16_bit_count_drops_the_rest_and_is_named(fn, dropped):
    outcome = run_case(kernel(fn), grid_case("store_cache"))
    assert outcome.status == FAIL and outcome.cause["id"] == "rows_dropped", outcome.message
    assert f"the last {dropped} entries" in outcome.cause["text"]


def test_the_baseline_passes_the_case():
    assert run_case(Kernel(Contract(op="store_cache", name="torch.store_cache", backend="test", dtypes=ALL),
                           tn.store_cache, "test"), grid_case("store_cache")).status == PASS
