"""The Triton kernels (oracle.kernels.triton) on Triton's CPU interpreter.

Each test runs a script in a subprocess with TRITON_INTERPRET=1 set (or, for the backend
selection, unset): the interpreter is chosen when the kernels are defined, so it cannot be
switched inside this process. The scripts print one JSON object that the test checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not importable (pip install triton==3.6.0)")

PREAMBLE = """
import json, sys
import numpy as np
import torch
from oracle.kernels.triton import ops

def emit(obj):
    print("RESULT " + json.dumps(obj))
"""


def run(script: str, *, interpret: bool = True, extra_env: dict | None = None, timeout=300) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ORACLE_PLUGINS")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"script failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


REGISTER = """
from oracle.registry import Registry
from oracle.kernels.triton import register
registry = Registry()
registry.load_plugin("test", register)
emit({"errors": [e.error for e in registry.errors],
      "kernels": {k.name: {"op": k.contract.op, "name": k.name, "backend": k.contract.backend,
                                  "device": k.contract.device, "fp8": list(k.contract.fp8_formats),
                                  "preset": k.contract.fp8_preset, "padding": k.contract.padding,
                                  "validates": k.contract.validates, "notes": k.contract.notes,
                                  "unavailable": k.unavailable()}
                  for k in registry.kernels.values()}})
