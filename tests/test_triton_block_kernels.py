"""The block-scaled Triton writers (oracle.kernels.triton.block_ops: MXFP8, NVFP4) on Triton's CPU
interpreter, byte for byte against oracle.reference.block_scaled.

The interpreter is chosen when the kernels are defined, so each test runs one scenario of this
file in a subprocess with TRITON_INTERPRET=1 (as tests/test_triton_kernels.py does), which prints
one JSON object for the test to check; where pytest itself runs with TRITON_INTERPRET=1 (so the
kernels here are interpreted), the scenario runs in this process instead. Every output lives in a
poisoned allocation with guard bytes on both sides, and the whole allocation is compared with the
reference applied to a copy of it, so a byte written where nothing should be (a guard, the gap of
a padded stride, a padding slot, a swizzled page's unmapped bytes) fails like a wrong code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not importable (pip install triton==3.6.0)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4")
DTYPES = ("float32", "float16", "bfloat16")
DIMS = (128, 40, 72)  # D = 40, 72: the last block of each head is shorter


def _interpreting_here() -> bool:
    """Whether this process already runs Triton on the interpreter (TRITON_INTERPRET=1 set before
    any kernel was defined): then the scenarios run in it, saving a subprocess's torch import."""
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "on", "yes"):
        return False
    from oracle.kernels.triton import _runtime

    return _runtime.interpreting()


def run(*argv: str, script: str = __file__, scope: dict | None = None) -> dict:
    """Scenario ``argv[0]`` (arguments ``argv[1:]``) of the test file ``script`` (its functions
    ``scope``; default this file) on the interpreter: here when this process interprets, else in a
    subprocess with TRITON_INTERPRET=1."""
    if _interpreting_here():
        return json.loads(json.dumps((scope or globals())["scenario_" + argv[0]](*argv[1:])))
    env = {k: v for k, v in os.environ.items() if k != "ORACLE_PLUGINS"}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(script), *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"scenario failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


# --- the tests (parent process) ---------------------------------------------------------------

def test_conversion_helpers_match_ml_dtypes_on_every_16_bit_pattern():
    out = run("helpers")
    assert out["widen"] == {"float16": 0, "bfloat16": 0, "float32": 0}, out  # exact widening
    for src in ("float16", "bfloat16", "float32"):
        assert out[src] == {"e4m3fn": 0, "e5m2": 0, "e2m1": 0}, (src, out[src])
    assert out["floor_log2"] == 0 and out["e4m3_values"] == 0, out
    assert out["patterns"] == {"float16": 65536, "bfloat16": 65536, "float32": out["patterns"]["float32"]}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available() and not _interpreting_here()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (the compiled kernels; CPU runs use the interpreter)")
