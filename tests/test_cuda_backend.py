"""The CUDA backend's host side (oracle.kernels.cuda), run everywhere: registration and
availability reasons, the build cache key, the build and cached-load path (with a stand-in for
cpp_extension.load), that every .cu translation unit compiles for sm_90 with nvcc and the torch
binding passes ``g++ -fsyntax-only`` (skipped without nvcc / g++), the fake kernels, the
sanitizer lane's output parser (oracle.lanes.sanitize), and the graph-replay lane's CUDA backend
(oracle.lanes.graphs --backend cuda: the calls and the reference it builds, its refusal here).
The kernels themselves: tests/test_cuda_kernels.py.
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
    flags of the real build (plus those torch.utils.cpp_extension adds), its targets and ptxas
    included, but unoptimized: the optimizers take most of a minute a file and check nothing more."""
    flags = [f for f in _build.NVCC_FLAGS if f != "-O3"] + ["-O0", "-Xcicc", "-O0", "-Xptxas", "-O0"]
    cmd = [_nvcc(), *flags, "-std=c++17", "-D__CUDA_NO_HALF_OPERATORS__",
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
