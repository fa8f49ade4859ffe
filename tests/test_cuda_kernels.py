"""The Hopper CUDA kernels (oracle.kernels.cuda) and the sanitizer lane (oracle.lanes.sanitize).

CPU-side (run everywhere): registration and availability reasons, the build cache key, the build
and cached-load path (with a stand-in for cpp_extension.load), that every .cu translation unit
compiles for sm_90 with nvcc and the torch binding passes ``g++ -fsyntax-only`` (skipped without
nvcc / g++), the fake kernels, the sanitizer output parser, the graph-replay lane's CUDA backend
(oracle.lanes.graphs --backend cuda: the calls and the reference it builds, its refusal here).

GPU-side (skipped unless the kernels are available: a CUDA torch, a Hopper GPU, nvcc): opcheck on
every op, every vector width and MLA path against a torch/numpy reference, many rows per warp (the
TMA buffer cycling), fp8 special values, CUDA-graph capture, rejection of bad slots.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import oracle.kernels
import oracle.kernels.cuda as cuda_kernels
from oracle.kernels.cuda import _build, _fake
from oracle.lanes import sanitize
from oracle.registry import Registry

CSRC = _build.CSRC


# ================================================================ registration and availability

def _registry(plugin) -> Registry:
    registry = Registry()
    registry.load_plugin("test", plugin)
    assert not registry.errors, [e.detail for e in registry.errors]
    return registry


def test_register_declares_honest_contracts():
    registry = _registry(cuda_kernels.register)
    ops = ("store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash")
    assert set(registry.kernels) == {f"cuda.{op}{suffix}" for op in ops
                                     for suffix in ("", ".unchecked", ".checked_index")}
    # both launch with PDL by default (the notes say so); the .unchecked twin keeps every field of
    # the contract but its name and notes, and declares that it does not validate
    for op in ops:
        plain = registry.kernels[f"cuda.{op}"].contract
        assert "griddepcontrol.wait" in plain.notes
        assert "pdl" not in getattr(registry.kernels[f"cuda.{op}"].fn, "keywords", {})
        unchecked = registry.kernels[f"cuda.{op}.unchecked"].contract
        assert dataclasses.replace(unchecked, name=plain.name, notes=plain.notes, validates=True) == plain
        assert not unchecked.validates and "validate=False" in unchecked.notes
        assert "checked on the device" not in unchecked.notes
        # .checked_index: the same contract, the index checked by check_index before the call
        checked = registry.kernels[f"cuda.{op}.checked_index"]
        assert dataclasses.replace(checked.contract, name=plain.name, notes=plain.notes) == plain
        assert "oracle.kernels.check_index" in checked.contract.notes
        assert checked.fn.fn is registry.kernels[f"cuda.{op}"].fn and checked.fn.padding == plain.padding
    kernels = {k.contract.op: k for name, k in registry.kernels.items() if name.count(".") == 1}
    for op, kernel in kernels.items():
        c = kernel.contract
        assert c.name == f"cuda.{op}" and c.backend == "cuda" and c.device == "cuda"
        assert c.validates and c.duplicates == "forbid" and c.row_bytes_multiple == 1
        # slots are checked on the device: the error is raised after the next synchronization
        assert c.errors == "deferred" and c.raise_deferred is oracle.kernels.raise_deferred_errors
        assert c.strided_sources and c.strided_index and c.aliased_caches and c.large_caches
    assert kernels["store_cache"].contract.padding == "none"
    assert kernels["set_mla_kv_buffer"].contract.padding == "none"
    paged = kernels["reshape_and_cache_flash"].contract
    assert paged.padding == "negative" and paged.layouts == ("NHD", "HND")
    assert paged.fp8_formats == ("e4m3fn", "e5m2") and paged.fp8_preset == "cuda_satfinite"
    assert paged.scales == ("tensor", "head")
    # cvt.rn.satfinite: overflow and inf saturate, NaN is 0x7F without the sign (measured on sm_90)
    for fmt in paged.fp8_formats:
        knobs = paged.knobs(fmt)
        assert knobs.saturate and knobs.inf == "max" and knobs.nan == "0x7F"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without CUDA")
def test_unavailable_here_with_a_reason_and_no_build(tmp_path, monkeypatch):
    monkeypatch.setenv(_build.BUILD_DIR_ENV, str(tmp_path / "build"))
    registry = _registry(cuda_kernels.register)
    for kernel in registry.kernels.values():
        reason = kernel.unavailable()
        assert isinstance(reason, str) and reason
        if torch.version.cuda is None:
            assert "CPU-only build" in reason
    assert not (tmp_path / "build").exists(), "an unavailable machine must not start a build"
    with pytest.raises(RuntimeError, match="unavailable"):
        cuda_kernels.ops()


def test_probe_reasons(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_build, "nvcc_path", lambda: "/usr/bin/nvcc")
    reason = _build.probe()
    assert reason is not None and "no CUDA device" in reason and "CPU-only" not in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    reason = _build.probe()
    assert reason is not None and "A100 has compute capability 8.0" in reason and "9.0" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(_build, "nvcc_path", lambda: None)
    assert "nvcc was not found" in (_build.probe() or "")
    monkeypatch.setattr(_build, "nvcc_path", lambda: "/usr/bin/nvcc")
    ninja = shutil.which("ninja") is not None
    assert (_build.probe() is None) == (ninja and sys.platform.startswith("linux"))

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert "driver exploded" in (_build.probe() or "")


def test_probe_cpu_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    reason = _build.probe()
    assert reason is not None and "CPU-only build" in reason


def test_build_cache_key(tmp_path, monkeypatch):
    monkeypatch.delenv(_build.BUILD_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _build.source_hash()
    assert first == _build.source_hash() and len(first) == 16
    directory = _build.build_dir()
    torch_part = torch.__version__.replace("+", "_")
    assert directory == tmp_path / "kv-oracle" / f"cuda-{torch_part}-{first}"
    assert _build.library_path().name == f"kv_oracle_cuda_{first}.so"
    assert _build.build_dir(_build.BAD) != directory and _build.source_hash(_build.BAD) != first
    monkeypatch.setattr(_build, "NVCC_FLAGS", _build.NVCC_FLAGS + ("-DX",))
    assert _build.source_hash() != first, "a flag change must rebuild"
    monkeypatch.setattr(_build, "NVCC_FLAGS", _build.NVCC_FLAGS[:-1])
    monkeypatch.setattr(torch, "__version__", "9.9.9+cu999")
    assert _build.source_hash() != first, "another torch must rebuild"
    assert "cuda-9.9.9_cu999-" in str(_build.build_dir())
    monkeypatch.setenv(_build.BUILD_DIR_ENV, str(tmp_path / "pinned"))
    assert _build.build_dir() == tmp_path / "pinned"


def test_links_the_processes_own_libstdcxx(monkeypatch):
    """The library is linked against the libstdc++.so this process runs with (named before the
    driver's own -lstdc++), and that choice is part of the cache key."""
    flags = _build.libstdcxx_ldflags()
    if sys.platform.startswith("linux"):
        assert len(flags) == 1 and "libstdc++.so" in flags[0] and Path(flags[0]).is_file()
    first = _build.source_hash()
    monkeypatch.setattr(_build, "libstdcxx_ldflags", lambda: ["/elsewhere/libstdc++.so.6"])
    assert _build.source_hash() != first


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm")
@pytest.mark.parametrize("static", [False, True])
def test_a_static_libstdcxx_copy_is_detected(static, tmp_path):
    """The H100 crash: a library carrying its own copy of libstdc++'s iostreams next to the
    process's shared one segfaulted on its first `ostringstream << int`. carries_libstdcxx tells
    such a library from a dynamically linked one."""
    src = tmp_path / "s.cpp"
    src.write_text("#include <sstream>\n#include <string>\n"
                   "std::string show(long x) { std::ostringstream o; o << x; return o.str(); }\n")
    lib = tmp_path / "s.so"
    cmd = ["g++", "-shared", "-fPIC", "-O2", str(src), "-o", str(lib)] + (["-static-libstdc++"] if static else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"g++ could not link this way here: {proc.stderr[-300:]}")
    assert _build.carries_libstdcxx(lib) is static


def test_missing_sources_are_a_reason(monkeypatch, tmp_path):
    ext = _build.Extension("kv_oracle_cuda_missing", ("nope.cu",), ())
    assert "nope.cu missing" in _build.load(ext)


def _fresh_main() -> _build.Extension:
    """MAIN's sources in an Extension of its own: a clean load state (and, not being MAIN, a
    subdirectory of an overriding KV_ORACLE_CUDA_BUILD_DIR)."""
    return _build.Extension(_build.MAIN.namespace, _build.MAIN.sources, _build.MAIN.headers)


@pytest.fixture
def toolchain_stand_in(tmp_path, monkeypatch):
    """The build path without nvcc or a GPU: probe() passes and cpp_extension.load only writes the
    library file, or raises ``.error`` when a test sets it; ``.calls`` holds the options it got."""
    from torch.utils import cpp_extension

    stand_in = SimpleNamespace(calls=[], error=None)

    def load(**options):
        stand_in.calls.append(options)
        if stand_in.error:
            raise stand_in.error
        Path(options["build_directory"], options["name"] + ".so").write_text("")

    monkeypatch.setenv(_build.BUILD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(_build, "probe", lambda: None)
    monkeypatch.setattr(_build, "carries_libstdcxx", lambda library: False)
    monkeypatch.setattr(cpp_extension, "load", load)
    return stand_in


def test_load_builds_once_then_a_later_process_loads_the_cached_library(toolchain_stand_in, monkeypatch):
    ext = _fresh_main()
    directory = _build.build_dir(ext)
    directory.mkdir()
    (directory / "lock").write_text("")  # torch's own lock, as a killed build leaves it
    assert _build.load(ext) is None
    (options,) = toolchain_stand_in.calls
    assert options["name"] == _build.library_name(ext) and options["build_directory"] == str(directory)
    assert options["with_cuda"] and options["extra_cuda_cflags"] == list(_build.NVCC_FLAGS)
    assert options["extra_cflags"] == list(_build.CXX_FLAGS)
    assert options["extra_ldflags"] == _build.libstdcxx_ldflags()
    assert options["sources"] == [str(_build.CSRC / s) for s in ext.sources]
    assert (directory / _build.READY).is_file() and not (directory / "lock").exists()
    status = _build.status(ext)
    library = _build.library_path(ext, directory)
    assert status["built"] is True and status["loaded"] == str(library) and status["static_libstdcxx"] is False
    assert status["build_dir"] == str(directory) and status["build_seconds"] >= 0

    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    later = _fresh_main()  # another process: READY is there, so it loads without building
    assert _build.load(later) is None
    assert len(toolchain_stand_in.calls) == 1 and loaded == [str(library)]
    assert _build.status(later)["built"] is False


def test_a_failed_build_is_a_clipped_reason_and_not_retried(toolchain_stand_in):
    toolchain_stand_in.error = RuntimeError("first line\n" + "x" * 10000 + "\nlast line")
    ext = _fresh_main()
    directory = _build.build_dir(ext)
    reason = _build.load(ext)
    assert reason.startswith(f"building the CUDA kernels in {directory} failed: RuntimeError: first line")
    assert reason.endswith("last line") and "\n...\n" in reason and len(reason) < 4300
    assert not (directory / _build.READY).exists() and "build_seconds" in _build.status(ext)
    assert _build.load(ext) == reason and len(toolchain_stand_in.calls) == 1


# ================================================================ compiling here

def _nvcc():
    return _build.nvcc_path()


@pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", [s for s in _build.MAIN.sources + _build.BAD.sources if s.endswith(".cu")])
def test_cu_compiles_for_sm90(source, tmp_path):
    """Every CUDA translation unit depends on CUDA and plain C++ only, so it compiles here with the
    flags of the real build (plus those torch.utils.cpp_extension adds)."""
    cmd = [_nvcc(), *_build.NVCC_FLAGS, "-std=c++17", "-D__CUDA_NO_HALF_OPERATORS__",
           "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
           "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-I", str(CSRC), "-c", str(CSRC / source),
           "-o", str(tmp_path / (source + ".o"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr[-4000:]


def _cuda_include() -> Path | None:
    nvcc = _nvcc()
    if nvcc is None:
        return None
    homes = [Path(nvcc).resolve().parent.parent, Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")),
             Path("/usr/local/cuda")]
    for home in homes:
        if (home / "include" / "cuda_runtime_api.h").is_file():
            return home / "include"
    return None


@pytest.mark.skipif(shutil.which("g++") is None or _cuda_include() is None,
                    reason="needs g++ and the CUDA runtime headers")
@pytest.mark.parametrize("source", ["binding.cpp", "bind_common.cpp", "bind_store.cpp", "bind_mla.cpp",
                                    "bind_paged.cpp", "bad_binding.cpp"])
def test_binding_compiles_against_torch_headers(source, tmp_path):
    """The torch-facing half passes g++ -fsyntax-only with torch's headers. A CPU wheel lacks the
    generated c10/cuda/impl/cuda_cmake_macros.h (it only sets the shared-library macro), so a
    one-line stand-in is supplied when it is missing."""
    from torch.utils import cpp_extension

    includes = list(cpp_extension.include_paths())
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").is_file() for p in includes):
        shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.insert(0, str(tmp_path / "shim"))
    std = "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 10) else "-std=c++17"
    from oracle.kernels._jit import SHARED_CSRC

    cmd = ["g++", std, "-fsyntax-only", "-Wall", "-Wno-unused-parameter", "-I", str(CSRC), "-I", str(SHARED_CSRC),
           *[f"-I{p}" for p in includes], f"-I{_cuda_include()}", str(CSRC / source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    own = [line for line in proc.stderr.splitlines() if str(CSRC) in line and "warning" in line]
    assert not own, "\n".join(own)


# ================================================================ fake kernels

def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_kernels_accept_valid_and_refuse_invalid():
    k, cache, loc = _meta((4, 8, 128)), _meta((16, 8, 128)), _meta((4,), torch.int64)
    assert _fake.store_cache(k, k, cache, cache, loc) is None
    with pytest.raises(TypeError):
        _fake.store_cache(k, k, _meta((16, 8, 128), torch.float16), cache, loc)
    with pytest.raises(TypeError):
        _fake.store_cache(k, k, cache, cache, _meta((4,), torch.int16))
    with pytest.raises(ValueError):
        _fake.store_cache(_meta((4, 8, 127)), k, cache, cache, loc)
    buf, nope, rope = _meta((16, 576)), _meta((4, 512)), _meta((4, 64))
    assert _fake.set_mla_kv_buffer(buf, loc, nope, rope) is None
    with pytest.raises(TypeError):
        _fake.set_mla_kv_buffer(buf, loc, nope, _meta((4, 64), torch.float32))
    key, kc = _meta((4, 8, 128)), _meta((4, 16, 8, 128), torch.uint8)
    scale = _meta((1,), torch.float32)
    assert _fake.reshape_and_cache_flash(key, key, kc, kc, loc, "fp8", scale, scale) is None
    with pytest.raises(ValueError):
        _fake.reshape_and_cache_flash(key, key, _meta((4, 16, 1024), torch.uint8), kc, loc, "fp8", scale, scale)


# ================================================================ the sanitizer lane, host side

SAMPLE = """\
@@kv-oracle-sanitize start test_kernels.py::test_store_cache[cuda.store_cache][bf16-int64]
@@kv-oracle-sanitize end test_kernels.py::test_store_cache[cuda.store_cache][bf16-int64]
@@kv-oracle-sanitize start test_kernels.py::test_store_cache[cuda-bad.store_cache_u32slot][pad_negative-int32]
========= Invalid __global__ write of size 1 bytes
=========     at kvo_cuda_bad::store_cache_u32_slot_kernel(const unsigned char *, long)+0x2d0 in /x/bad.cu:26
=========     by thread (0,0,0) in block (3,0,0)
=========     Address 0x7fab00001000 is out of bounds
=========     and is 8796093018112 bytes after the nearest allocation at 0x7f0000000 of size 4096 bytes
=========
========= Invalid __global__ read of size 4 bytes
=========     at 0x60 in /old/file.cu:12:void k<int>(int *)
=========     by thread (1,0,0) in block (0,0,0)
=========     Address 0x10 is out of bounds
=========
@@kv-oracle-sanitize end test_kernels.py::test_store_cache[cuda-bad.store_cache_u32slot][pad_negative-int32]
========= ERROR SUMMARY: 2 errors
"""


def test_sanitizer_output_is_parsed_and_attributed():
    parsed = sanitize.parse_output(SAMPLE.splitlines())
    assert parsed["summary"] == 2 and len(parsed["tests"]) == 2
    first, second = parsed["errors"]
    assert first["kind"] == "invalid global write" and first["size"] == 1
    assert sanitize._short_function(first["function"]) == "kvo_cuda_bad::store_cache_u32_slot_kernel"
    assert first["file"] == "/x/bad.cu" and first["line"] == 26
    assert first["kernel"] == "cuda-bad.store_cache_u32slot" and "pad_negative" in first["test"]
    assert second["kind"] == "invalid global read" and second["function"] == "void k<int>(int *)"
    assert second["line"] == 12 and sanitize._short_function(second["function"]) == "k<int>"


def test_sanitizer_pytest_args_drop_xdist():
    args = sanitize.prepare_pytest_args(["-n", "4", "--dist", "load", "-n8", "--max-worker-restart=5", "-x"],
                                        "r.json")
    assert args[:1] == ["-x"] and "-n" not in args and "--dist" not in args
    assert args[args.index("-p") + 1] == "no:xdist"
    assert "oracle.lanes._sanitize_markers" in args and args[-2:] == ["--oracle-report", "r.json"]
    default = sanitize.default_pytest_args()
    assert default[default.index("--oracle-backend") + 1] == "cuda,triton"
    assert default[default.index("--oracle-profile") + 1] == "quick" and "--pyargs" in default


def test_sanitize_without_the_tool_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda: None)
    result = sanitize.sanitize(None, tmp_path, echo=False)
    assert result["unavailable"] and not result["ok"] and "compute-sanitizer not found" in result["error"]
    assert (tmp_path / "summary.json").is_file()
    assert sanitize.main(["--out", str(tmp_path / "cli")]) == 2


def test_bad_plugin_registers_only_on_request():
    from oracle.lanes import bad_kernels as bad

    registry = _registry(bad.register)
    (kernel,) = registry.kernels.values()
    assert kernel.name == bad.NAME and kernel.contract.backend == "cuda-bad"
    assert kernel.contract.padding == "negative" and not kernel.contract.validates
    if not torch.cuda.is_available():
        assert kernel.unavailable()
    assert "bad" not in " ".join(ep.value for ep in _entry_points())


def _entry_points():
    from importlib.metadata import entry_points

    return entry_points(group="oracle.kernels")


# ================================================================ the graph-replay lane, host side

def test_graph_lane_calls_the_cuda_kernels_as_their_registrations_do(monkeypatch):
    """``oracle.lanes.graphs --backend cuda``: each --variant passes the keywords the matching
    registration binds, every scenario of an op the backend has calls ``oracle.kernels.cuda.<op>``,
    and the fp8 reference uses the preset the contract declares."""
    import functools

    from oracle.lanes import graph_scenarios as gs
    from oracle.lanes import graphs

    registry = _registry(cuda_kernels.register)
    for variant, suffix in (("default", ""), ("unchecked", ".unchecked")):
        fn = registry.kernels[f"cuda.store_cache{suffix}"].fn
        assert gs.CUDA.variants[variant] == (fn.keywords if isinstance(fn, functools.partial) else {}), variant
    assert gs.CUDA.variants["plain"] == {"pdl": False}
    assert gs.CUDA.preset == registry.kernels["cuda.reshape_and_cache_flash"].contract.fp8_preset
    calls = []
    for op in ("store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash"):
        monkeypatch.setattr(cuda_kernels, op, lambda *a, _op=op, **k: calls.append((_op, k)))
    presets = []
    monkeypatch.setattr(gs.reference, "reshape_and_cache_flash",
                        lambda *a, **k: presets.append(k.get("preset")) or (a[0], a[1]))
    rng, built = np.random.default_rng(0), []
    for name, (build, params, fp8) in gs.SCENARIOS.items():
        op = name.split("/")[0]
        if not hasattr(cuda_kernels, op):
            continue
        setup = build(torch.device("cpu"), rng, **params, backend=gs.CUDA, call_kw={"pdl": False})
        setup.call()
        built.append(op)
        if op == "reshape_and_cache_flash" and fp8:
            setup.expected(graphs.snapshot(setup))
    assert built and [op for op, _ in calls] == built and all(k == {"pdl": False} for _, k in calls)
    assert presets and set(presets) == {"cuda_satfinite"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_graph_lane_for_cuda_refuses_loudly_without_a_gpu(tmp_path):
    for extra, why in (([], "no CUDA device"), (["--cpu-dry-run"], "the cuda kernels have none")):
        proc = subprocess.run([sys.executable, "-m", "oracle.lanes.graphs", "--backend", "cuda", "--out",
                               str(tmp_path), *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
        assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "not run"


# ================================================================ on a Hopper GPU

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
             "copy_prefetch", "fp8_prefetch", "check_early", "check_fold", "mla_check_in_grid",
             "lean_unchecked", "lean_verdict")
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
                        "mla_check_in_grid": (i // 3) % 2, "lean_unchecked": (i // 5) % 4,
                        "lean_verdict": (i // 7) % 4, "check_fold": (i // 11) % 4}
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
    barrier."""
    import functools

    from pdl_chain import check_chained_writes

    tune = _ops().tune
    default = tune("check_early", 0)
    try:
        for validate, early, n in ((True, 0, 32768), (True, 1, 32768), (True, 0, 4096), (False, 0, 32768)):
            tune("check_early", early)
            check_chained_writes(functools.partial(cuda_kernels.set_mla_kv_buffer, pdl=True, validate=validate),
                                 functools.partial(cuda_kernels.store_cache, pdl=True, validate=validate), n=n)
    finally:
        tune("check_early", default)


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
    not: check_fold; one buffer per stream reused by every call) the writer reads after its wait: three
    calls back to back, legal, illegal in several places, legal, with no synchronization between
    them (the third may raise the second's error at its start, as the contract allows; it is then
    issued again). The legal calls write their rows, the illegal one writes nothing, its error
    names its first illegal entry, and a fourth call (the illegal entry first) reads its own
    verdict."""
    default = _ops().tune("check_fold", 3 if fold else 0)
    try:
        _device_slot_check_call_after_call(n, pdl)
    finally:
        _ops().tune("check_fold", default)


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