def test_conversion_helpers_on_a_gpu_match_ml_dtypes():
    """The same probe compiled for the GPU: the integer roundings, and on sm_89+ the hardware
    conversion the writers use there, code for code against ml_dtypes."""
    out = scenario_helpers("cuda")
    want = {"e4m3fn": 0, "e5m2": 0, "e2m1": 0}
    if out["hardware"]:
        want.update({"e4m3fn hw": 0, "e5m2 hw": 0})
    for src in ("float16", "bfloat16", "float32"):
        assert out[src] == want, (src, out[src])
    assert out["widen"] == {"float16": 0, "bfloat16": 0, "float32": 0}, out
    assert out["floor_log2"] == 0 and out["e4m3_values"] == 0, out


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (the compiled kernels; CPU runs use the interpreter)")
@pytest.mark.parametrize("fmt", FORMATS)
def test_block_writers_on_a_gpu_match_reference(fmt):
    """quantize_block and reshape_and_cache_block compiled for the GPU (hardware fp8 where it has
    it), every poisoned allocation compared whole with the reference."""
    q, p = scenario_quantize(fmt, "cuda"), scenario_paged(fmt, "cuda")
    assert q["bad"] == [] and p["bad"] == [], (q["bad"], p["bad"])
    assert q["cases"] == len(DTYPES) * len(DIMS) * 2 and p["cases"] == len(DTYPES) * len(DIMS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_block_matches_reference(fmt):
    out = run("quantize", fmt)
    assert out["cases"] == len(DTYPES) * len(DIMS) * 2
    assert out["bad"] == [], out["bad"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_reshape_and_cache_block_matches_reference(fmt):
    out = run("paged", fmt)
    assert out["cases"] == len(DTYPES) * len(DIMS)
    assert out["bad"] == [], out["bad"]
    # swizzled pages with unmapped rows/columns and padded rows were exercised, and stayed poisoned
    assert out["unmapped_checked"] > 0


@pytest.mark.parametrize("fmt", ("mxfp8_e4m3fn", "nvfp4"))
def test_aliased_caches_keep_the_value_side(fmt):
    # aliased: K's launch, then V's; caches apart: both sides in one launch
    assert run("aliased", fmt) == {"bad": [], "sides per launch": [1, 1, 2], "aliased launches": 2}


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (the compiled kernels; CPU runs use the interpreter)")
@pytest.mark.parametrize("fmt", ("mxfp8_e4m3fn", "nvfp4"))
def test_aliased_caches_keep_the_value_side_on_a_gpu(fmt):
    """On a GPU the programs of one launch run in any order: aliased caches take two launches."""
    assert scenario_aliased(fmt, "cuda")["bad"] == []


@pytest.mark.parametrize("fmt", ("mxfp8_e4m3fn", "nvfp4"))
def test_the_64_bit_row_path_matches_reference(fmt):
    """The kernels' int64 row and slot arithmetic (taken for rows or slots past 2**31), forced."""
    out = run("paged_wide", fmt)
    assert out["cases"] == len(DTYPES) * len(DIMS) and out["bad"] == [], out["bad"]


def test_bad_input_names_the_argument_and_writes_nothing():
    out = run("bad")
    assert out["untouched"], out
    for case, (kind, message, argument) in out["errors"].items():
        # DeferredSlotError: a ValueError the device check left (slots, per-tensor scales)
        assert kind in ("TypeError", "ValueError", "DeferredSlotError"), (case, kind, message)
        assert argument in message, (case, message)


def test_offsets_past_2_31_bytes():
    out = run("large")
    assert out == {"codes": True, "scales": True, "canary": True}, out


# --- the scenarios (subprocess, TRITON_INTERPRET=1) ---------------------------------------------

GUARD = 64


class Arena:
    """Poisoned allocations (random bytes, ``GUARD`` guard bytes each side) and, for each, a numpy
    twin that the reference's results are written into."""

    def __init__(self, rng, device: str = "cpu"):
        self.rng, self.device, self.bufs, self.twins = rng, device, [], []

    def view(self, shape, strides):
        """A uint8 view ``shape``/``strides`` into a fresh poisoned allocation, and its twin."""
        import torch

        span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 0
        buf = torch.from_numpy(self.rng.integers(0, 256, span + 2 * GUARD, dtype=np.uint8)).to(self.device)
        twin = buf.cpu().numpy().copy()
        self.bufs.append(buf)
        self.twins.append(twin)
        return (torch.as_strided(buf, shape, strides, GUARD),
                np.lib.stride_tricks.as_strided(twin[GUARD:], shape, strides))

    def mismatches(self) -> list:
        """(allocation, count, first offsets) of every allocation that differs from its twin."""
        out = []
        for i, (buf, twin) in enumerate(zip(self.bufs, self.twins)):
            diff = np.flatnonzero(buf.cpu().numpy() != twin)
            if diff.size:
                out.append([i, int(diff.size), (diff[:4] - GUARD).tolist()])
        return out


def _values(rng, fmt: str, shape: tuple, dtype, nonfinite: str = "nan"):
    """float32 values ``[N, H, D]`` cast to ``dtype``: rows of random magnitudes (2**-40..2**40),
    and rows of special values: exact rounding ties of the element format at a power-of-two
    block scale, +-0, all-zero blocks, huge and tiny values, float32 subnormals, and by
    ``nonfinite``: "nan" NaN (both signs) and +-inf, "inf" +-inf alone, "none" neither (the
    kernels' plain path takes tiles with no NaN, for MXFP8 no inf either)."""
    import torch
    from oracle.reference import fp8, nvfp4

    n, h, d = shape
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-40, 40, (n, h, 1)))
    if fmt == "nvfp4":
        grid = nvfp4.E2M1_MAGNITUDES.astype(np.float64)
        top = 6.0  # amax 6 * 2**s: sfq = 2**s, out = 2**-s, so x * out is the tie itself
    else:
        grid = np.sort(fp8.code_values(fmt[6:])[:0x7F].astype(np.float64))
        grid = grid[np.isfinite(grid) & (grid >= 0)]
        top = float(grid[-1])
        grid = np.concatenate([grid, [top * 1.0625, top * 1.1]])  # past max: saturation, the tie above
    ties = np.concatenate([(grid[:-1] + grid[1:]) / 2, grid])
    specials = np.array([0.0, -0.0, 3.0e38, -3.4e38, 1e-30, 1e-45, -1e-40, 1.17e-38, 65504.0, 1.0]
                        + {"nan": [np.nan, -np.nan, np.inf, -np.inf], "inf": [np.inf, -np.inf], "none": []}[nonfinite],
                        dtype=np.float64)
    for row in rng.permutation(n * h)[: max(2, n * h // 3)]:
        t, hh = divmod(int(row), h)
        kind = rng.integers(0, 3)
        if kind == 0:  # ties at block scale 2**s; the block's first element fixes amax
            s = int(rng.integers(-4, 5))
            picks = rng.choice(ties, d) * rng.choice([-1.0, 1.0], d)
            picks[:: 16 if fmt == "nvfp4" else 32] = top
            x[t, hh] = picks * 2.0 ** s
        elif kind == 1:
            x[t, hh] = np.where(rng.random(d) < 0.5, rng.choice(specials, d), 0.0)  # zero blocks too
        else:
            x[t, hh, : d // 2] = 0.0  # a zero first half, specials after
            x[t, hh, d // 2:] = rng.choice(specials, d - d // 2)
    return torch.from_numpy(x.astype(np.float32)).to(getattr(torch, dtype))


def _strided(x, how: int):
    """``x`` as a view with other strides: 0 contiguous, 1 a slice of wider rows (a fused qkv), 2
    heads-major storage (stride(1) > stride(0))."""
    import torch

    n, h, d = x.shape
    if how == 1:
        wide = x.new_full((n + 1, h, d + 24), float("nan"))
        wide[:n, :, 8:8 + d] = x
        return wide[:n, :, 8:8 + d]
    if how == 2:
        return x.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    return x


def _global_scale(rng, x, i: int):
    import torch

    finite = x.float().abs()
    amax = float(finite[torch.isfinite(finite)].max())
    # vLLM's calibrated 448 * 6 / amax, other non-powers of two (6.1e-39: a float32 subnormal,
    # 1 / gs near float32's largest), and powers of two, under which the NVFP4 tie rows are exact
    choices = (448 * 6 / amax if amax > 0 else 1.0, 1.0, 0.37, 4.0, 3.3e-5, 0.5, 1.7e7, 6.1e-39)
    return torch.tensor([choices[i % len(choices)]], dtype=torch.float32)


def _hardware_fp8(device: str) -> bool:
    import torch

    from oracle.kernels.triton import block_ops

    return block_ops.hardware_fp8(torch.device(device, torch.cuda.current_device()))


def scenario_helpers(device: str = "cpu"):
    """widen_bits, fp8_code, e2m1_code, floor_log2, e4m3_value on every float16 and bfloat16
    bit pattern and 2**18 random float32 ones, against ml_dtypes (fp8 after clamping to +-max;
    float4_e2m1fn saturates itself); NaN -> 0x7F|sign (fp8) and 7 (e2m1) as the convention says.
    (``device``: "cuda" runs the same probe compiled, to compare a GPU with the interpreter.)"""
    import ml_dtypes
    import torch
    import triton
    import triton.language as tl

    global bk  # the jit function resolves names in this module's globals
    from oracle.kernels.triton import _block_kernels as bk

    @triton.jit
    def probe(src_ptr, out_ptr, n, SRC: tl.constexpr, BLOCK: tl.constexpr, HW: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        bits = bk.widen_bits(tl.load(src_ptr + i, mask=m, other=0), SRC)
        mag = bits & 0x7FFFFFFF
        tl.store(out_ptr + i * 8, bits, mask=m)
        tl.store(out_ptr + i * 8 + 1, bk.fp8_code(bits, bits, 1), mask=m)
        tl.store(out_ptr + i * 8 + 2, bk.fp8_code(bits, bits, 2), mask=m)
        tl.store(out_ptr + i * 8 + 3, bk.e2m1_code(bits), mask=m)
        tl.store(out_ptr + i * 8 + 4, bk.floor_log2(tl.maximum(mag, 1)), mask=m)
        code = tl.minimum(i, 0x7E)
        tl.store(out_ptr + i * 8 + 5, bk.e4m3_value(code).to(tl.int32, bitcast=True), mask=m)
        if HW:  # the GPU's own conversion (sm_89+), where the writers use it
            tl.store(out_ptr + i * 8 + 6, bk.fp8_code_hw(bits, bits, 1), mask=m)
            tl.store(out_ptr + i * 8 + 7, bk.fp8_code_hw(bits, bits, 2), mask=m)

    rng = np.random.default_rng(7)
    hw = device != "cpu" and _hardware_fp8(device)
    out = {"widen": {}, "patterns": {}, "floor_log2": 0, "e4m3_values": 0, "hardware": bool(hw)}
    e4m3 = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32).view(np.int32)
    for name, code in (("float16", 1), ("bfloat16", 2), ("float32", 0)):
        if code:
            pattern = np.arange(65536, dtype=np.uint16)
            f32 = pattern.view(np.float16).astype(np.float32) if code == 1 else \
                (pattern.astype(np.uint32) << 16).view(np.float32)
            src = torch.from_numpy(pattern.view(np.int16).copy())
        else:  # random patterns, and every target's rounding ties with their float32 neighbours
            finite = ((ml_dtypes.float8_e4m3fn, 0x7F), (ml_dtypes.float8_e5m2, 0x7C), (ml_dtypes.float4_e2m1fn, 8))
            grids = [np.arange(count, dtype=np.uint8).view(t).astype(np.float32) for t, count in finite]
            ties = np.concatenate([(g[:-1] + g[1:]) / 2 for g in grids] + [g[-1:] * 1.0625 for g in grids])
            ties = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
            pattern = np.concatenate([rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32),
                                      ties.view(np.uint32), (-ties).view(np.uint32)])
            f32 = pattern.view(np.float32)
            src = torch.from_numpy(pattern.view(np.int32).copy())
        n = f32.size
        res = torch.zeros(n * 8, dtype=torch.int32, device=device)
        block = 1024 if device != "cpu" else triton.next_power_of_2(n)
        with np.errstate(all="ignore"):
            probe[(triton.cdiv(n, block),)](src.to(device), res, n, SRC=code, BLOCK=block, HW=hw)
        got = res.cpu().numpy().reshape(n, 8)
        out["patterns"][name] = n
        out["widen"][name] = int((got[:, 0] != f32.view(np.int32)).sum())
        nan, sign = np.isnan(f32), (f32.view(np.uint32) >> 31).astype(np.int64)
        with np.errstate(invalid="ignore"):
            want = {"e4m3fn": np.clip(f32, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
                    "e5m2": np.clip(f32, -57344, 57344).astype(ml_dtypes.float8_e5m2).view(np.uint8),
                    "e2m1": f32.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)}
        out[name] = {}
        columns = ((1, "e4m3fn"), (2, "e5m2"), (3, "e2m1")) + (((6, "e4m3fn hw"), (7, "e5m2 hw")) if hw else ())
        for col, fmt in columns:
            fmt_name = fmt.split()[0]
            expect = np.where(nan, 7 if fmt == "e2m1" else 0x7F | (sign << 7), want[fmt_name].astype(np.int64))
            out[name][fmt] = int((got[:, col] != expect).sum())
        positive = np.isfinite(f32) & (f32 > 0)
        out["floor_log2"] += int((got[positive, 4] != np.frexp(f32[positive].astype(np.float64))[1] - 1).sum())
        out["e4m3_values"] += int((got[:0x7F, 5] != e4m3).sum())
    return out


def scenario_quantize(fmt: str, device: str = "cpu"):
    """quantize_block over dtypes x D x (contiguous, strided) sources, poisoned outputs (on
    ``device``: "cuda" runs the compiled kernels against the same reference)."""
    import torch

    from oracle.kernels.triton import block_ops
    from oracle.reference import block_scaled as ref

    rng = np.random.default_rng(11)
    bad, cases = [], 0
    for i, (dtype, d, how) in enumerate((a, b, c) for a in DTYPES for b in DIMS for c in (1, 2)):
        n, h = 5, 3
        x = _strided(_values(rng, fmt, (n, h, d), dtype).to(device), how)
        gs = _global_scale(rng, x.cpu(), i)
        arena = Arena(rng, device)
        width, count = ref.code_width(fmt, d), ref.scale_count(fmt, d)
        codes, codes_np = arena.view((n, h, width), (h * width, width, 1))
        scales, scales_np = arena.view((n, h, count), (h * count, count, 1))
        with np.errstate(all="ignore"):
            codes_np[...], scales_np[...] = ref.quantize_block(x.cpu().float().numpy(), fmt, gs.numpy())
        block_ops.quantize_block(codes, scales, x, fmt, gs.to(device))
        cases += 1
        if arena.mismatches():
            bad.append([dtype, d, how, float(gs), arena.mismatches()])
    return {"cases": cases, "bad": bad}


def _paged_view(arena, layout: str, shape: tuple):
    """A ``[num_blocks, block_size, H, W]`` cache view: "NHD" packed, "HND" (a ``[num_blocks, H,
    block_size, W]`` allocation, permuted) or "padded" (8 unused bytes after each head, 40 after
    each block)."""
    nbk, bs, h, w = shape
    strides = {"NHD": (bs * h * w, h * w, w, 1), "HND": (h * bs * w, w, bs * w, 1),
               "padded": (bs * h * (w + 8) + 40, h * (w + 8), w + 8, 1)}[layout]
    return arena.view(shape, strides)


def scenario_paged(fmt: str, device: str = "cpu"):
    """reshape_and_cache_block over dtypes x D x (NHD, HND, padded NHD) x (linear, swizzled),
    int32/int64 strided slot mappings with -1 padding, sources longer than the index (on
    ``device`` as :func:`scenario_quantize`)."""
    import torch

    from oracle.kernels.triton import block_ops
    from oracle.reference import block_scaled as ref

    rng = np.random.default_rng(13)
    bad, cases, unmapped = [], 0, 0
    layouts = (("NHD", "linear"), ("HND", "swizzled"), ("padded", "linear"), ("NHD", "swizzled"))
    for i, (dtype, d) in enumerate((a, b) for a in DTYPES for b in DIMS):
        layout, scale_layout = layouts[i % 4]  # each layout under several dtypes and D
        num_blocks, bs = 3, 12 if i % 5 == 2 else 16  # block sizes that are powers of two or not
        h = 12 if i % 8 == 1 else 2  # swizzled pages of 192 rows (a half-empty second row tile) or 32
        n = 9
        width, count = ref.code_width(fmt, d), ref.scale_count(fmt, d)
        arena = Arena(rng, device)
        page = ref.swizzled_page_bytes(bs * h, count)
        views = [_paged_view(arena, layout, (num_blocks, bs, h, width)) for _ in range(2)]
        for _ in range(2):  # swizzled: pages 16 bytes apart, rows 8 bytes wider than a page
            views.append(arena.view((num_blocks, page + 8), (page + 16, 1)) if scale_layout == "swizzled"
                         else _paged_view(arena, layout, (num_blocks, bs, h, count)))
        caches, twins = [v[0] for v in views], [v[1] for v in views]
        slots = rng.permutation(num_blocks * bs)[:n].astype(np.int64)
        slots[rng.choice(n, 3, replace=False)] = -1
        storage = torch.full((2 * n + 3,), 10**6, dtype=torch.int32 if i % 2 else torch.int64)
        slot_mapping = storage[3::2]  # at a storage offset, stride 2
        slot_mapping.copy_(torch.from_numpy(slots))
        # K and V with the same strides (one launch) or not (one each); tiles with NaN and inf
        # (the special-value path), with inf alone, or with neither (the plain path)
        nonfinite = ("nan", "inf", "none")[i % 3]
        key = _strided(_values(rng, fmt, (n + 2, h, d), dtype, nonfinite).to(device), i % 3)
        value = _strided(_values(rng, fmt, (n + 2, h, d), dtype, ("none", "nan", "inf")[i % 3]).to(device),
                         (i + i % 2) % 3)
        k_gs, v_gs = _global_scale(rng, key.cpu(), i), _global_scale(rng, value.cpu(), i + 1)
        with np.errstate(all="ignore"):
            want = ref.reshape_and_cache_block(*twins, slot_mapping.numpy(), key.cpu().float().numpy(),
                                               value.cpu().float().numpy(), fmt=fmt, k_global_scale=k_gs.numpy(),
                                               v_global_scale=v_gs.numpy(), scale_layout=scale_layout)
        for twin, new in zip(twins, want):
            twin[...] = new
        if device != "cpu":  # a strided view of the index on the device, as on the host
            on_device = storage.to(device)
            slot_mapping = on_device[3::2]
        block_ops.reshape_and_cache_block(key, value, *caches, slot_mapping, fmt, k_gs.to(device), v_gs.to(device))
        cases += 1
        if arena.mismatches():
            bad.append([dtype, d, layout, scale_layout, str(slot_mapping.dtype), arena.mismatches()])
        if scale_layout == "swizzled":  # explicitly: the bytes no (r, c) maps to kept their poison
            mapped = np.zeros(page + 8, bool)
            mapped[ref.swizzled_offsets(bs * h, count).ravel()] = True
            for sc, buf in zip(caches[2:], arena.twins[2:]):
                rows = buf[GUARD:GUARD + (page + 16) * num_blocks].reshape(num_blocks, page + 16)
                if not np.array_equal(sc.cpu().numpy()[:, ~mapped], rows[:, :page + 8][:, ~mapped]):
                    bad.append([dtype, d, "unmapped swizzled bytes written"])
                unmapped += int((~mapped).sum()) * num_blocks
    return {"cases": cases, "bad": bad, "unmapped_checked": unmapped}


def scenario_aliased(fmt: str, device: str = "cpu"):
    """reshape_and_cache_block with key_cache and value_cache one buffer, and the scale caches
    one buffer: as ``k_cache[loc] = k; v_cache[loc] = v``, V's codes and scales are what remain
    (a kernel writing both sides in one launch would race on every row)."""
    import torch

    from oracle.kernels.triton import block_ops
    from oracle.reference import block_scaled as ref

    rng = np.random.default_rng(19)
    num_blocks, bs, h, d, n = 4, 16, 2, 128, 40
    width, count = ref.code_width(fmt, d), ref.scale_count(fmt, d)
    arena = Arena(rng, device)
    cache, cache_np = _paged_view(arena, "NHD", (num_blocks, bs, h, width))
    scales, scales_np = _paged_view(arena, "NHD", (num_blocks, bs, h, count))
    slots = torch.from_numpy(rng.permutation(num_blocks * bs)[:n].astype(np.int64))
    key, value = (_values(rng, fmt, (n, h, d), "bfloat16", "none") for _ in range(2))
    gs = torch.tensor([1.0], dtype=torch.float32)
    spare_c, spare_s = np.zeros_like(cache_np), np.zeros_like(scales_np)
    with np.errstate(all="ignore"):
        k_c, _, k_s, _ = ref.reshape_and_cache_block(cache_np, spare_c, scales_np, spare_s, slots.numpy(),
                                                     key.float().numpy(), key.float().numpy(), fmt=fmt)
        _, v_c, _, v_s = ref.reshape_and_cache_block(spare_c, k_c, spare_s, k_s, slots.numpy(),
                                                     value.float().numpy(), value.float().numpy(), fmt=fmt)
    cache_np[...], scales_np[...] = v_c, v_s
    from oracle.kernels.triton import _host, _runtime

    sides, real = [], _runtime.launch  # the SIDES of each block_write launch
    _runtime.launch = lambda kernel, grid, *a, **k: (sides.append(k["SIDES"]) if "SIDES" in k else None,
                                                     real(kernel, grid, *a, **k))
    planned, _host.PLANS = _host.PLANS, False  # every call launches through _runtime.launch
    try:
        block_ops.reshape_and_cache_block(key.to(device), value.to(device), cache, cache, scales, scales,
                                          slots.to(device), fmt, gs.to(device), gs.to(device))
        aliased = len(sides)
        other = [torch.empty_like(t) for t in (cache, cache, scales, scales)]  # apart: one launch
        block_ops.reshape_and_cache_block(key.to(device), value.to(device), *other, slots.to(device), fmt,
                                          gs.to(device), gs.to(device))
    finally:
        _runtime.launch, _host.PLANS = real, planned
    return {"bad": arena.mismatches(), "sides per launch": sides, "aliased launches": aliased}


def scenario_paged_wide(fmt: str):
    """scenario_paged with the 64-bit row path taken for every call (launch plans off, so no
    call replays a launch planned on the 32-bit path)."""
    from oracle.kernels.triton import _host, block_ops

    saved = block_ops.INT32_LIMIT, _host.PLANS
    block_ops.INT32_LIMIT, _host.PLANS = 0, False
    try:
        return scenario_paged(fmt)
    finally:
        block_ops.INT32_LIMIT, _host.PLANS = saved


def scenario_bad():
    """Each bad argument: TypeError/ValueError naming it; every cache still holds its poison."""
    import torch

    from oracle.kernels.triton import block_ops

    rng = np.random.default_rng(17)
    arena = Arena(rng)
    n, h, d, nb, bs = 4, 2, 32, 2, 16  # nvfp4: 2 blocks of 16
    key = torch.randn(n, h, d)
    kc, vc, ks, vs = (_paged_view(arena, "NHD", (2, bs, h, w))[0] for w in (d // 2, d // 2, nb, nb))
    codes, _ = arena.view((n, h, d // 2), (h * d // 2, d // 2, 1))
    scales, _ = arena.view((n, h, nb), (h * nb, nb, 1))
    slots = torch.tensor([0, 5, -1, 31], dtype=torch.int32)
    one = torch.ones(1)
    paged = dict(key=key, value=key.clone(), key_cache=kc, value_cache=vc, key_scale_cache=ks, value_scale_cache=vs,
                 slot_mapping=slots, fmt="nvfp4", k_global_scale=one, v_global_scale=one)
    quant = dict(codes=codes, scales=scales, x=key, fmt="nvfp4", global_scale=one)
    cases = {  # name -> (op, overrides, the argument the error must name)
        "fmt": ("q", {"fmt": "mxfp4"}, "fmt"), "x_dtype": ("q", {"x": key.double()}, "x"),
        "codes_dtype": ("q", {"codes": codes.view(torch.int8)}, "codes"),
        "scales_shape": ("q", {"scales": scales[:, :, :1]}, "scales"), "odd_head": ("q", {"x": key[..., :31]}, "x"),
        "gs_negative": ("q", {"global_scale": -one}, "global_scale"),
        "gs_nan": ("q", {"global_scale": one * float("nan")}, "global_scale"),
        "gs_inf": ("q", {"global_scale": one * float("inf")}, "global_scale"),
        "gs_zero": ("q", {"global_scale": one * 0}, "global_scale"),
        "gs_dtype": ("q", {"global_scale": one.double()}, "global_scale"),
        "gs_shape": ("q", {"global_scale": torch.ones(2)}, "global_scale"),
        "out_of_range": ("p", {"slot_mapping": torch.tensor([0, 1, 32, -1])}, "slot_mapping"),
        "index_dtype": ("p", {"slot_mapping": slots.to(torch.int16)}, "slot_mapping"),
        "index_2d": ("p", {"slot_mapping": slots.view(2, 2)}, "slot_mapping"),
        "dtype_mismatch": ("p", {"value": key.half()}, "value"),
        "key_short": ("p", {"key": key[:3]}, "key"), "heads": ("p", {"value": torch.randn(n, 3, d)}, "value"),
        "cache_dtype": ("p", {"value_cache": vc.view(torch.int8)}, "value_cache"),
        "cache_stride": ("p", {"key_cache": kc.as_strided(kc.shape, kc.stride()[:3] + (2,))}, "key_cache"),
        "scale_shape": ("p", {"value_scale_cache": vs[..., :1]}, "value_scale_cache"),
        "swizzled_short": ("p", {"key_scale_cache": ks.view(2, -1)[:, :100],
                                 "value_scale_cache": vs.view(2, -1)[:, :100]}, "key_scale_cache"),
        "odd_head_paged": ("p", {"key": key[..., :31], "value": key[..., :31]}, "key"),
        "v_gs": ("p", {"v_global_scale": one * -2}, "v_global_scale"),
        "k_gs": ("p", {"k_global_scale": "1.0"}, "k_global_scale"),
    }
    errors = {}
    for name, (op, override, argument) in cases.items():
        fn, kwargs = (block_ops.quantize_block, quant) if op == "q" else (block_ops.reshape_and_cache_block, paged)
        try:
            fn(**{**kwargs, **override})
            errors[name] = ("no error", "", argument)
        except (TypeError, ValueError) as exc:
            errors[name] = (type(exc).__name__, str(exc), argument)
    return {"errors": errors, "untouched": not arena.mismatches()}


def scenario_large():
    """Key and value caches of 2**31 + 2**22 bytes (allocated, never touched but where written):
    slots whose byte offsets pass 2**31 land there (32-bit offsets would wrap)."""
    import torch

    from oracle.kernels.triton import block_ops
    from oracle.reference import block_scaled as ref

    h, d, bs, fmt = 1, 128, 16, "mxfp8_e4m3fn"
    num_blocks = (2**31 + 2**22) // (bs * h * d)
    kc = torch.empty(num_blocks, bs, h, d, dtype=torch.uint8)
    vc = torch.empty(num_blocks, bs, h, d, dtype=torch.uint8)
    ks = torch.zeros(num_blocks, bs, h, 4, dtype=torch.uint8)
    vs = torch.zeros(num_blocks, bs, h, 4, dtype=torch.uint8)
    slots = torch.tensor([num_blocks * bs - 1, 7, (num_blocks - 3) * bs], dtype=torch.int64)
    canary = num_blocks * bs - 2  # the row before the last one, never written
    kc.view(-1, h, d)[canary] = 0x5A
    key = torch.randn(3, h, d) * 100
    block_ops.reshape_and_cache_block(key, key, kc, vc, ks, vs, slots, fmt, None, None)
    codes, scales = ref.quantize_block(key.numpy(), fmt)
    flat_c, flat_s = kc.view(-1, h, d), ks.view(-1, h, 4)
    return {"codes": all(np.array_equal(flat_c[int(s)].numpy(), codes[i]) for i, s in enumerate(slots)),
            "scales": all(np.array_equal(flat_s[int(s)].numpy(), scales[i]) for i, s in enumerate(slots)),
            "canary": bool((flat_c[canary] == 0x5A).all())}


if __name__ == "__main__":
    print("RESULT " + json.dumps(globals()["scenario_" + sys.argv[1]](*sys.argv[2:])))
