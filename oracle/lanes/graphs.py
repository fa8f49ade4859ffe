"""The CUDA-graph replay lane, for a machine with a GPU: each scenario called eagerly, then replayed
from a captured CUDA graph with new inputs, for the Triton or the CUDA kernels.

    python -m oracle.lanes.graphs --out DIR [--backend triton|cuda] [--replays 4] [--seed 0] [--variant plain]

For every scenario of :mod:`oracle.lanes.graph_scenarios` (each op, copy and fp8 paths, NHD and
HND caches, fused sources, strided indices, -1 padding, per-head scales, int32 and int64 indices):

1. the static inputs are built once on the GPU; caches (and the translate output's inputs) live in
   poisoned allocations with guard bands;
2. one eager call is checked against the reference (``oracle.reference``);
3. the call is warmed up on a side stream, then captured once in a ``torch.cuda.CUDAGraph``;
4. the graph is replayed ``--replays`` times; before each replay new slots, sources, scales (and
   the SWA mapping) are copied into the captured input buffers, and after it every written view
   is compared bit for bit with the reference computed from the state just before the replay,
   the inputs must be unchanged and every guard band intact.

``--backend``: ``triton`` (the default: ``oracle.kernels.triton.ops``) or ``cuda`` (the Hopper
kernels, ``oracle.kernels.cuda``; its fp8 reference is the preset ``cuda_satfinite``). A scenario
whose op the backend lacks is recorded as skipped.

``--variant`` calls every op the way one of its registrations does: ``default`` (validated, as
``<backend>.<op>``; on sm_90+ launched with programmatic dependent launch, the writers' default
there), ``unchecked`` (``validate=False``, ``<backend>.<op>.unchecked``: the path a decode graph
captures), or ``plain`` (validated, ``pdl=False``: the launch without programmatic dependent
launch). Ops without that keyword (``quantize_fp8`` and ``translate_full_to_swa`` have no ``pdl``)
are recorded as skipped.

fp8 scenarios run on sm_90 and newer only (preset ``triton_sm90`` for Triton; elsewhere they are
recorded as skipped). Results go to ``DIR/gpu_check.json`` (with ``"backend"`` first when it is not
Triton) and a table on stdout. Exit status: 0 when every check passed, 1 when any failed (each
failure also printed to stderr), 2 when the check could not run at all (no CUDA device,
TRITON_INTERPRET set, triton missing, the CUDA kernels unavailable).

``--cpu-dry-run`` (with TRITON_INTERPRET=1, no GPU; Triton only) runs step 2 of the copy scenarios
on the CPU interpreter: it checks the scenario builders and the comparison, not the graphs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import sys
import time
import traceback

import numpy as np
import torch

from ..buffers import NUMPY_DTYPES, to_numpy
# the scenarios and their builders are part of this lane's interface (tests build and sabotage them)
from .graph_block_scenarios import BLOCK_SCENARIOS
from .graph_scenarios import (BACKENDS, SCENARIOS, TRITON, Backend, Setup, _put, concat_mla_setup,  # noqa: F401
                              flash_setup, quantize_setup, set_mla_setup, store_cache_setup, translate_setup)

VARIANTS = TRITON.variants  # --variant -> the keywords the Triton ops are called with


# --- checking -------------------------------------------------------------------------------

def snapshot(setup: Setup) -> dict:
    """Host copies of every view (copies: on the CPU ``to_numpy`` may alias the tensor)."""
    return {name: to_numpy(t).copy() for name, t in setup.views.items()}


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a


def compare(name: str, got: np.ndarray, want) -> str | None:
    """None when ``got`` equals ``want`` bit for bit, else the first difference and a count."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype}, expected {want.dtype}"
    g, w = _bits(got), _bits(want)
    differ = np.argwhere(g != w)
    if not differ.size:
        return None
    first = tuple(int(i) for i in differ[0])
    return (f"{name}{list(first)}: got 0x{int(g[first]):X}, expected 0x{int(w[first]):X} "
            f"({len(differ)} of {g.size} elements differ)")


def repoison(setup: Setup, rng: np.random.Generator) -> None:
    """Fresh random bytes in every written view, so a call that writes nothing (a graph without
    the kernel) cannot match the reference by leaving the previous results in place."""
    for name in setup.written:
        view = setup.views[name]
        dtype = NUMPY_DTYPES[str(view.dtype).removeprefix("torch.")]
        raw = rng.integers(0, 256, view.numel() * dtype.itemsize, dtype=np.uint8)
        _put(view, raw.view(dtype).reshape(tuple(view.shape)))


