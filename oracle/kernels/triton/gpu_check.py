"""CUDA-graph replay check of the Triton kernels, for a machine with a GPU.

    python -m oracle.kernels.triton.gpu_check --out DIR [--replays 4] [--seed 0] [--variant pdl]

For every scenario (each op, copy and fp8 paths, NHD and HND caches, fused sources, strided
indices, -1 padding, per-head scales, int32 and int64 indices):

1. the static inputs are built once on the GPU; caches (and the translate output's inputs) live in
   poisoned allocations with guard bands;
2. one eager call is checked against the reference (``oracle.reference``);
3. the call is warmed up on a side stream, then captured once in a ``torch.cuda.CUDAGraph``;
4. the graph is replayed ``--replays`` times; before each replay new slots, sources, scales (and
   the SWA mapping) are copied into the captured input buffers, and after it every written view
   is compared bit for bit with the reference computed from the state just before the replay,
   the inputs must be unchanged and every guard band intact.

``--variant`` calls every op the way one of its registrations does: ``default`` (validated, as
``triton.<op>``), ``unchecked`` (``validate=False``, ``triton.<op>.unchecked``: the path a decode
graph captures) or ``pdl`` (``validate=False, pdl=True``, ``triton.<op>.pdl``: launched with
programmatic dependent launch, L2 prefetch first; sm_90 and newer). Ops without that keyword
(``quantize_fp8`` has neither; ``translate_full_to_swa`` has no ``pdl``) are recorded as skipped.

fp8 scenarios run on sm_90 and newer only (preset ``triton_sm90``; elsewhere they are recorded
as skipped). Results go to ``DIR/gpu_check.json`` and a table on stdout. Exit status: 0 when every
check passed, 1 when any failed (each failure also printed to stderr), 2 when the check could not
run at all (no CUDA device, TRITON_INTERPRET set, triton missing).

``--cpu-dry-run`` (with TRITON_INTERPRET=1, no GPU) runs step 2 of the copy scenarios on the CPU
interpreter: it checks the scenario builders and the comparison, not the graphs.
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
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ... import reference
from ...buffers import NUMPY_DTYPES, TORCH_DTYPES, to_numpy, to_torch
from ...ops import _build, _fp8cases
from . import ops

PRESET = "triton_sm90"
VARIANTS = {"default": {}, "unchecked": {"validate": False}, "pdl": {"validate": False, "pdl": True}}
GUARD = 4096  # bytes of poison on each side of every allocation


class Region:
    """A poisoned byte allocation with guard bands; views are carved out of its payload."""

    def __init__(self, name: str, nbytes: int, device, rng: np.random.Generator):
        self.name = name
        self.nbytes = nbytes
        poison = rng.integers(1, 256, nbytes + 2 * GUARD, dtype=np.uint8)
        self.base = torch.from_numpy(poison).to(device)
        self.guards = (poison[:GUARD].copy(), poison[GUARD + nbytes:].copy())

    def view(self, shape, strides, dtype: str, offset: int = 0) -> torch.Tensor:
        itemsize = NUMPY_DTYPES[dtype].itemsize
        payload = self.base[GUARD: GUARD + self.nbytes - self.nbytes % itemsize]
        typed = payload.view(TORCH_DTYPES[dtype])
        return typed.as_strided(tuple(shape), tuple(strides), typed.storage_offset() + offset)

    def guard_problem(self) -> str | None:
        host = self.base.cpu().numpy()
        for side, want, got in (("before", self.guards[0], host[:GUARD]),
                                ("after", self.guards[1], host[GUARD + self.nbytes:])):
            differ = np.flatnonzero(want != got)
            if differ.size:
                return f"guard band {side} {self.name} written ({differ.size} bytes, first at {int(differ[0])})"
        return None


def contiguous(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


@dataclass
class Setup:
    """One scenario's static buffers: ``call`` is what gets captured; ``refresh(rng)`` copies new
    values into the input buffers; ``expected(snapshot)`` gives the reference's contents of the
    ``written`` views (and ``"returned"``) from a host snapshot of ``views``."""

    call: Callable[[], object]
    refresh: Callable[[np.random.Generator], None]
    expected: Callable[[dict], dict]
    views: dict
    written: tuple
    regions: list = field(default_factory=list)
    returns: bool = False


def _put(tensor: torch.Tensor, values: np.ndarray) -> None:
    """Copy host values into a (possibly strided) device buffer, in place."""
    tensor.copy_(to_torch(np.ascontiguousarray(values)).to(tensor.device))


def _slots(rng, n, num_slots, padding: bool) -> np.ndarray:
    out = rng.permutation(np.arange(1, num_slots))[:n].astype(np.int64)
    if padding:
        out[rng.choice(n, size=max(1, n // 8), replace=False)] = -1
    return out


def _alloc(regions, name, shape, dtype, device, rng, strides=None, lead=0) -> torch.Tensor:
    itemsize = NUMPY_DTYPES[dtype].itemsize
    strides = strides or contiguous(shape)
    extent = lead + 1 + sum((int(n) - 1) * s for n, s in zip(shape, strides))
    region = Region(name, extent * itemsize, device, rng)
    regions.append(region)
    return region.view(shape, strides, dtype, lead)


# --- scenarios ------------------------------------------------------------------------------

def store_cache_setup(device, rng, *, dtype="bfloat16", heads=8, dim=128, n=48, index="int64",
                      index_layout="contig", call_kw=None) -> Setup:
    regions = []
    slots = 256
    row = heads * dim
    qkv = _alloc(regions, "qkv", (n, 3 * row), dtype, device, rng)  # fused: k, v are strided slices
    k = qkv[:, row:2 * row].view(n, heads, dim)
    v = qkv[:, 2 * row:].view(n, heads, dim)
    k_cache = _alloc(regions, "k_cache", (slots, heads, dim), dtype, device, rng)
    v_cache = _alloc(regions, "v_cache", (slots, heads, dim), dtype, device, rng)
    if index_layout == "strided":
        loc = _alloc(regions, "loc", (n,), index, device, rng, strides=(2,))
    else:
        loc = _alloc(regions, "loc", (n,), index, device, rng)

    def refresh(rng):
        _put(qkv, _build.values(rng, (n, 3 * row), dtype))
        _put(loc, _slots(rng, n, slots, False).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {name: reference.store_cache(s[name], s["loc"], s[src], padding="none")
                for name, src in (("k_cache", "k"), ("v_cache", "v"))}

    return Setup(lambda: ops.store_cache(k, v, k_cache, v_cache, loc, **(call_kw or {})), refresh, expected,
                 {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "loc": loc},
                 ("k_cache", "v_cache"), regions)


def set_mla_setup(device, rng, *, dtype="bfloat16", nope=512, rope=64, width=None, n=40,
                  index="int32", call_kw=None) -> Setup:
    regions = []
    slots = 200
    width = width or nope + rope
    latent = _alloc(regions, "latent", (n, 64 + nope + rope), dtype, device, rng)
    nope_t, rope_t = latent[:, 64:64 + nope], latent[:, 64 + nope:]
    buf = _alloc(regions, "kv_buffer", (slots, width), dtype, device, rng)
    loc = _alloc(regions, "loc", (n,), index, device, rng)

    def refresh(rng):
        _put(latent, _build.values(rng, (n, 64 + nope + rope), dtype))
        _put(loc, _slots(rng, n, slots, False).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {"kv_buffer": reference.set_mla_kv_buffer(s["kv_buffer"], s["loc"], s["nope"], s["rope"],
                                                         padding="none")}

    return Setup(lambda: ops.set_mla_kv_buffer(buf, loc, nope_t, rope_t, **(call_kw or {})), refresh, expected,
                 {"kv_buffer": buf, "loc": loc, "nope": nope_t, "rope": rope_t}, ("kv_buffer",),
                 regions)


def _fp8_sources(rng, values, fmt, shape, dtype, scale, head_axis=-2):
    if fmt is None:
        return _build.values(rng, shape, dtype)
    return _fp8cases.values(rng, values, fmt, shape, dtype, scale, head_axis)


def concat_mla_setup(device, rng, *, fmt=None, dtype="bfloat16", rank=512, rope=64, block_size=16,
                     n=40, values="special", index="int64", call_kw=None) -> Setup:
    regions = []
    num_blocks = 12
    kv_c = _alloc(regions, "kv_c", (n, rank), dtype if not fmt else "float32", device, rng,
                  strides=(rank + rope + 32, 1))  # a row stride past the row
    k_pe = _alloc(regions, "k_pe", (n, rope), dtype if not fmt else "float32", device, rng)
    cache = _alloc(regions, "kv_cache", (num_blocks, block_size, rank + rope),
                   "uint8" if fmt else dtype, device, rng)
    slots = _alloc(regions, "slot_mapping", (n,), index, device, rng)
    scale = _alloc(regions, "scale", (1,), "float32", device, rng)
    src_dtype = "float32" if fmt else dtype

    def refresh(rng):
        s = np.array([0.0123 * (1 + rng.integers(0, 5))], np.float32) if fmt else np.ones(1, np.float32)
        _put(scale, s)
        _put(kv_c, _fp8_sources(rng, values, fmt, (n, rank), src_dtype, s))
        _put(k_pe, _fp8_sources(rng, values, fmt, (n, rope), src_dtype, s))
        _put(slots, _slots(rng, n, num_blocks * block_size, True).astype(NUMPY_DTYPES[index]))

    def expected(s):
        fp8 = {"kv_cache_dtype": fmt, "scale": s["scale"], "preset": PRESET} if fmt else {}
        with np.errstate(all="ignore"):
            return {"kv_cache": reference.concat_and_cache_mla(s["kv_cache"], s["slot_mapping"], s["kv_c"],
                                                               s["k_pe"], padding="negative", **fp8)}

    return Setup(lambda: ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt or "auto", scale,
                                                   **(call_kw or {})),
                 refresh, expected,
                 {"kv_c": kv_c, "k_pe": k_pe, "kv_cache": cache, "slot_mapping": slots, "scale": scale},
                 ("kv_cache",), regions)


def flash_setup(device, rng, *, fmt=None, dtype="bfloat16", layout="NHD", scale_kind="tensor",
                heads=8, dim=128, n=48, values="special", index="int64", call_kw=None) -> Setup:
    regions = []
    num_blocks, block_size = 10, 16
    src_dtype = "float32" if fmt and values != "random" else dtype
    row = heads * dim
    qkv = _alloc(regions, "qkv", (n + 8, 3 * row), src_dtype, device, rng)  # T > num_tokens
    key = qkv[:, row:2 * row].view(n + 8, heads, dim)
    value = qkv[:, 2 * row:].view(n + 8, heads, dim)
    cache_dtype = "uint8" if fmt else src_dtype
    caches = []
    for name, extra in (("key_cache", 1), ("value_cache", 2)):  # padded blocks, K and V differ
        if layout == "NHD":
            block = (block_size + extra) * row
            caches.append(_alloc(regions, name, (num_blocks, block_size, heads, dim), cache_dtype, device,
                                 rng, strides=(block, row, dim, 1)))
        else:  # HND: a [blocks, H, block_size, D] allocation seen as [blocks, block_size, H, D]
            block = heads * (block_size + extra) * dim
            caches.append(_alloc(regions, name, (num_blocks, block_size, heads, dim), cache_dtype, device,
                                 rng, strides=(block, dim, (block_size + extra) * dim, 1)))
    key_cache, value_cache = caches
    slots = _alloc(regions, "slot_mapping", (n,), index, device, rng)
    scale_shape = (heads,) if scale_kind == "head" else (1,)
    k_scale = _alloc(regions, "k_scale", scale_shape, "float32", device, rng)
    v_scale = _alloc(regions, "v_scale", scale_shape, "float32", device, rng)

    def refresh(rng):
        factor = float(1 + rng.integers(0, 5))
        if fmt:
            scales = [_fp8cases.scale_values("head" if scale_kind == "head" else "0.0123", heads, t) * factor
                      for t in (0, 1)]
        else:
            scales = [np.ones(1, np.float32)] * 2
        scales = [s.astype(np.float32) for s in scales]
        _put(k_scale, scales[0])
        _put(v_scale, scales[1])
        k = _fp8_sources(rng, values, fmt, (n + 8, heads, dim), src_dtype, scales[0])
        v = _fp8_sources(rng, values, fmt, (n + 8, heads, dim), src_dtype, scales[1])
        _put(qkv, np.concatenate([_build.values(rng, (n + 8, row), src_dtype), k.reshape(n + 8, row),
                                  v.reshape(n + 8, row)], axis=1))
        _put(slots, _slots(rng, n, num_blocks * block_size, True).astype(NUMPY_DTYPES[index]))

    def expected(s):
        fp8 = {"preset": PRESET} if fmt else {}
        with np.errstate(all="ignore"):
            k, v = reference.reshape_and_cache_flash(
                s["key_cache"], s["value_cache"], s["slot_mapping"], s["key"], s["value"],
                kv_cache_dtype=fmt or "auto", k_scale=s["k_scale"], v_scale=s["v_scale"], layout="NHD",
                padding="negative", **fp8)
        return {"key_cache": k, "value_cache": v}

    return Setup(lambda: ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, fmt or "auto",
                                                     k_scale, v_scale, **(call_kw or {})),
                 refresh, expected,
                 {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                  "slot_mapping": slots, "k_scale": k_scale, "v_scale": v_scale},
                 ("key_cache", "value_cache"), regions)


def quantize_setup(device, rng, *, fmt="e4m3fn", scale_kind="head", heads=8, dim=128, n=64,
                   values="special", dtype="float32") -> Setup:
    regions = []
    x = _alloc(regions, "x", (n, heads, dim), dtype, device, rng,
               strides=(heads * dim + 64, dim, 1))  # rows sliced from a wider tensor
    out = _alloc(regions, "out", (n, heads, dim), "uint8", device, rng)
    scale = _alloc(regions, "scale", (heads,) if scale_kind == "head" else (1,), "float32", device, rng)

    def refresh(rng):
        factor = float(1 + rng.integers(0, 5))
        s = (_fp8cases.scale_values("head" if scale_kind == "head" else "0.0123", heads) * factor)
        s = s.astype(np.float32)
        _put(scale, s)
        _put(x, _fp8_sources(rng, values, fmt, (n, heads, dim), dtype, s))

    def expected(s):
        with np.errstate(all="ignore"):
            return {"out": reference.quantize(s["x"], fmt, scale=s["scale"], head_axis=-2, preset=PRESET)}

    return Setup(lambda: ops.quantize_fp8(out, x, scale, fmt), refresh, expected,
                 {"x": x, "out": out, "scale": scale}, ("out",), regions)


def translate_setup(device, rng, *, dtype="int64", index="int64", shape=(64,), size_full=1024,
                    page_size=16, call_kw=None) -> Setup:
    regions = []
    length = size_full + page_size + 1
    mapping = _alloc(regions, "mapping", (length,), dtype, device, rng, lead=5)  # at an offset
    loc = _alloc(regions, "loc", shape, index, device, rng)
    table = length - 1

    def refresh(rng):
        m = np.zeros(length, np.int64)
        m[page_size:table] = rng.integers(0, size_full + page_size, size=table - page_size)
        m[-1] = -1
        _put(mapping, m.astype(NUMPY_DTYPES[dtype]))
        entries = rng.integers(0, table, size=int(np.prod(shape)))
        entries[rng.choice(entries.size, size=max(1, entries.size // 8), replace=False)] = -1
        _put(loc, entries.reshape(shape).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {"returned": reference.translate_full_to_swa(s["mapping"], s["loc"])}

    return Setup(lambda: ops.translate_full_to_swa(mapping, loc, **(call_kw or {})), refresh, expected,
                 {"mapping": mapping, "loc": loc}, (), regions, returns=True)


SCENARIOS = {
    "store_cache/bf16/fused/int64": (store_cache_setup, {}, False),
    "store_cache/u8/strided_index/int32": (store_cache_setup, {"dtype": "uint8", "index": "int32",
                                                               "index_layout": "strided"}, False),
    "store_cache/fp32/odd_row/int64": (store_cache_setup, {"dtype": "float32", "heads": 1, "dim": 97}, False),
    "set_mla_kv_buffer/bf16/512+64/int32": (set_mla_setup, {}, False),
    "set_mla_kv_buffer/u8/528+128/W700/int64": (set_mla_setup, {"dtype": "uint8", "nope": 528, "rope": 128,
                                                                "width": 700, "index": "int64"}, False),
    "concat_and_cache_mla/auto/bf16/int64": (concat_mla_setup, {}, False),
    "concat_and_cache_mla/e4m3fn/special": (concat_mla_setup, {"fmt": "e4m3fn"}, True),
    "concat_and_cache_mla/e5m2/special/int32": (concat_mla_setup, {"fmt": "e5m2", "index": "int32",
                                                                   "rank": 97, "rope": 31,
                                                                   "block_size": 5}, True),
    "reshape_and_cache_flash/auto/bf16/NHD": (flash_setup, {}, False),
    "reshape_and_cache_flash/auto/fp16/HND/int32": (flash_setup, {"dtype": "float16", "layout": "HND",
                                                                  "index": "int32"}, False),
    "reshape_and_cache_flash/e4m3fn/HND/head/special": (flash_setup, {"fmt": "e4m3fn", "layout": "HND",
                                                                      "scale_kind": "head"}, True),
    "reshape_and_cache_flash/e5m2/NHD/tensor/special": (flash_setup, {"fmt": "e5m2"}, True),
    "reshape_and_cache_flash/e4m3fn/NHD/tensor/bf16_random": (flash_setup, {"fmt": "e4m3fn",
                                                                            "values": "random"}, True),
    "quantize_fp8/e4m3fn/head/special": (quantize_setup, {}, True),
    "quantize_fp8/e5m2/tensor/double_rounding": (quantize_setup, {"fmt": "e5m2", "scale_kind": "tensor",
                                                                  "values": "double_rounding"}, True),
    "quantize_fp8/e4m3fn/tensor/bf16_random": (quantize_setup, {"scale_kind": "tensor", "values": "random",
                                                                "dtype": "bfloat16"}, True),
    "translate_full_to_swa/int64/1d": (translate_setup, {}, False),
    "translate_full_to_swa/int32/2d/int32": (translate_setup, {"dtype": "int32", "index": "int32",
                                                               "shape": (16, 3)}, False),
}


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


def environment(device) -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "device": str(device), "interpreter": ops.interpreting()}
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = list(torch.cuda.get_device_capability(device))
        env["cuda"] = torch.version.cuda
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.kernels.triton.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--replays", type=int, default=4, help="graph replays per scenario (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="run scenarios whose name contains this text")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default="default",
                        help="call the ops as triton.<op> (default), .unchecked or .pdl (sm_90+)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="TRITON_INTERPRET=1 without a GPU: eager copy scenarios only, no graphs")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_check.json")

    def fatal(message: str) -> int:
        print(f"gpu_check: CANNOT RUN: {message}", file=sys.stderr)
        with open(path, "w") as fh:
            json.dump({"status": "not run", "error": message}, fh, indent=2)
        return 2

    if args.replays < 1:
        return fatal("--replays must be at least 1")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return fatal(f"triton is not importable: {exc}")
    if args.cpu_dry_run:
        if not ops.interpreting():
            return fatal("--cpu-dry-run needs TRITON_INTERPRET=1 (set before Python starts)")
        device, graphs, fp8 = torch.device("cpu"), False, False
    else:
        if ops.interpreting():
            return fatal("TRITON_INTERPRET is set: the kernels run on the CPU interpreter, not the GPU")
        if not torch.cuda.is_available():
            return fatal("no CUDA device")
        device, graphs = torch.device("cuda", torch.cuda.current_device()), True
        sm90 = torch.cuda.get_device_capability(device) >= (9, 0)
        fp8 = sm90  # the fp8 contract (preset triton_sm90) is declared there only
        if args.variant == "pdl" and not sm90:
            return fatal("--variant pdl needs sm_90 or newer (programmatic dependent launch)")
    call_kw = VARIANTS[args.variant]
    rng = np.random.default_rng(args.seed)
    results = []
    start = time.perf_counter()
    for name, (build, params, needs_fp8) in SCENARIOS.items():
        if args.only and args.only not in name:
            continue
        op = name.split("/")[0]
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
            setup = build(device, rng, **params, **({"call_kw": call_kw} if call_kw else {}))
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
    sabotage = store_cache_setup(device, rng)
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
               "seconds": round(time.perf_counter() - start, 3), "environment": environment(device),
               "counts": {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skipped")},
               "results": results}
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
