"""The Hopper CUDA kernels (oracle.kernels.cuda) on a GPU, skipped unless they are available (a
CUDA torch, a Hopper GPU, nvcc): every launch tuning writing the same bytes, opcheck on every op,
every vector width and MLA path against a torch/numpy reference, many rows per warp (the TMA
buffer cycling), fp8 special values, CUDA-graph capture, PDL launches, rejection of bad slots, and
the device slot check call after call. Their host side (registration, build, compile checks, the
lanes' wiring): tests/test_cuda_backend.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle.kernels
import oracle.kernels.cuda as cuda_kernels

GPU_REASON = cuda_kernels.available()  # builds on a Hopper machine; a reason anywhere else
gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"CUDA kernels unavailable: {GPU_REASON}")


def _ops():
    return cuda_kernels.ops()


def _gen(seed):
    return torch.Generator(device="cpu").manual_seed(seed)


def _rand(shape, dtype, seed):
    g = _gen(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).cuda()
    return (torch.randn(shape, generator=g) * 2).to(dtype).cuda()


def _slots(n, num_slots, seed, dtype=torch.int64):
    return torch.randperm(num_slots, generator=_gen(seed))[:n].to(dtype).cuda()


def _same_bytes(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@gpu
@pytest.mark.parametrize("n", [7, 4097])
def test_every_launch_tuning_writes_the_same_bytes(n):
    """The tuning knobs change only the launch (rows per warp, warps per block, grids, L2 policy,
    L2 prefetches before the PDL wait, when a check grid lets its writer launch):
    every combination writes exactly what the default does (MLA, copies and fp8 writes), including
    a partial last row group."""
    import itertools

    tune = torch.ops.kv_oracle_cuda.tune
    ops = _ops()
    nope, rope = _rand((n, 512), torch.bfloat16, 4), _rand((n, 64), torch.bfloat16, 5)
    k, v = _rand((n, 8, 128), torch.bfloat16, 6), _rand((n, 8, 128), torch.bfloat16, 7)
    loc = _slots(n, 2 * n + 5, 8)
    buf, kc = _rand((2 * n + 5, 576), torch.bfloat16, 9), _rand((2 * n + 5, 8, 128), torch.bfloat16, 10)
    want_mla, want_k = buf.clone(), kc.clone()
    want_mla[loc] = torch.cat([nope, rope], dim=1)
    want_k[loc] = k
    blocks = (2 * n + 5 + 15) // 16
    scale = torch.tensor([0.25], device="cuda")
    fp8_caches = (torch.zeros((blocks, 16, 8, 128), dtype=torch.uint8, device="cuda"),) * 2
    knobs = ("mla_rows", "mla_warps", "mla_grid", "mla_evict_first", "copy_grid", "fp8_grid", "mla_prefetch",
             "copy_prefetch", "fp8_prefetch", "check_early", "check_fold", "check_fold_blocks", "mla_check_in_grid",
             "mla_check_deadline_us", "lean_unchecked", "lean_verdict")
    defaults = {name: tune(name, 1 if name in ("mla_rows", "mla_warps") else 0) for name in knobs}
    for name, value in defaults.items():
        tune(name, value)
    want_k8, want_v8 = (c.clone() for c in fp8_caches)
    ops.reshape_and_cache_flash(k, v, want_k8, want_v8, loc, "fp8_e4m3", scale, scale)
    try:
        for i, (rows, warps, grid) in enumerate(itertools.product((1, 2, 4), (1, 2, 4, 8), (-1, 0, 4))):
            settings = {"mla_rows": rows, "mla_warps": warps, "mla_grid": grid, "mla_evict_first": i % 4,
                        "copy_grid": grid, "fp8_grid": grid, "mla_prefetch": i % 3, "copy_prefetch": i % 3,
                        "fp8_prefetch": (i + 1) % 3, "check_early": (i // 2) % 2,
                        "mla_check_in_grid": (i // 3) % 2, "mla_check_deadline_us": 50 * ((i // 2) % 2), "lean_unchecked": (i // 5) % 4,
                        "lean_verdict": (i // 7) % 4, "check_fold": (i // 11) % 4,
                        "check_fold_blocks": 32 * ((i // 13) % 2)}
            pdl = i % 2 == 1  # the PDL prologue under every launch shape too, with every prefetch mode
            for name, value in settings.items():
                tune(name, value)
            got_tma, got_direct, got_k, got_v = buf.clone(), buf.clone(), kc.clone(), kc.clone()
            ops.set_mla_kv_buffer(got_tma, loc, nope, rope, "tma", 16, pdl)
            ops.set_mla_kv_buffer(got_direct, loc, nope, rope, "direct", 16, pdl)
            ops.store_cache(k, v, got_k, got_v, loc, 16, pdl)
            got_k8, got_v8 = (c.clone() for c in fp8_caches)
            ops.reshape_and_cache_flash(k, v, got_k8, got_v8, loc, "fp8_e4m3", scale, scale, 16, pdl)
            torch.cuda.synchronize()
            assert _same_bytes(got_tma, want_mla), settings
            assert _same_bytes(got_direct, want_mla), settings
            assert _same_bytes(got_k, want_k), settings
            assert _same_bytes(got_k8, want_k8) and _same_bytes(got_v8, want_v8), settings
    finally:
        for name, value in defaults.items():
            tune(name, value)
    with pytest.raises(ValueError, match="knob='mla_stages' is not one of"):
        tune("mla_stages", 1)
    with pytest.raises(ValueError, match="value=3 is out of range for knob 'mla_rows'"):
        tune("mla_rows", 3)
    assert tune("mla_rows", defaults["mla_rows"]) == defaults["mla_rows"]  # nothing changed it


@gpu
@pytest.mark.parametrize("n", [1, 7, 4096, 65536])
@pytest.mark.parametrize("shape,dtype", [((512, 64), torch.bfloat16), ((528, 128), torch.uint8),
                                         ((512, 64), torch.float32), ((511, 65), torch.bfloat16),
                                         ((97, 31), torch.float16)])
def test_mla_every_path_and_width(n, shape, dtype):
    nope_w, rope_w = shape
    ops = _ops()
    num_slots = 2 * n + 3
    fused = _rand((n, 16 + nope_w + rope_w + 16), dtype, 1)  # row-strided parts of one tensor
    nope, rope = fused[:, 16:16 + nope_w], fused[:, 16 + nope_w:16 + nope_w + rope_w]
    loc = _slots(n, num_slots, 2)
    base = _rand((num_slots, nope_w + rope_w + 16), dtype, 3)  # 16 spare elements: rows stay 16-byte aligned
    want = base.clone()
    want[loc, :nope_w + rope_w] = torch.cat([nope, rope], dim=1)
    ran = []
    for path in ("auto", "tma", "direct"):
        for max_vec in (16, 8, 4, 2, 1):
            try:
                plan = ops.mla_plan(base, loc, nope, rope, path, max_vec)
            except ValueError:
                assert path == "tma"
                continue
            got = base.clone()
            ops.set_mla_kv_buffer(got, loc, nope, rope, path, max_vec)
            torch.cuda.synchronize()
            assert _same_bytes(got, want), f"{plan} (path={path}, max_vec={max_vec}) differs"
            ran.append(plan)
    assert any(p.startswith("direct") for p in ran)
    row_bytes = (nope_w + rope_w) * base.element_size()
    assert any(p.startswith("tma") for p in ran) == (row_bytes % 16 == 0)


@gpu
def test_mla_auto_path_is_direct_at_16_bytes_else_the_bulk_copy_where_it_fits():
    """auto: the direct path where it moves 16-byte vectors (the bench workload), the TMA bulk copy
    where only the sources are less aligned (the stores stay whole rows), direct where neither."""
    n = 16384
    ops = _ops()
    buf = torch.zeros((2 * n, 576), dtype=torch.bfloat16, device="cuda")
    nope, rope = _rand((n, 512), torch.bfloat16, 1), _rand((n, 64), torch.bfloat16, 2)
    loc = _slots(n, 2 * n, 3)
    assert ops.mla_plan(buf, loc, nope, rope, "auto", 16) == "direct vec=16"
    shifted = _rand((n, 4 + 512), torch.bfloat16, 4)[:, 4:]  # rows start 8 bytes into 16
    assert ops.mla_plan(buf, loc, shifted, rope, "auto", 16) == "tma load=8"
    assert ops.mla_plan(buf, loc, nope, rope, "auto", 8) == "direct vec=8"  # capped: nothing to gain
    odd = torch.zeros((2 * n, 577), dtype=torch.bfloat16, device="cuda")  # rows 1154 bytes apart
    assert ops.mla_plan(odd, loc, nope, rope, "auto", 16) == "direct vec=2"


@gpu
@pytest.mark.parametrize("n", [1, 133, 65536])
@pytest.mark.parametrize("case", ["dense_bf16", "strided_heads_bf16", "odd_u8", "f32_wide", "k_v_differ"])
def test_store_cache_every_width(n, case):
    ops = _ops()
    num_slots = 2 * n + 5
    whole = slice(None)
    # (source, cache allocation, view of the allocation) per side; a cache view is rebuilt on a
    # fresh clone of its allocation for every width, so its strides are the ones under test
    if case == "dense_bf16":
        sides = [(_rand((n, 8, 128), torch.bfloat16, 1), _rand((num_slots, 8, 128), torch.bfloat16, 3), whole),
                 (_rand((n, 8, 128), torch.bfloat16, 2), _rand((num_slots, 8, 128), torch.bfloat16, 4), whole)]
    elif case == "strided_heads_bf16":  # heads 192 / 160 elements apart, 96 used: no dense collapse
        sides = [(_rand((n, 4, 192), torch.bfloat16, 1)[:, :, :96], _rand((num_slots, 4, 96), torch.bfloat16, 3),
                  whole),
                 (_rand((n, 4, 192), torch.bfloat16, 2)[:, :, 32:128],
                  _rand((num_slots, 4, 160), torch.bfloat16, 4), (whole, whole, slice(0, 96)))]
    elif case == "odd_u8":
        sides = [(_rand((n, 1, 97), torch.uint8, 1), _rand((num_slots, 1, 97), torch.uint8, 3), whole),
                 (_rand((n, 1, 97), torch.uint8, 2), _rand((num_slots, 1, 97), torch.uint8, 4), whole)]
    elif case == "f32_wide":  # 16 KiB rows: several unrolled batches per warp
        sides = [(_rand((n, 32, 128), torch.float32, 1), _rand((num_slots, 32, 128), torch.float32, 3), whole),
                 (_rand((n, 32, 128), torch.float32, 2), _rand((num_slots, 32, 128), torch.float32, 4), whole)]
    else:  # K and V rows of different widths and dtypes
        sides = [(_rand((n, 2, 64), torch.float16, 1), _rand((num_slots, 2, 64), torch.float16, 3), whole),
                 (_rand((n, 3, 40), torch.uint8, 2), _rand((num_slots, 3, 40), torch.uint8, 4), whole)]
    loc = _slots(n, num_slots, 5, torch.int32)
    wants = []
    for src, alloc, view in sides:
        want = alloc.clone()[view]
        want[loc.long()] = src
        wants.append(want)
    (k, _, _), (v, _, _) = sides
    for max_vec in (16, 8, 4, 2, 1):
        got_k, got_v = (alloc.clone()[view] for _, alloc, view in sides)
        plan = ops.store_plan(k, v, got_k, got_v, loc, max_vec)
        ops.store_cache(k, v, got_k, got_v, loc, max_vec)
        torch.cuda.synchronize()
        assert _same_bytes(got_k, wants[0]) and _same_bytes(got_v, wants[1]), f"{plan} differs"
    if case == "strided_heads_bf16":
        assert "heads=4/4" in ops.store_plan(k, v, got_k, got_v, loc, 16)


def _fp8_values(shape, seed):
    """Random values plus the special cases every row: overflow, +-inf, NaN, ties, tiny values."""
    x = torch.randn(shape, generator=_gen(seed)) * 50
    specials = torch.tensor([464.0, -464.0, 465.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan"),
                             -float("nan"), 0.0, -0.0, 2.0 ** -10, 2.0 ** -17, 57344.0, 61440.0, 1e-30])
    flat = x.view(-1)
    flat[:specials.numel()] = specials
    return x


@gpu
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "auto"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scale_kind", ["one", "tensor", "head"])
def test_reshape_and_cache_flash_vs_reference(fmt, dtype, layout, scale_kind):
    from oracle import reference
    from oracle.buffers import to_numpy

    ops = _ops()
    n, heads, dim, block = 300, 4, 128, 16
    num_blocks = (2 * n + block - 1) // block + 1
    key = _fp8_values((n + 5, heads, dim), 1).to(dtype).cuda()
    value = _fp8_values((n + 5, heads, dim), 2).to(dtype).cuda()
    cache_dtype = torch.uint8 if fmt != "auto" else dtype
    alloc = (num_blocks, block, heads, dim) if layout == "NHD" else (num_blocks, heads, block, dim)
    caches = [(_rand(alloc, torch.uint8, 10 + i) if cache_dtype == torch.uint8 else _rand(alloc, dtype, 10 + i))
              for i in range(2)]
    if layout == "HND":
        caches = [c.permute(0, 2, 1, 3) for c in caches]
    slots = _slots(n, num_blocks * block, 3)
    slots[::7] = -1  # padding
    if scale_kind == "one":
        k_scale = v_scale = torch.ones(1, device="cuda")
    elif scale_kind == "tensor":
        k_scale, v_scale = torch.tensor([0.0123], device="cuda"), torch.tensor([0.0321], device="cuda")
    else:
        k_scale = torch.linspace(0.01, 0.05, heads, device="cuda")
        v_scale = torch.linspace(0.02, 0.5, heads, device="cuda")
    numpy_caches = [to_numpy(c) for c in caches]
    want_k, want_v = reference.reshape_and_cache_flash(
        numpy_caches[0], numpy_caches[1], to_numpy(slots), to_numpy(key)[:n], to_numpy(value)[:n],
        kv_cache_dtype=fmt, k_scale=to_numpy(k_scale), v_scale=to_numpy(v_scale), layout="NHD",
        padding="negative", **({"preset": "cuda_satfinite"} if fmt != "auto" else {}))
    for max_vec in (16, 1):
        got = [c.clone() for c in caches]  # clone keeps the permuted strides
        plan = ops.paged_plan(key, value, got[0], got[1], slots, fmt, k_scale, v_scale, max_vec)
        ops.reshape_and_cache_flash(key, value, got[0], got[1], slots, fmt, k_scale, v_scale, max_vec)
        torch.cuda.synchronize()
        for name, g, w in (("key_cache", got[0], want_k), ("value_cache", got[1], want_v)):
            actual = to_numpy(g)
            expected = np.asarray(w)
            bad = np.nonzero(actual.view(np.uint8).reshape(-1) != expected.view(np.uint8).reshape(-1))[0]
            assert bad.size == 0, f"{name} ({plan}): {bad.size} bytes differ, first at byte {bad[0]}"


# Scales on both sides of the bounds of the fp8 writer's prepared division (fp8.cu, Fp8Divisor:
# [2^-32, 2^32] divides directly, others are first brought into range by a power of two), powers
# of two, the float32 extremes and subnormals.
DIVISION_SCALES = [1.0, 0.0123, 1 / 3, 0.75, 3.0, 448.0, 2.0 ** -32, 2.0 ** -32 * 0.9999, 2.0 ** 32,
                   2.0 ** 32 * 1.0001, 2.0 ** -126, 1.5e-38, 1e-40, 1e-45, 3e38, 2.0 ** 127, 7e-20, 5e20]


@gpu
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_division_every_source_value(fmt, dtype):
    """Every bf16 and fp16 bit pattern (2^20 random ones for float32) divided by every scale of
    DIVISION_SCALES, per tensor (dense rows) and per head (one head per scale), gives the
    reference's codes: the prepared division agrees with IEEE division wherever a code can tell."""
    from oracle import reference
    from oracle.buffers import to_numpy

    ops = _ops()
    heads, dim = len(DIVISION_SCALES), 128
    if dtype == torch.float32:
        bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 20,), generator=_gen(7), dtype=torch.int64).to(torch.int32)
        values = bits.view(torch.float32)
    else:
        values = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    n = values.numel() // (heads * dim) + 1
    flat = torch.empty(n * heads * dim, dtype=dtype)
    flat[:values.numel()] = values
    flat[values.numel():] = values[:flat.numel() - values.numel()]
    key = flat.view(n, heads, dim).cuda()
    value = key.roll(1, dims=0)
    block = 16
    num_blocks = (2 * n + block - 1) // block
    slots = _slots(n, num_blocks * block, 3)
    per_head = torch.tensor(DIVISION_SCALES, dtype=torch.float32, device="cuda")
    for scales in [per_head] + [per_head[i:i + 1] for i in range(heads)]:
        caches = [_rand((num_blocks, block, heads, dim), torch.uint8, 10 + i) for i in range(2)]
        want_k, want_v = reference.reshape_and_cache_flash(
            to_numpy(caches[0]), to_numpy(caches[1]), to_numpy(slots), to_numpy(key), to_numpy(value),
            kv_cache_dtype=fmt, k_scale=to_numpy(scales), v_scale=to_numpy(scales), layout="NHD",
            padding="negative", preset="cuda_satfinite")
        for max_vec in (16, 1):
            got = [c.clone() for c in caches]
            ops.reshape_and_cache_flash(key, value, got[0], got[1], slots, fmt, scales, scales, max_vec)
            torch.cuda.synchronize()
            for name, g, w in (("key_cache", got[0], want_k), ("value_cache", got[1], want_v)):
                actual = to_numpy(g).reshape(-1)
                bad = np.nonzero(actual != np.asarray(w).view(np.uint8).reshape(-1))[0]
                assert bad.size == 0, (f"{name}, scales {to_numpy(scales)[:3]}..., max_vec {max_vec}: "
                                       f"{bad.size} bytes differ, first at byte {bad[0]}")


