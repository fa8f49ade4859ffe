"""The steps of the one-call GPU check (:mod:`oracle.lanes.gpu_check`): the time budget, running a
step as a subprocess with its log, the plug-ins the subprocesses need, and the steps that run in
the check's own process (``preflight``, ``env``, ``build``, ``plans``, ``bench``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "oracle.kernels.cuda:register"
TRITON_PLUGIN = "oracle.kernels.triton:register"


class Budget:
    def __init__(self, seconds: float):
        self.start = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def cap(self, want: float, reserve: float = 15) -> float:
        return max(0.0, min(want, self.left() - reserve))


MAX_LOG_BYTES = 15 << 20


def clip_file(path: Path) -> None:
    """Keep a log under the device tool's 16 MiB per-file limit: its head and tail."""
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size <= MAX_LOG_BYTES:
        return
    data = path.read_bytes()
    keep = MAX_LOG_BYTES // 2
    path.write_bytes(data[:keep] + f"\n\n... {size - 2 * keep} bytes cut ...\n\n".encode() + data[-keep:])


def step_preflight() -> dict:
    """What the later steps need, and the kv-oracle install that gives pytest its plug-in."""
    from importlib import metadata

    mods = {name: importlib.util.find_spec(mod) is not None
            for name, mod in (("pytest", "pytest"), ("xdist", "xdist"), ("hypothesis", "hypothesis"),
                              ("ml_dtypes", "ml_dtypes"), ("numpy", "numpy"), ("triton", "triton"))}
    mods["ninja"] = shutil.which("ninja") is not None  # cpp_extension runs the binary
    info = {"status": "pass", "modules": mods}

    def installed() -> bool:
        try:
            metadata.distribution("kv-oracle")
            return True
        except metadata.PackageNotFoundError:
            return False

    info["kv_oracle_installed_before"] = installed()
    if not info["kv_oracle_installed_before"]:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                                   "--no-index", "-e", str(REPO)], capture_output=True, text=True, timeout=180)
            info["pip_install"] = {"returncode": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}
        except (OSError, subprocess.SubprocessError) as exc:
            info["pip_install"] = {"error": f"{type(exc).__name__}: {exc}"}
        importlib.invalidate_caches()
    pytest11 = set()
    try:
        from importlib.metadata import entry_points

        pytest11 = {ep.value for ep in entry_points(group="pytest11")}
    except Exception:
        pass
    info["pytest_plugin_installed"] = "oracle.pytest_plugin" in pytest11
    missing = [m for m in ("pytest", "numpy", "ml_dtypes") if not mods[m]]
    if missing:
        info["status"] = "fail"
        info["why"] = "missing " + ", ".join(missing)
    print("\n=== preflight: " + json.dumps(info, indent=2), flush=True)
    return info


def _installed_plugins() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.value.replace(" ", "") for ep in entry_points(group="oracle.kernels")}


def plugin_env(extra=(PLUGIN,)) -> dict:
    """os.environ with ORACLE_PLUGINS naming the plug-ins that are not installed entry points."""
    env = dict(os.environ)
    installed = _installed_plugins()
    current = [p.strip() for p in env.get("ORACLE_PLUGINS", "").split(",") if p.strip()]
    for plugin in extra:
        if plugin not in installed and plugin not in current:
            current.append(plugin)
    if current:
        env["ORACLE_PLUGINS"] = ",".join(current)
    return env


def run_step(name: str, cmd: list[str], out: Path, timeout: float, env: dict | None = None,
             cwd: Path | None = None) -> dict:
    """Run a subprocess, its output to OUT/<name>.log; the result with the log's tail."""
    log = out / f"{name}.log"
    if timeout <= 5:
        return {"status": "skipped", "why": "no time left in the budget"}
    start = time.perf_counter()
    print(f"\n=== {name}: {' '.join(cmd)} (timeout {timeout:.0f} s)", flush=True)
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout)
            rc, timed_out = proc.returncode, False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-25:])
    print(tail, flush=True)
    return {"status": "timeout" if timed_out else ("pass" if rc == 0 else "fail"), "returncode": rc,
            "seconds": round(time.perf_counter() - start, 1), "log": str(log)}


# ---- steps ---------------------------------------------------------------------------------------