def check(setup: Setup, before: dict, returned) -> list[str]:
    """Problems after one call: written views vs the reference, inputs unchanged, guards."""
    problems = []
    want = setup.expected(before)
    if setup.written and all(np.array_equal(_bits(before[w]), _bits(np.asarray(want[w])))
                             for w in setup.written):
        problems.append("the scenario is vacuous: the reference writes nothing")
    after = snapshot(setup)
    for name in setup.written:
        problem = compare(name, after[name], want[name])
        if problem:
            problems.append(problem)
    for name in setup.views:
        if name not in setup.written:
            problem = compare(name + " (an input, must be unchanged)", after[name], before[name])
            if problem:
                problems.append(problem)
    if setup.returns:
        if not isinstance(returned, torch.Tensor):
            problems.append(f"returned {type(returned).__name__}, not a tensor")
        else:
            problem = compare("returned", to_numpy(returned), want["returned"])
            if problem:
                problems.append(problem)
    problems += [p for p in (r.guard_problem() for r in setup.regions) if p]
    return problems


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run_scenario(name: str, setup: Setup, device, rng, replays: int, graphs: bool) -> dict:
    result = {"scenario": name, "eager": None, "replays": [], "status": "fail"}
    stage = "eager"
    try:
        setup.refresh(rng)
        repoison(setup, rng)
        _sync(device)
        before = snapshot(setup)
        returned = setup.call()
        _sync(device)
        result["eager"] = check(setup, before, returned) or "pass"
        if graphs:
            stage = "warm-up"
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    setup.call()
            torch.cuda.current_stream(device).wait_stream(stream)
            _sync(device)
            stage = "capture"
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = setup.call()
            _sync(device)
            for r in range(replays):
                stage = f"replay {r}"
                setup.refresh(rng)
                repoison(setup, rng)
                if isinstance(static_out, torch.Tensor):  # what a graph that did not run leaves
                    static_out.fill_(-7)
                _sync(device)
                before = snapshot(setup)
                graph.replay()
                _sync(device)
                result["replays"].append(check(setup, before, static_out) or "pass")
        ok = result["eager"] == "pass" and all(r == "pass" for r in result["replays"])
        if graphs and len(result["replays"]) != replays:
            ok = False
        result["status"] = "pass" if ok else "fail"
    except Exception as exc:  # recorded with its traceback; the other scenarios still run
        result["error"] = f"{stage}: {type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    return result