@gpu
def test_fnuz_is_refused():
    key = _rand((4, 1, 16), torch.bfloat16, 1)
    cache = torch.zeros((2, 16, 1, 16), dtype=torch.uint8, device="cuda")
    scale = torch.ones(1, device="cuda")
    with pytest.raises(NotImplementedError):
        _ops().reshape_and_cache_flash(key, key, cache, cache.clone(), _slots(4, 32, 1), "e4m3fnuz", scale, scale)


@gpu
def test_out_of_range_slot_is_rejected_before_any_write():
    ops = _ops()
    k = _rand((8, 4, 32), torch.bfloat16, 1)
    kc, vc = _rand((20, 4, 32), torch.bfloat16, 2), _rand((20, 4, 32), torch.bfloat16, 3)
    loc = _slots(8, 20, 4)
    loc[5] = 20
    before = (kc.clone(), vc.clone())
    # checked on the device: the call returns, writes nothing, and the error waits in the mailbox
    ops.store_cache(k, k, kc, vc, loc)
    with pytest.raises(ValueError, match=r"loc\[5\] = 20 is out of range \[0, 20\)"):
        oracle.kernels.raise_deferred_errors()
    loc[5] = -1
    ops.store_cache(k, k, kc, vc, loc)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"loc\[5\] = -1 is out of range \[0, 20\)"):
        cuda_kernels.store_cache(k, k, kc, vc, loc)  # the next validating call raises the earlier error
    oracle.kernels.raise_deferred_errors()  # the call that raised launched nothing: nothing pending
    assert _same_bytes(kc, before[0]) and _same_bytes(vc, before[1])