def step_env() -> dict:
    import torch

    from ..kernels.cuda import _build
    from . import sanitize

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "platform": platform.platform(), "nvcc": _build.nvcc_path(), "nvcc_version": _build.nvcc_version(),
            "compute_sanitizer": sanitize.find_sanitizer()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1))
    print(json.dumps(info, indent=2), flush=True)
    return {"status": "pass", **info}


def step_build() -> dict:
    from ..kernels.cuda import available, build_info

    start = time.perf_counter()
    reason = available()
    seconds = round(time.perf_counter() - start, 1)
    info = build_info()
    print(f"\n=== build: {'OK' if reason is None else 'UNAVAILABLE'} in {seconds} s: {info}", flush=True)
    if reason:
        print(reason, flush=True)
        return {"status": "fail", "reason": reason, "seconds": seconds, **info}
    return {"status": "pass", "seconds": seconds, **info}


def step_plans() -> dict:
    import torch

    from oracle.bench import make_workload

    from ..kernels.cuda import ops

    plans = {}
    for op, variant in (("set_mla_kv_buffer", "bf16"), ("store_cache", "bf16"), ("reshape_and_cache_flash", "auto"),
                        ("reshape_and_cache_flash", "e4m3fn")):
        w = make_workload(op, variant, 16384, device="cuda")
        fn = {"set_mla_kv_buffer": ops().mla_plan, "store_cache": ops().store_plan,
              "reshape_and_cache_flash": ops().paged_plan}[op]
        plans[f"{op}/{variant}"] = fn(*w.args)
    torch.cuda.synchronize()
    print("\n=== plans: " + json.dumps(plans, indent=2), flush=True)
    ok = plans["set_mla_kv_buffer/bf16"] == "direct vec=16" and plans["store_cache/bf16"].startswith("copy vec=16")
    return {"status": "pass" if ok else "fail", "plans": plans}


def _time(fn, args, repeats=15):
    """Median seconds per call: oracle.bench's CUDA timer (CUDA events around a captured graph of
    back-to-back calls, or plain launches when the calls cannot be captured)."""
    from oracle import bench

    timer = bench.CudaTimer(fn, args)
    samples = [timer.sample() for _ in range(repeats)]
    return statistics.median(samples), timer.name


