"""Launch plans of the block-scaled Triton writers (oracle.kernels.triton.block_ops, as
oracle.kernels.triton._plans): calls with one signature after the first are replayed, and a
replayed call writes, byte for byte, what oracle.reference.block_scaled writes; it still checks its
slots and its NVFP4 per-tensor scales (data, not signature) and writes nothing when one is illegal;
and a call that reads a scale on the host (one that moves no data) is never planned.

Scenarios run on Triton's CPU interpreter as in tests/test_triton_block_kernels.py, with its
poisoned, guarded allocations compared whole against the reference."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

import test_triton_block_kernels as block_kernels
from test_triton_block_kernels import Arena, _global_scale, _values

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not importable (pip install triton==3.6.0)")

FORMATS = ("mxfp8_e4m3fn", "nvfp4")
SEEDS = 3


def run(*argv: str) -> dict:
    return block_kernels.run(*argv, script=__file__, scope=globals())


@pytest.mark.parametrize("fmt", FORMATS)
def test_replayed_block_writes_match_the_reference(fmt):
    out = run("replayed", fmt)
    assert out["bad"] == [], out["bad"]
    # per seed: reshape_and_cache_block then quantize_block; the first seed plans both
    assert out["stats"][0] == {"built": 2, "replayed": 0, "unplannable": 0}
    assert all(s == {"built": 0, "replayed": 2, "unplannable": 0} for s in out["stats"][1:]), out["stats"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_replayed_block_write_still_checks_its_data(fmt):
    out = run("illegal", fmt)
    assert out["replayed"], out
    assert "slot_mapping[4] = 48 is out of range [0, 48)" in out["slot"][0], out["slot"]
    assert out["slot"][1] == [], out["slot"]  # nothing written
    if fmt == "nvfp4":
        assert "v_global_scale = inf must be a finite float32 > 0" in out["scale"][0], out["scale"]
        assert out["scale"][1] == [], out["scale"]
    assert out["after"] == [None, []], out["after"]  # no stale error; the good call wrote the reference


def test_a_call_that_reads_a_scale_on_the_host_is_never_replayed():
    out = run("empty")
    assert out["first"] is None and out["built"] == 0
    assert "global_scale = nan" in out["second"], out


# --- scenarios (on the interpreter) -----------------------------------------------------------

def _paged_call(rng, fmt: str, seed: int, bad_slot: bool = False, bad_scale: bool = False):
    """One reshape_and_cache_block call of a fixed signature (NHD caches, linear scales, bf16,
    int64 slots with -1 padding) on fresh poisoned caches; returns (arena, the call's arguments,
    the reference's caches)."""
    import torch

    from oracle.reference import block_scaled as ref

    num_blocks, bs, h, d, n = 3, 16, 2, 64, 9
    width, count = ref.code_width(fmt, d), ref.scale_count(fmt, d)
    arena = Arena(rng)
    views = [arena.view((num_blocks, bs, h, w), (bs * h * w, h * w, w, 1)) for w in (width, width, count, count)]
    caches, twins = [v[0] for v in views], [v[1] for v in views]
    slots = rng.permutation(num_blocks * bs)[:n].astype(np.int64)
    slots[seed % n] = -1
    if bad_slot:
        slots[4] = num_blocks * bs
    slot_mapping = torch.from_numpy(slots)
    key = _values(rng, fmt, (n, h, d), "bfloat16")
    value = _values(rng, fmt, (n, h, d), "bfloat16")
    k_gs, v_gs = _global_scale(rng, key, seed), _global_scale(rng, value, seed + 1)
    if bad_scale:
        v_gs = torch.tensor([float("inf")], dtype=torch.float32)
    if not (bad_slot or bad_scale):
        with np.errstate(all="ignore"):
            want = ref.reshape_and_cache_block(*twins, slots, key.float().numpy(), value.float().numpy(),
                                               fmt=fmt, k_global_scale=k_gs.numpy(), v_global_scale=v_gs.numpy(),
                                               scale_layout="linear")
        for twin, new in zip(twins, want):
            twin[...] = new
    return arena, (key, value, *caches, slot_mapping, fmt, k_gs, v_gs)


def _raised(fn):
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return None


def scenario_replayed(fmt: str):
    from oracle.kernels.triton import _plans, block_ops
    from oracle.reference import block_scaled as ref

    rng = np.random.default_rng(23)
    bad, stats = [], []
    for seed in range(SEEDS):
        before = dict(_plans.stats)
        arena, args = _paged_call(rng, fmt, seed)
        block_ops.reshape_and_cache_block(*args)
        if arena.mismatches():
            bad.append(["paged", seed, arena.mismatches()])
        # quantize_block into poisoned [N, H, *] outputs
        n, h, d = 5, 2, 64
        arena = Arena(rng)
        width, count = ref.code_width(fmt, d), ref.scale_count(fmt, d)
        (codes, codes_twin), (scales, scales_twin) = (arena.view((n, h, w), (h * w, w, 1)) for w in (width, count))
        x = _values(rng, fmt, (n, h, d), "float16")
        gs = _global_scale(rng, x, seed) if fmt == "nvfp4" else None
        with np.errstate(all="ignore"):
            want_codes, want_scales = ref.quantize_block(x.float().numpy(), fmt,
                                                         global_scale=None if gs is None else gs.numpy())
        codes_twin[...], scales_twin[...] = want_codes, want_scales
        block_ops.quantize_block(codes, scales, x, fmt, gs)
        if arena.mismatches():
            bad.append(["quantize", seed, arena.mismatches()])
        stats.append({k: _plans.stats[k] - before[k] for k in before})
    return {"bad": bad, "stats": stats}


def scenario_illegal(fmt: str):
    from oracle.kernels.triton import _plans, block_ops

    rng = np.random.default_rng(29)
    _, args = _paged_call(rng, fmt, 0)
    block_ops.reshape_and_cache_block(*args)  # plans the signature
    replays = _plans.stats["replayed"]
    out = {}
    arena, args = _paged_call(rng, fmt, 1, bad_slot=True)
    out["slot"] = [_raised(lambda: block_ops.reshape_and_cache_block(*args)), arena.mismatches()]
    if fmt == "nvfp4":
        arena, args = _paged_call(rng, fmt, 2, bad_scale=True)
        out["scale"] = [_raised(lambda: block_ops.reshape_and_cache_block(*args)), arena.mismatches()]
    arena, args = _paged_call(rng, fmt, 3)
    out["after"] = [_raised(lambda: block_ops.reshape_and_cache_block(*args)), arena.mismatches()]
    out["replayed"] = _plans.stats["replayed"] - replays == (3 if fmt == "nvfp4" else 2)  # every call after the first
    return out


def scenario_empty():
    """An empty quantize_block (N = 0) reads its NVFP4 scale on the host: a good one, then, with
    the same signature, a NaN, which must still be refused."""
    import torch

    from oracle.kernels.triton import _plans, block_ops

    codes = torch.zeros(0, 2, 32, dtype=torch.uint8)
    scales = torch.zeros(0, 2, 4, dtype=torch.uint8)
    x = torch.zeros(0, 2, 64)
    built = _plans.stats["built"]
    first = _raised(lambda: block_ops.quantize_block(codes, scales, x, "nvfp4", torch.tensor([2.0])))
    second = _raised(lambda: block_ops.quantize_block(codes, scales, x, "nvfp4", torch.tensor([float("nan")])))
    return {"first": first, "second": second, "built": _plans.stats["built"] - built}


if __name__ == "__main__":
    print("RESULT " + json.dumps(globals()["scenario_" + sys.argv[1]](*sys.argv[2:])))