@gpu
def test_cuda_graph_capture_and_replay():
    """Under capture the slot check is skipped (reading the index would break the capture); a
    replay with new slots writes where they say."""
    ops = _ops()
    n = 1024
    nope, rope = _rand((n, 512), torch.bfloat16, 1), _rand((n, 64), torch.bfloat16, 2)
    buf = torch.zeros((2 * n, 576), dtype=torch.bfloat16, device="cuda")
    k = _rand((n, 8, 128), torch.bfloat16, 3)
    kc, vc = (torch.zeros((2 * n, 8, 128), dtype=torch.bfloat16, device="cuda") for _ in range(2))
    key_cache = torch.zeros((2 * n // 16, 16, 8, 128), dtype=torch.uint8, device="cuda")
    value_cache = key_cache.clone()
    scale = torch.tensor([0.0123], device="cuda")
    loc = _slots(n, 2 * n, 4)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as torch recommends
        ops.set_mla_kv_buffer(buf, loc, nope, rope)
        ops.store_cache(k, k, kc, vc, loc)
        ops.reshape_and_cache_flash(k, k, key_cache, value_cache, loc, "fp8", scale, scale)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.set_mla_kv_buffer(buf, loc, nope, rope)
        ops.store_cache(k, k, kc, vc, loc)
        ops.reshape_and_cache_flash(k, k, key_cache, value_cache, loc, "fp8", scale, scale)
    for seed in (5, 6):
        loc.copy_(_slots(n, 2 * n, seed))
        for t in (buf, kc, vc, key_cache, value_cache):
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        want = torch.zeros_like(buf)
        want[loc] = torch.cat([nope, rope], dim=1)
        assert _same_bytes(buf, want)
        want_k = torch.zeros_like(kc)
        want_k[loc] = k
        assert _same_bytes(kc, want_k) and _same_bytes(vc, want_k)
        assert int(key_cache.view(-1, 8, 128)[loc].ne(0).sum()) > 0


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


@gpu
def test_pdl_launches_write_right_eagerly_and_replayed_from_a_graph():
    """``pdl=True``: chained writes whose second reads what the first wrote see it, eagerly and from
    a replayed graph (tests/pdl_chain.py), for the MLA writer and the paged copy kernel, validating
    and not. Validating, eagerly the 32768-entry index takes the check grid, in both of its orders
    (``check_early``): the writer launched after the check's own wait, loading its first row before
    its own, or launched at once, while the write before it may still run; the 4096-entry one the
    MLA writer checks inside its own grid (mla_checked.cu), whose next launch is let in after its
    barrier. With check reuse on (the default, oracle.kernels.check_reuse) the second write of an
    index reads the verdict its first call's check left, in place of a check grid."""
    import functools

    from oracle.kernels import check_reuse
    from pdl_chain import check_chained_writes

    tune = _ops().tune
    default = tune("check_early", 0)
    try:
        for validate, early, n, reuse in ((True, 0, 32768, False), (True, 1, 32768, False), (True, 0, 4096, False),
                                          (True, 1, 32768, True), (False, 0, 32768, True)):
            tune("check_early", early)
            check_reuse.set_enabled(reuse)
            check_chained_writes(functools.partial(cuda_kernels.set_mla_kv_buffer, pdl=True, validate=validate),
                                 functools.partial(cuda_kernels.store_cache, pdl=True, validate=validate), n=n)
    finally:
        tune("check_early", default)
        check_reuse.set_enabled(True)


@gpu
@pytest.mark.parametrize("fmt", ["e4m3fn", "auto"])
def test_pdl_paged_write_matches_the_plain_launch(fmt):
    """reshape_and_cache_flash launched with PDL writes exactly what the plain launch writes."""
    torch.manual_seed(3)
    n, blocks = 4099, 600
    key, value = (torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16) * 50 for _ in range(2))
    cache_dtype = torch.uint8 if fmt != "auto" else torch.bfloat16
    slots = torch.randperm(blocks * 16, device="cuda")[:n]
    slots[::97] = -1
    scale = torch.tensor([0.37], device="cuda")
    out = []
    for pdl in (False, True):
        caches = [torch.full((blocks, 16, 8, 128), 7, device="cuda", dtype=cache_dtype) for _ in range(2)]
        cuda_kernels.reshape_and_cache_flash(key, value, *caches, slots, fmt, scale, scale, pdl=pdl)
        out.append(caches)
    torch.cuda.synchronize()
    for plain, pdl in zip(*out):
        assert torch.equal(plain.view(torch.uint8), pdl.view(torch.uint8))
    assert not torch.equal(out[0][0].view(torch.uint8), torch.full_like(out[0][0], 7).view(torch.uint8))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_opcheck_store_cache(dtype):
    n, slots = 16, 40
    k, v = _rand((n, 4, 64), dtype, 1), _rand((n, 4, 64), dtype, 2)
    kc, vc = _rand((slots, 4, 64), dtype, 3), _rand((slots, 4, 64), dtype, 4)
    _opcheck(_ops().store_cache.default, (k, v, kc, vc, _slots(n, slots, 5)))


@gpu
@pytest.mark.parametrize("path,pdl", [("auto", False), ("direct", False), ("auto", True)])
def test_opcheck_set_mla_kv_buffer(path, pdl):
    n, slots = 16, 40
    fused = _rand((n, 640), torch.bfloat16, 1)
    nope, rope = fused[:, :512], fused[:, 512:576]
    buf = _rand((slots, 576), torch.bfloat16, 2)
    _opcheck(_ops().set_mla_kv_buffer.default, (buf, _slots(n, slots, 3, torch.int32), nope, rope, path, 16, pdl))


@gpu
@pytest.mark.parametrize("fmt,scale_len", [("auto", 1), ("fp8", 1), ("fp8_e5m2", 4)])
def test_opcheck_reshape_and_cache_flash(fmt, scale_len):
    n, heads, dim = 16, 4, 64
    key, value = _rand((n, heads, dim), torch.bfloat16, 1), _rand((n, heads, dim), torch.bfloat16, 2)
    cache_dtype = torch.bfloat16 if fmt == "auto" else torch.uint8
    kc = torch.zeros((4, 16, heads, dim), dtype=cache_dtype, device="cuda")
    vc = torch.zeros((4, heads, 16, dim), dtype=cache_dtype, device="cuda").permute(0, 2, 1, 3)
    scale = torch.full((scale_len,), 0.05, device="cuda")
    slots = _slots(n, 64, 3)
    slots[3] = -1
    _opcheck(_ops().reshape_and_cache_flash.default, (key, value, kc, vc, slots, fmt, scale, scale))


@gpu
def test_registered_functions_run_through_the_suite_conventions():
    """The Python wrappers take the torch baseline's positional arguments."""
    n = 33
    k = _rand((n, 8, 128), torch.bfloat16, 1)
    kc, vc = torch.zeros((80, 8, 128), dtype=torch.bfloat16, device="cuda"), torch.zeros(
        (80, 8, 128), dtype=torch.bfloat16, device="cuda")
    loc = _slots(n, 80, 2)
    cuda_kernels.store_cache(k, k, kc, vc, loc)
    cuda_kernels.reshape_and_cache_flash(k, k, kc.view(5, 16, 8, 128), vc.view(5, 16, 8, 128), loc, "auto", 1.0, 1.0)
    torch.cuda.synchronize()
    want = torch.zeros_like(kc)
    want[loc] = k
    assert _same_bytes(kc, want) and _same_bytes(vc, want)


@gpu
@pytest.mark.parametrize("n", [257, 4097, 70000])
@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("fold", [1, 0], ids=["folded", "words"])
def test_the_device_slot_check_holds_call_after_call(n, pdl, fold):
    """A long index is checked by a check grid whose verdict (a word per block, folded into one or
    not: check_fold, forced at every size with check_fold_blocks 0; one buffer per stream reused by
    every call) the writer reads after its wait: three
    calls back to back, legal, illegal in several places, legal, with no synchronization between
    them (the third may raise the second's error at its start, as the contract allows; it is then
    issued again). The legal calls write their rows, the illegal one writes nothing, its error
    names its first illegal entry, and a fourth call (the illegal entry first) reads its own
    verdict."""
    default = _ops().tune("check_fold", 3 if fold else 0)
    default_blocks = _ops().tune("check_fold_blocks", 0)
    try:
        _device_slot_check_call_after_call(n, pdl)
    finally:
        _ops().tune("check_fold", default)
        _ops().tune("check_fold_blocks", default_blocks)


def _device_slot_check_call_after_call(n: int, pdl: bool) -> None:
    gen = torch.Generator().manual_seed(n)
    num_slots = 4 * n + 64
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).cuda()
    sets = [perm[i * n:(i + 1) * n] for i in range(3)]
    nope = [torch.randn(n, 512, generator=gen).to("cuda", torch.bfloat16) for _ in range(3)]
    rope = [torch.randn(n, 64, generator=gen).to("cuda", torch.bfloat16) for _ in range(3)]
    buf = torch.full((num_slots, 576), 3.0, dtype=torch.bfloat16, device="cuda")
    bad = sets[1].clone()
    places = sorted({n - 1, n // 2, n // 3 + 1})
    for where in places:
        bad[where] = num_slots + where
    for i, loc in enumerate((sets[0], bad)):
        cuda_kernels.set_mla_kv_buffer(buf, loc, nope[i], rope[i], pdl=pdl)
    try:  # the third call raises the second's error first if the GPU has already left it (no launch)
        cuda_kernels.set_mla_kv_buffer(buf, sets[2], nope[2], rope[2], pdl=pdl)
        raised = None
    except oracle.kernels.DeferredSlotError as exc:
        raised = str(exc)
        cuda_kernels.set_mla_kv_buffer(buf, sets[2], nope[2], rope[2], pdl=pdl)
    if raised is None:
        with pytest.raises(oracle.kernels.DeferredSlotError) as caught:
            oracle.kernels.raise_deferred_errors()
        raised = str(caught.value)
    assert raised.startswith(f"loc[{places[0]}] = {num_slots + places[0]} is out of range"), raised
    oracle.kernels.raise_deferred_errors()  # nothing else pending
    for i in (0, 2):
        assert torch.equal(buf[sets[i]], torch.cat([nope[i], rope[i]], 1)), i
    untouched = torch.ones(num_slots, dtype=torch.bool, device="cuda")
    untouched[sets[0]] = False
    untouched[sets[2]] = False
    assert bool(buf[untouched].eq(3.0).all()), "the illegal call wrote rows"
    first = sets[2].clone()
    first[0] = -1
    cuda_kernels.set_mla_kv_buffer(buf, first, nope[0], rope[0], pdl=pdl)
    with pytest.raises(oracle.kernels.DeferredSlotError, match=r"loc\[0\] = -1 is out of range"):
        oracle.kernels.raise_deferred_errors()
    assert torch.equal(buf[sets[2]], torch.cat([nope[2], rope[2]], 1)), "the fourth call wrote rows"