def step_bench(scratch: Path) -> dict:
    import torch

    from oracle.bench import copy_bandwidth, make_workload
    from oracle.registry import Registry

    from ..kernels.cuda import ops, reshape_and_cache_flash, set_mla_kv_buffer, store_cache

    copy = copy_bandwidth("cuda", nbytes=1 << 30)
    ceiling = copy["gbps"]
    print(f"\n=== bench: device copy ceiling {ceiling:.0f} GB/s (copy_ of 1 GiB, read + write)", flush=True)
    triton = {}
    try:
        registry = Registry()
        from oracle.kernels import triton as triton_kernels

        registry.load_plugin("triton", triton_kernels.register)
        for k in registry.kernels.values():
            if not k.unavailable():
                triton[k.contract.op] = k.fn
    except Exception as exc:
        print(f"(no Triton comparison: {type(exc).__name__}: {exc})", flush=True)

    def torch_gpu(op):
        def mla(buf, loc, nope, rope):
            buf[:, :nope.shape[1] + rope.shape[1]].index_put_((loc,), torch.cat([nope, rope], dim=1))

        def store(k, v, kc, vc, loc):
            kc.index_put_((loc,), k)
            vc.index_put_((loc,), v)

        def paged(key, value, kc, vc, slots, fmt, ks, vs):
            bs = kc.shape[1]
            idx = (slots // bs, slots % bs)
            if fmt == "auto":
                kc.index_put_(idx, key)
                vc.index_put_(idx, value)
            else:  # clamped first: satfinite, whatever torch's own overflow rule is
                kc.index_put_(idx, (key.float() / ks).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
                vc.index_put_(idx, (value.float() / vs).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))

        return {"set_mla_kv_buffer": mla, "store_cache": store, "reshape_and_cache_flash": paged}[op]

    ours = {"set_mla_kv_buffer": set_mla_kv_buffer, "store_cache": store_cache,
            "reshape_and_cache_flash": reshape_and_cache_flash}
    rows, ok = [], True
    goals = {("set_mla_kv_buffer", 16384): 90.0, ("set_mla_kv_buffer", 65536): 92.0, ("store_cache", 16384): 90.0}
    for op, variant, n in (("set_mla_kv_buffer", "bf16", 16384), ("set_mla_kv_buffer", "bf16", 65536),
                           ("store_cache", "bf16", 16384), ("reshape_and_cache_flash", "auto", 16384),
                           ("reshape_and_cache_flash", "e4m3fn", 16384)):
        w = make_workload(op, variant, n, device="cuda")
        candidates = [("cuda", ours[op])]
        if op == "set_mla_kv_buffer":
            candidates.append(("cuda-direct", lambda b, l, a, r: ops().set_mla_kv_buffer(b, l, a, r, "direct", 16)))
        if op in triton:
            candidates.append(("triton", triton[op]))
        candidates.append(("torch-gpu", torch_gpu(op)))
        reference = None
        for label, fn in candidates:
            args = tuple(a.clone() if i in w.caches else a for i, a in enumerate(w.args))
            try:
                seconds, timer = _time(fn, args)
            except Exception as exc:
                rows.append({"op": op, "variant": variant, "n": n, "kernel": label,
                             "error": f"{type(exc).__name__}: {exc}"})
                ok = ok and label != "cuda"
                continue
            # one fresh call, compared byte for byte with torch's result below (random data: no NaN;
            # torch's fp8 reference clamps before its cast, so it should agree exactly too)
            check_args = tuple(a.clone() if i in w.caches else a for i, a in enumerate(w.args))
            fn(*check_args)
            torch.cuda.synchronize()
            written = [check_args[i].contiguous().view(torch.uint8) for i in w.caches]
            if label == "torch-gpu":
                reference = written
            row = {"op": op, "variant": variant, "n": n, "kernel": label, "us": round(seconds * 1e6, 2),
                   "gbps": round(w.bytes / seconds / 1e9, 1), "pct_copy": round(100 * w.bytes / seconds / 1e9 / ceiling, 1),
                   "timer": timer, "_written": written}
            rows.append(row)
        for row in rows:
            if row.get("op") == op and row.get("n") == n and row.get("variant") == variant and "_written" in row:
                written = row.pop("_written")
                if reference is not None:
                    differ = sum(int((a != b).sum()) for a, b in zip(written, reference))
                    row["check"] = "ok" if differ == 0 else f"DIFF {differ} B"
                    # fp8 against torch (which might divide differently) is informational: the
                    # conformance step checks fp8 codes against the reference bit for bit
                    if differ and row["kernel"].startswith("cuda") and variant != "e4m3fn":
                        ok = False
        goal = goals.get((op, n))
        mine = next((r for r in rows if r.get("op") == op and r.get("n") == n and r.get("kernel") == "cuda"
                     and "pct_copy" in r), None)
        if mine is not None and goal is not None:
            mine["goal_pct"] = goal
            mine["meets_goal"] = mine["pct_copy"] >= goal
            tri = next((r for r in rows if r.get("op") == op and r.get("n") == n and r.get("kernel") == "triton"
                        and "us" in r), None)
            if tri is not None:
                mine["faster_than_triton"] = mine["us"] < tri["us"]
    print(f"\n{'op':<24} {'variant':<7} {'N':>6} {'kernel':<12} {'us':>9} {'GB/s':>7} {'%copy':>6}  check / goal")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:<24} {r['variant']:<7} {r['n']:>6} {r['kernel']:<12} ERROR {r['error'][:80]}")
            continue
        goal = ""
        if "goal_pct" in r:
            goal = f"goal {r['goal_pct']}%: {'MET' if r['meets_goal'] else 'MISSED'}"
            if "faster_than_triton" in r:
                goal += f", {'faster' if r['faster_than_triton'] else 'SLOWER'} than triton"
        print(f"{r['op']:<24} {r['variant']:<7} {r['n']:>6} {r['kernel']:<12} {r['us']:>9.1f} {r['gbps']:>7.0f} "
              f"{r['pct_copy']:>6.1f}  {r.get('check', '-')} {goal}", flush=True)
    (scratch / "bench.json").write_text(json.dumps({"copy": copy, "rows": rows}, indent=2, default=str))
    return {"status": "pass" if ok else "fail", "copy_gbps": round(ceiling, 1), "rows": rows}