def _interpreting(backend: Backend) -> bool:
    """Whether the backend's kernels run on Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return backend.interpreter and backend.ops().interpreting()


def environment(device, backend: Backend = TRITON) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__}
    if backend is TRITON:
        import triton

        env["triton"] = triton.__version__
    env.update(device=str(device), interpreter=_interpreting(backend))
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = list(torch.cuda.get_device_capability(device))
        env["cuda"] = torch.version.cuda
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.lanes.graphs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--replays", type=int, default=4, help="graph replays per scenario (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="run scenarios whose name contains this text")
    parser.add_argument("--backend", choices=tuple(BACKENDS), default="triton",
                        help="whose kernels: triton (default) or cuda (sm_90; the ops it has)")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default="default",
                        help="call the ops as <backend>.<op> (default), .unchecked, or plainly launched (pdl=False)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="TRITON_INTERPRET=1 without a GPU: eager copy scenarios only, no graphs")
    args = parser.parse_args(argv)
    backend = BACKENDS[args.backend]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_check.json")

    def fatal(message: str) -> int:
        print(f"gpu_check: CANNOT RUN: {message}", file=sys.stderr)
        with open(path, "w") as fh:
            json.dump({"status": "not run", "error": message}, fh, indent=2)
        return 2

    if args.replays < 1:
        return fatal("--replays must be at least 1")
    if backend is TRITON:
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            return fatal(f"triton is not importable: {exc}")
    ops = backend.ops()
    if args.cpu_dry_run:
        if not backend.interpreter:
            return fatal(f"--cpu-dry-run runs the Triton interpreter; the {backend.name} kernels have none")
        if not _interpreting(backend):
            return fatal("--cpu-dry-run needs TRITON_INTERPRET=1 (set before Python starts)")
        device, graphs, fp8 = torch.device("cpu"), False, False
    else:
        if _interpreting(backend):
            return fatal("TRITON_INTERPRET is set: the kernels run on the CPU interpreter, not the GPU")
        if not torch.cuda.is_available():
            return fatal("no CUDA device")
        device, graphs = torch.device("cuda", torch.cuda.current_device()), True
        sm90 = torch.cuda.get_device_capability(device) >= (9, 0)
        fp8 = sm90  # the fp8 contract (preset triton_sm90) is declared there only
        reason = getattr(ops, backend.available)() if backend.available else None
        if reason:
            return fatal(f"the {backend.name} kernels are unavailable: {reason}")
    call_kw = backend.variants[args.variant]
    rng = np.random.default_rng(args.seed)
    results = []
    start = time.perf_counter()
    for name, (build, params, needs_fp8) in {**SCENARIOS, **BLOCK_SCENARIOS}.items():
        if args.only and args.only not in name:
            continue
        op = name.split("/")[0]
        if not hasattr(ops, op):
            results.append({"scenario": name, "status": "skipped",
                            "reason": f"the {backend.name} backend has no {op}"})
            continue
        missing = [k for k in call_kw if k not in inspect.signature(getattr(ops, op)).parameters]
        if missing:
            results.append({"scenario": name, "status": "skipped",
                            "reason": f"{op} has no {args.variant} variant (it takes no {', '.join(missing)})"})
            continue
        if needs_fp8 and not fp8:
            why = ("the interpreter's fp8 conversion is wrong" if args.cpu_dry_run
                   else "fp8 is declared on sm_90 and newer only")
            results.append({"scenario": name, "status": "skipped", "reason": why})
            continue
        try:
            setup = build(device, rng, **params, backend=backend,
                          **({"call_kw": call_kw} if call_kw else {}))
        except Exception as exc:
            results.append({"scenario": name, "status": "fail", "error": f"setup: {type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()})
            continue
        results.append(run_scenario(name, setup, device, rng, args.replays, graphs))
        if device.type == "cuda":
            del setup
            torch.cuda.empty_cache()
    # the harness itself: a captured call that runs GPU work but leaves the caches alone (a graph
    # without the kernel) must be reported as failing
    sabotage = store_cache_setup(device, rng, backend=backend)
    scratch = torch.zeros(16, device=device)
    sabotage.call = lambda: scratch.add_(1)
    probe = run_scenario("self-test: a call that writes nothing", sabotage, device, rng,
                         min(args.replays, 2), graphs)
    detected = probe["status"] == "fail" and "error" not in probe
    results.append({"scenario": "harness self-test (a no-op call must fail)",
                    "status": "pass" if detected else "fail",
                    **({} if detected else {"error": f"a no-op call was not caught: {probe}"})})
    failed = [r for r in results if r["status"] == "fail"]
    passed = [r for r in results if r["status"] == "pass"]
    summary = {"status": "fail" if failed or not passed else "pass",
               "mode": "cpu dry run (eager, interpreter)" if args.cpu_dry_run else "cuda graph replay",
               "replays": 0 if args.cpu_dry_run else args.replays, "seed": args.seed, "variant": args.variant,
               "seconds": round(time.perf_counter() - start, 3), "environment": environment(device, backend),
               "counts": {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skipped")},
               "results": results}
    if backend is not TRITON:  # a report without "backend" is the Triton kernels', as before there was a choice
        summary = {"backend": backend.name, **summary}
    with open(path, "w") as fh:
        json.dump(summary, fh, indent=2, default=str)
    width = max(len(r["scenario"]) for r in results) if results else 10
    for r in results:
        print(f"{r['scenario']:<{width}}  {r['status']}")
    for r in failed:
        print(f"FAIL {r['scenario']}: {r.get('error') or ''}", file=sys.stderr)
        if r.get("eager") not in (None, "pass"):
            print(f"  eager: {r['eager']}", file=sys.stderr)
        for i, rep in enumerate(r.get("replays", [])):
            if rep != "pass":
                print(f"  replay {i}: {rep}", file=sys.stderr)
        if r.get("traceback"):
            print(r["traceback"], file=sys.stderr)
    print(f"gpu_check: {summary['status'].upper()}: {summary['counts']} -> {path}")
    if not passed:
        print("gpu_check: no scenario passed", file=sys.stderr)
    return 0 if summary["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