"""

OPS = {"store_cache": "none", "set_mla_kv_buffer": "none", "concat_and_cache_mla": "negative",
       "translate_full_to_swa": "negative", "reshape_and_cache_flash": "negative",
       "quantize_fp8": "none", "quantize_block": "none", "reshape_and_cache_block": "negative"}


WRITERS = ("store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash")
BLOCK_WRITERS = ("quantize_block", "reshape_and_cache_block")


def test_interpreter_registers_copy_only_backend():
    out = run(REGISTER)
    assert out["errors"] == []
    names = {f"triton-interpret.{op}" for op in OPS} | {f"triton-interpret.{op}.unchecked"
                                                         for op in WRITERS + BLOCK_WRITERS + ("quantize_fp8",)}
    assert set(out["kernels"]) == names
    for name, k in out["kernels"].items():
        assert k["backend"] == "triton-interpret" and k["device"] == "cpu", k
        assert k["unavailable"] is None
        assert k["fp8"] == [], "the interpreter's fp8 conversion is wrong: no fp8 may be declared"
        assert k["padding"] == OPS[k["op"]]
        # the .unchecked fast path declares that it does not validate; everything else does
        assert k["validates"] == (not name.endswith(".unchecked")), name
    for op in ("concat_and_cache_mla", "reshape_and_cache_flash", "quantize_fp8"):
        notes = out["kernels"][f"triton-interpret.{op}"]["notes"]
        assert "interpreter" in notes and "fp8" in notes
    for op in WRITERS + BLOCK_WRITERS + ("quantize_fp8",):
        assert "validate=False" in out["kernels"][f"triton-interpret.{op}.unchecked"]["notes"]


def test_without_cuda_or_interpreter_registers_unavailable_cuda_backend():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the backend would be available")
    out = run(REGISTER, interpret=False)
    assert out["errors"] == []
    for k in out["kernels"].values():
        assert (k["backend"], k["device"]) == ("triton", "cuda")
        assert "no CUDA device" in k["unavailable"] and "TRITON_INTERPRET=1" in k["unavailable"]


def test_without_triton_registers_unavailable_backend():
    script = "sys.modules['triton'] = None  # import triton now raises ImportError\n" + REGISTER
    out = run(script, interpret=False)
    assert out["errors"] == []
    # 8 ops; the 7 that check on the device also as .unchecked; the 5 that take an index as .checked_index
    assert len(out["kernels"]) == 20
    assert sum(name.endswith(".checked_index") for name in out["kernels"]) == 5
    for k in out["kernels"].values():
        assert (k["backend"], k["device"]) == ("triton", "cuda")
        assert k["unavailable"] == "triton is not installed"


def test_translate_minus_one_is_handled_in_the_kernel_not_read_before_the_table():
    out = run("""
    # through the op: -1 -> -1, entries -> mapping[entry]; mapping at a storage offset behind decoys
    storage = torch.tensor([55, 55, 55, 10, 11, 12, 13, 0, -1], dtype=torch.int64)
    mapping = storage[3:]
    loc = torch.tensor([[0, -1], [4, 2]], dtype=torch.int32)
    got = ops.translate_full_to_swa(mapping, loc)
    # the raw kernel, with a table whose sentinel is NOT -1 (77) and a decoy (55) before it:
    # -1 must still give -1, so it reads neither mapping[-1] (one before the table) nor the sentinel
    storage2 = torch.tensor([55, 10, 11, 77], dtype=torch.int64)
    mapping2 = storage2[1:]
    loc2 = torch.tensor([-1, 0, 1, -1], dtype=torch.int64)
    out2 = torch.empty(4, dtype=torch.int64)
    ops.kernels().translate[(1,)](mapping2, 1, 2, loc2, 0, 0, 0, 1, 1, 1, 4, out2, 4, BLOCK=4)
    # strided 1-D loc (every other element) and an empty loc
    wide = torch.tensor([2, 99, -1, 99, 0, 99], dtype=torch.int64)
    strided = ops.translate_full_to_swa(mapping, wide[::2])
    empty = ops.translate_full_to_swa(mapping, torch.empty(0, 3, dtype=torch.int64))
    errors = []
    for bad in ([-2], [5], [9]):  # 5 = the sentinel's own index
        try:
            ops.translate_full_to_swa(mapping, torch.tensor(bad))
        except ValueError as exc:
            errors.append(str(exc))
    emit({"got": got.tolist(), "dtype": str(got.dtype), "raw": out2.tolist(),
          "strided": strided.tolist(), "empty": list(empty.shape), "errors": errors})
    """)
    assert out["got"] == [[10, -1], [0, 12]] and out["dtype"] == "torch.int64"
    assert out["raw"] == [-1, 10, 11, -1]
    assert out["strided"] == [12, -1, 10]
    assert out["empty"] == [0, 3]
    assert len(out["errors"]) == 3
    assert "only -1 may be negative" in out["errors"][0]
    assert all("must lie in [0, 5)" in e for e in out["errors"])


def test_offsets_past_2_31_elements_use_64_bit_arithmetic():
    """A cache of 2**31 + 2**21 bytes (allocated, never touched except where written): rows at
    slots whose offsets pass 2**31 land there and nowhere else."""
    out = run("""
    row = 1024
    slots = (2**31 + 2**21) // row
    cache = torch.empty(slots * row, dtype=torch.uint8).view(slots, 1, row)
    v_cache = torch.empty(slots * row, dtype=torch.uint8).view(slots, 1, row)
    k = torch.randint(0, 256, (3, 1, row), dtype=torch.uint8)
    loc = torch.tensor([slots - 1, 2**21 + 5, 3], dtype=torch.int32)
    for c in (cache, v_cache):
        c[loc.long()] = 0
    ops.store_cache(k, k, cache, v_cache, loc)
    # 32-bit offsets would wrap (slots - 1) * row past 2**31 to a negative offset: not this row
    ok = [bool(torch.equal(cache[int(s)], k[i])) for i, s in enumerate(loc)]
    # MLA: a [S, 576] buffer past 2**31 elements of int16
    width = 576
    s2 = (2**31 + 2**20) // width
    buf = torch.empty(s2, width, dtype=torch.int16)
    nope = torch.randint(-1000, 1000, (2, 512), dtype=torch.int16)
    rope = torch.randint(-1000, 1000, (2, 64), dtype=torch.int16)
    loc2 = torch.tensor([s2 - 1, 7], dtype=torch.int64)
    ops.set_mla_kv_buffer(buf, loc2, nope, rope)
    mla = [bool(torch.equal(buf[int(s)], torch.cat([nope[i], rope[i]]))) for i, s in enumerate(loc2)]
    emit({"ok": ok, "mla": mla})
    """)
    assert out == {"ok": [True, True, True], "mla": [True, True]}


def test_padding_policies_are_kernel_arguments():
    out = run("""
    S, H, D = 16, 2, 8
    def fresh():
        return torch.full((S, H, D), 7.0), torch.full((S, H, D), 7.0)
    k = torch.arange(4 * H * D, dtype=torch.float32).view(4, H, D) + 100
    kc, vc = fresh()
    ops.store_cache(k, k, kc, vc, torch.tensor([0, 3, 0, 5]), padding="reserved:0")
    reserved = {"slot0": kc[0].eq(7).all().item(), "slot3": torch.equal(kc[3], k[1]),
                "slot5": torch.equal(kc[5], k[3])}
    rejected = []
    for padding, loc in (("none", [-1, 3, 4, 5]), ("reserved:0", [-1, 3, 4, 5]), ("none", [1, 2, 3, 16])):
        kc, vc = fresh()
        try:
            ops.store_cache(k, k, kc, vc, torch.tensor(loc), padding=padding)
        except ValueError as exc:
            rejected.append((str(exc), bool(kc.eq(7).all() and vc.eq(7).all())))
    kc, vc = fresh()
    ops.store_cache(k, k, kc, vc, torch.tensor([-1, 3, -1, 5]), padding="negative")
    negative = kc[3].equal(k[1]) and kc[5].equal(k[3]) and int(kc.ne(7).any(-1).any(-1).sum()) == 2
    # vLLM writers skip -1 by default
    cache = torch.full((2, 4, H, D), 7.0)
    ops.reshape_and_cache_flash(k, k, cache, cache.clone(), torch.tensor([-1, 6, -1, 1]), "auto",
                                torch.ones(1), torch.ones(1))
    flat = cache.view(8, H, D)
    flash = flat[6].equal(k[1]) and flat[1].equal(k[3]) and int(flat.ne(7).any(-1).any(-1).sum()) == 2
    emit({"reserved": reserved, "rejected": rejected, "negative": bool(negative), "flash": bool(flash)})
    """)
    assert out["reserved"] == {"slot0": True, "slot3": True, "slot5": True}
    assert len(out["rejected"]) == 3
    for message, unchanged in out["rejected"]:
        assert "out of range [0, 16)" in message and unchanged
    assert out["negative"] and out["flash"]


def test_empty_input_launches_nothing():
    out = run("""
    calls = []
    from oracle.kernels.triton import _runtime
    real = _runtime.launch
    _runtime.launch = lambda kernel, grid, *a, **k: (calls.append(grid), real(kernel, grid, *a, **k))
    H, D = 2, 8
    e3 = torch.empty(0, H, D)
    idx = torch.empty(0, dtype=torch.int64)
    ops.store_cache(e3, e3, torch.zeros(4, H, D), torch.zeros(4, H, D), idx)
    ops.set_mla_kv_buffer(torch.zeros(4, 12), idx, torch.empty(0, 8), torch.empty(0, 4))
    ops.concat_and_cache_mla(torch.empty(0, 8), torch.empty(0, 4), torch.zeros(2, 4, 12), idx, "auto", torch.ones(1))
    ops.reshape_and_cache_flash(e3, e3, torch.zeros(2, 4, H, D), torch.zeros(2, 4, H, D), idx, "auto",
                                torch.ones(1), torch.ones(1))
    ops.translate_full_to_swa(torch.tensor([0, 1, -1]), idx)
    empty_calls = len(calls)
    ops.store_cache(torch.ones(1, H, D), torch.ones(1, H, D), torch.zeros(4, H, D), torch.zeros(4, H, D),
                    torch.tensor([2]))
    one = calls[empty_calls:]
    # K and V with different layouts (V's cache a strided view): one launch each
    wide = torch.zeros(4, H, 2 * D)
    ops.store_cache(torch.ones(1, H, D), torch.ones(1, H, D), torch.zeros(4, H, D), wide[:, :, ::2],
                    torch.tensor([2]))
    split = calls[empty_calls + len(one):]
    # one buffer for both caches: K's launch, then V's (in one launch the sides would race)
    shared, before = torch.zeros(4, H, D), len(calls)
    ops.store_cache(torch.ones(1, H, D), 2 * torch.ones(1, H, D), shared, shared, torch.tensor([2]))
    aliased = calls[before:]
    # K and V interleaved in one qkv buffer (their sources overlap), caches apart: one launch
    qkv, before = torch.ones(1, H, 2 * D), len(calls)
    ops.store_cache(qkv[:, :, :D], qkv[:, :, D:], torch.zeros(4, H, D), torch.zeros(4, H, D), torch.tensor([2]))
    emit({"empty": empty_calls, "one": [list(g) for g in one], "split": [list(g) for g in split],
          "aliased": [list(g) for g in aliased], "v kept": bool(shared[2].eq(2).all()),
          "qkv": [list(g) for g in calls[before:]]})
    """)
    assert out["empty"] == 0
    assert out["one"] == [[1, 1, 2]]  # K and V share a layout: one launch, grid axis 2 = side
    assert out["split"] == [[1, 1, 1], [1, 1, 1]]
    assert out["aliased"] == [[1, 1, 1], [1, 1, 1]] and out["v kept"]
    assert out["qkv"] == [[1, 1, 2]]


def test_fp8_is_refused_under_the_interpreter_and_plumbed_right_when_forced():
    """The interpreter converts exactly representable values right (it is wrong on rounding,
    overflow and inf), so quotients that are fp8 codes check the fused path's addressing, the
    per-head scale and the bitcast, on an HND cache."""
    out = run("""
    import ml_dtypes
    from oracle import reference
    rng = np.random.default_rng(0)
    T, H, D, NB, BS = 5, 3, 16, 4, 4
    codes = rng.integers(0, 0x7E, size=(T, H, D)).astype(np.uint8)
    codes[codes & 0x7F == 0x7F] = 0
    q = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale = np.array([0.5, 2.0, 4.0], np.float32)  # powers of two: x / scale is exact
    x = torch.from_numpy(q * scale[None, :, None])
    k_scale = torch.from_numpy(scale)
    alloc = torch.full((NB, H, BS, D), 0xAB, dtype=torch.uint8)
    key_cache = alloc.permute(0, 2, 1, 3)  # HND view of [NB, BS, H, D]
    value_cache = torch.full((NB, BS, H, D), 0xAB, dtype=torch.uint8)
    slots = torch.tensor([3, -1, 9, 14, 0])
    try:
        ops.reshape_and_cache_flash(x, x, key_cache, value_cache, slots, "fp8_e4m3", k_scale, k_scale)
        refused = None
    except NotImplementedError as exc:
        refused = (str(exc), bool((alloc == 0xAB).all()))
    before = key_cache.numpy().copy()
    ops.reshape_and_cache_flash(x, x, key_cache, value_cache, slots, "fp8_e4m3", k_scale, k_scale,
                                allow_interpreter_fp8=True)
    want, _ = reference.reshape_and_cache_flash(before, before.copy(), slots.numpy(), x.numpy(), x.numpy(),
                                               kv_cache_dtype="e4m3fn", k_scale=scale, v_scale=scale,
                                               preset="triton_sm90")
    out = torch.zeros(T, H, D, dtype=torch.uint8)
    ops.quantize_fp8(out, x, k_scale, "e4m3fn", allow_interpreter_fp8=True)
    emit({"refused": refused, "flash": bool(np.array_equal(key_cache.numpy(), want)),
          "quantize": bool(np.array_equal(out.numpy(), codes))})
    """)
    message, untouched = out["refused"]
    assert "interpreter" in message and untouched
    assert out["flash"] and out["quantize"]


def test_interpreter_tiles_are_large():
    out = run("""
    emit({name: [t.block_n, t.block_r, t.block_a, t.block_b] for name, t in (
        ("rows", ops.tile(4096, 1024)), ("mla", ops.tile(4096, 512, "mla_write", (512, 64))),
        ("one", ops.tile(1, 97)))})
    """)
    (block_n, block_r, _, _) = out["rows"]
    assert block_r == 1024 and 4096 // block_n <= 64  # few programs: each is a Python call
    assert out["mla"][1:] == [512, 512, 64]  # each part in one tile: nope 512, rope 64
    assert out["one"][:2] == [1, 128]


def test_l2_prefetch_is_asked_for_by_mode_and_off_under_the_interpreter():
    """tiles.PREFETCH decides which launches first ask the L2 for their source rows (PF_* sectors
    per tile row; none for a strided part). The interpreter cannot run the inline PTX, so there the
    launch turns the prefetches off and the write is still right."""
    out = run("""
    seen = []
    from oracle.kernels.triton import _runtime, tiles
    real = _runtime.launch
    _runtime.launch = lambda kernel, grid, *a, **k: (seen.append({m: v for m, v in k.items() if m.startswith("PF_")}),
                                                     real(kernel, grid, *a, **k))
    buf = torch.full((8, 12), 7.0, dtype=torch.bfloat16)
    nope, rope = torch.randn(3, 8).to(torch.bfloat16), torch.randn(3, 4).to(torch.bfloat16)
    loc = torch.tensor([5, 0, 2])
    results = {}
    for mode in ("never", "pdl", "always"):
        tiles.PREFETCH = mode
        got = buf.clone()
        ops.set_mla_kv_buffer(got, loc, nope, rope, pdl=True)
        results[mode] = seen[-1]
        want = buf.clone()
        want[loc] = torch.cat([nope, rope], 1)
        results[mode + " right"] = bool(torch.equal(got, want))
    ops.set_mla_kv_buffer(buf.clone(), loc, nope, rope)  # "always", plain launch
    results["plain"] = seen[-1]
    ops.set_mla_kv_buffer(buf.clone(), loc, torch.randn(3, 16).to(torch.bfloat16)[:, ::2], rope)
    results["strided nope"] = seen[-1]
    k = torch.randn(3, 2, 8)
    ops.store_cache(k, k, torch.zeros(8, 2, 8), torch.zeros(8, 2, 8), loc)
    results["store_cache"] = seen[-1]
    emit(results)
    """)
    assert out["never"] == {"PF_SECTOR": 16, "PF_A": 0, "PF_B": 0}
    assert out["pdl"] == out["always"] == {"PF_SECTOR": 16, "PF_A": 1, "PF_B": 1}  # 8- and 4-wide tiles
    assert out["never right"] and out["pdl right"] and out["always right"]
    assert out["plain"] == out["always"]
    assert out["strided nope"] == {"PF_SECTOR": 16, "PF_A": 0, "PF_B": 1}
    assert out["store_cache"] == {"PF_SECTOR": 8, "PF_R": 2}  # float32 rows of 16 elements


def test_gpu_check_harness_catches_wrong_writes():
    """The GPU script's scenarios, reference and comparison, on the CPU: fp8 scenarios with a
    stand-in that writes what the reference expects (the interpreter's fp8 is wrong), and
    sabotaged calls that must each be reported."""
    out = run("""
    from oracle.lanes import graphs as gc
    rng = np.random.default_rng(1)
    cpu = torch.device("cpu")
    status = {}
    for name, (build, params, fp8) in gc.SCENARIOS.items():
        setup = build(cpu, rng, **params)
        if fp8:
            def stand_in(setup=setup):
                want = setup.expected(gc.snapshot(setup))
                for w in setup.written:
                    gc._put(setup.views[w], want[w])
            setup.call = stand_in
        status[name] = gc.run_scenario(name, setup, cpu, rng, 0, graphs=False)["status"]

    def sabotaged(how):
        setup = gc.store_cache_setup(cpu, rng)
        real = setup.call
        def call():
            real()
            if how == "one_byte":
                setup.views["v_cache"].view(torch.uint8).view(-1)[7] ^= 1
            elif how == "guard":
                setup.regions[1].base[3] ^= 1  # before k_cache's payload
            elif how == "input":
                setup.views["loc"][0] = 0
        setup.call = call if how != "nothing" else (lambda: None)
        r = gc.run_scenario("sabotage", setup, cpu, rng, 0, graphs=False)
        return r["status"], str(r["eager"])
    emit({"status": status, **{how: sabotaged(how) for how in ("nothing", "one_byte", "guard", "input")}})
    """)
    assert set(out["status"].values()) == {"pass"}, out["status"]
    assert out["nothing"][0] == "fail" and "k_cache" in out["nothing"][1]
    assert out["one_byte"][0] == "fail" and "v_cache" in out["one_byte"][1] and "1 of" in out["one_byte"][1]
    assert out["guard"][0] == "fail" and "guard band before k_cache" in out["guard"][1]
    assert out["input"][0] == "fail" and "loc (an input, must be unchanged)" in out["input"][1]


def test_gpu_check_refuses_loudly_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "oracle.lanes.graphs", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "CANNOT RUN: no CUDA device" in proc.stderr
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "not run"
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-m", "oracle.lanes.graphs", "--out", str(tmp_path),
                           "--cpu-dry-run"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["status"] == "pass" and summary["counts"]["pass"] >= 10 and summary["counts"]["fail"] == 0
    # the block-scaled writers convert in integer arithmetic: their scenarios run on the interpreter too
    block = {r["scenario"]: r["status"] for r in summary["results"] if r["scenario"].startswith("reshape_and_cache_block")}
    assert len(block) == 4 and set(block.values()) == {"pass"}, block


# ---- the compiled-kernel launch path (GPU only) ------------------------------------------------

gpu = pytest.mark.skipif(not (importlib.util.find_spec("triton") and __import__("torch").cuda.is_available()),
                         reason="needs a CUDA GPU (the compiled launch path is the GPU's)")


@gpu
def test_compiled_launch_keeps_one_binary_per_triton_specialization():
    """Calls that Triton specializes differently (a pointer off 16-byte alignment, a row count of
    1, a constexpr) each get their own compiled kernel, and every one of them writes right."""
    import torch
    from oracle.kernels.triton import _launch, ops

    dev = "cuda"
    buf = torch.full((64, 600), -7.0, device=dev, dtype=torch.bfloat16)
    seen = []
    for n, lead in ((3, 0), (3, 1), (1, 0), (3, 0)):  # the last repeats the first: a cache hit
        nope_all = torch.randn(n, 512 + lead, device=dev, dtype=torch.bfloat16)
        nope = nope_all[:, lead:]  # lead 1: the pointer is 2 bytes past 16-byte alignment
        rope = torch.randn(n, 64, device=dev, dtype=torch.bfloat16)
        loc = torch.randperm(64, device=dev)[:n]
        before = buf.clone()
        ops.set_mla_kv_buffer(buf, loc, nope, rope, validate=False)
        want = before.clone()
        want[loc, :576] = torch.cat([nope, rope], 1)
        assert torch.equal(buf.view(torch.int16), want.view(torch.int16)), (n, lead)
        seen.append(len(_launch.launcher(ops.kernels().mla_write).compiled))
    assert seen[1] > seen[0] and seen[2] > seen[1] and seen[3] == seen[2]


@gpu
def test_compiled_launch_goes_through_the_jit_while_a_launch_hook_is_installed():
    import torch
    from triton import knobs
    from oracle.kernels.triton import ops

    dev = "cuda"
    k = torch.randn(2, 4, 16, device=dev)
    kc = torch.zeros(8, 4, 16, device=dev)
    vc = torch.zeros(8, 4, 16, device=dev)
    loc = torch.tensor([5, 1], device=dev)
    names = []
    hook = lambda metadata: names.append(metadata.get()["name"])  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        ops.store_cache(k, k, kc, vc, loc, validate=False)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert names == ["paged_write"]
    assert torch.equal(kc[loc], k) and torch.equal(vc[loc], k)


@gpu
def test_pdl_launches_write_right_eagerly_and_replayed_from_a_graph(monkeypatch):
    """``pdl=True`` (programmatic dependent launch): back-to-back writes whose second reads what
    the first wrote still see it, eagerly and in a graph, for both kernels (the MLA writer and the
    paged writer behind store_cache): tests/pdl_chain.py. Validating too: eagerly the index (32768
    entries) takes the check grid, which lets the writer launch at once (while the write before it
    may still run) or, with ``_validate.CHECK_EARLY`` off, after the check's own wait; with check
    reuse on (oracle.kernels.check_reuse), a second write of an index reads its first call's verdict
    instead."""
    import functools
    import torch
    from oracle.kernels import check_reuse
    from oracle.kernels.triton import _plans, _validate, ops, tiles
    from pdl_chain import check_chained_writes

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90")
    for validate, early, reuse in ((False, True, True), (True, True, False), (True, False, False), (True, True, True)):
        monkeypatch.setattr(_validate, "CHECK_EARLY", early)
        monkeypatch.setattr(check_reuse, "ENABLED", reuse)
        for mode in ("pdl", "never"):  # the second write's L2 prefetches run before its wait, or not at all
            monkeypatch.setattr(tiles, "PREFETCH", mode)
            _plans.clear()  # a launch plan keeps the constexprs it was built with
            check_chained_writes(functools.partial(ops.set_mla_kv_buffer, validate=validate, pdl=True),
                                 functools.partial(ops.store_cache, validate=validate, pdl=True))
    _plans.clear()


@gpu
@pytest.mark.parametrize("n", [1, 7, 4097])
def test_every_l2_prefetch_mode_writes_the_same_bytes(n, monkeypatch):
    """tiles.PREFETCH changes only which launches ask the L2 for their rows first: every mode, plain
    and PDL launches, contiguous and strided sources, MLA, paged and fp8 writers write what torch
    indexing does (fp8: what the mode "never" writes)."""
    import itertools
    import torch
    from oracle.kernels.triton import ops, tiles

    pdls = (False, True) if torch.cuda.get_device_capability() >= (9, 0) else (False,)
    g = torch.Generator().manual_seed(n)
    nope_wide = torch.randn(n, 1024, generator=g).to(torch.bfloat16).cuda()
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(n, 8, 128, generator=g).to(torch.bfloat16).cuda()
    loc = torch.randperm(2 * n + 3, generator=g)[:n].cuda()
    buf = torch.randn(2 * n + 3, 576, generator=g).to(torch.bfloat16).cuda()
    cache = torch.randn(2 * n + 3, 8, 128, generator=g).to(torch.bfloat16).cuda()
    fp8 = torch.zeros(((2 * n + 3 + 15) // 16, 16, 8, 128), dtype=torch.uint8, device="cuda")
    scale = torch.tensor([0.5], device="cuda")
    fp8_want = None
    for mode, pdl, nope in itertools.product(("never", "pdl", "always"), pdls,
                                             (nope_wide[:, :512], nope_wide[:, ::2])):
        monkeypatch.setattr(tiles, "PREFETCH", mode)
        got, want = buf.clone(), buf.clone()
        ops.set_mla_kv_buffer(got, loc, nope, rope, pdl=pdl)
        want[loc] = torch.cat([nope, rope], 1)
        assert torch.equal(got, want), (mode, pdl, nope.stride())
        got_k, got_v, want_k = cache.clone(), cache.clone(), cache.clone()
        ops.store_cache(k, k, got_k, got_v, loc, pdl=pdl)
        want_k[loc] = k
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_k), (mode, pdl)
        got8 = (fp8.clone(), fp8.clone())
        ops.reshape_and_cache_flash(k, k, *got8, loc, "fp8_e4m3", scale, scale, pdl=pdl)
        fp8_want = got8[0] if fp8_want is None else fp8_want
        assert torch.equal(got8[0], fp8_want) and torch.equal(got8[1], fp8_want), (mode, pdl)


def test_small_n_floor_copies_exactly_the_writers_bytes():
    """benchmarks/bench_triton_extras.py times each small-N write against an index-free copy of
    its bytes: that copy must move every row of every side, and nothing past them, or the floor
    it reports is too low. Under the interpreter (tiled as there), every N the table uses."""
    benchmarks = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks")
    out = run(f"""
    sys.path.insert(0, {benchmarks!r})
    import bench_triton_extras as extras
    seen = []
    for n in (1, 16, 64):
        for sides, width, kernel in ((1, 576, "mla_write"), (2, 1024, "paged_write")):
            launch, (src, dst) = extras.copy_floor(n, sides, width, kernel, pdl=False, device="cpu")
            guard = torch.full((sides * n * width + 64,), -7.0, dtype=torch.bfloat16)
            dst = guard[:sides * n * width].view(sides, n, width)
            launch(src, dst)
            seen.append([n, sides, bool(torch.equal(dst, src)), bool((guard[sides * n * width:] == -7.0).all())])
    emit({{"seen": seen}})
    """)
    assert len(out["seen"]) == 6
    for n, sides, copied, guard_intact in out["seen"]:
        assert copied, (n, sides)
        assert guard_intact, (n, sides)


@pytest.mark.parametrize("variant", ["unchecked", "plain"])
def test_gpu_check_calls_each_registered_variant(tmp_path, variant):
    """The graph lane's --variant (oracle.lanes.graphs) replays the ops as their .unchecked
    registrations call them, or launched plainly (pdl=False); an op without that keyword is recorded as skipped with the reason,
    never silently run as the default. On the CPU interpreter (eager, copies) the scenarios still
    pass."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-m", "oracle.lanes.graphs", "--out", str(tmp_path),
                           "--cpu-dry-run", "--variant", variant], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["variant"] == variant and summary["counts"]["fail"] == 0
    by_name = {r["scenario"]: r for r in summary["results"]}
    quantize = by_name["quantize_fp8/e4m3fn/head/special"]
    assert quantize["status"] == "skipped"
    if variant == "plain":  # quantize_fp8 takes no pdl keyword
        assert "no plain variant" in quantize["reason"]
    else:  # it takes validate=False, but the interpreter cannot run its fp8 conversion
        assert "fp8" in quantize["reason"]
    translate = by_name["translate_full_to_swa/int64/1d"]
    assert translate["status"] == ("skipped" if variant == "plain" else "pass"), translate
    assert by_name["store_cache/bf16/fused/int64"]["status"] == "pass"
    assert by_name["set_mla_kv_buffer/bf16/512+64/int32"]["status"] == "pass"


def test_gpu_check_scenarios_pass_the_variant_keywords_to_the_op():
    """Every scenario whose op takes the variant's keywords calls it with exactly them."""
    out = run("""
    import inspect
    from oracle.lanes import graphs as gc
    seen = {}
    for variant, kw in gc.VARIANTS.items():
        for name, (build, params, _) in gc.SCENARIOS.items():
            op = name.split("/")[0]
            if any(k not in inspect.signature(getattr(ops, op)).parameters for k in kw):
                continue
            real = getattr(ops, op)
            calls = []
            setattr(ops, op, lambda *a, **k: calls.append(k))
            try:
                build(torch.device("cpu"), np.random.default_rng(0), **params,
                      **({"call_kw": kw} if kw else {})).call()
            finally:
                setattr(ops, op, real)
            seen[variant + " " + name] = calls
    emit(seen)
    """)
    assert len(out) >= 30
    for key, calls in out.items():
        variant = key.split(" ")[0]
        expected = {"default": {}, "unchecked": {"validate": False}, "plain": {"pdl": False}}[variant]
        assert calls and all({k: v for k, v in c.items() if k in ("validate", "pdl")} == expected for c in calls), key
