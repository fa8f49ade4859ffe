"""Build (once per machine and torch version) and load the Hopper CUDA kernels.

``csrc/`` holds a torch-facing binding (``binding.cpp`` registers the ops, ``bind_*.cpp`` define
them, ``bind.h`` is what they share; the only files that include torch) and
CUDA translation units that depend on the CUDA runtime and plain C++ only (``*.cu``, interface in
``kv_cuda.h``). :func:`load` compiles them with ``torch.utils.cpp_extension.load`` (ninja, nvcc
``-gencode=arch=compute_90,code=sm_90`` plus compute_90 PTX, ``-lineinfo`` so compute-sanitizer
names source lines) into ``$XDG_CACHE_HOME/kv-oracle/cuda-<torch version>-<hash>`` (``~/.cache``
without XDG_CACHE_HOME; ``KV_ORACLE_CUDA_BUILD_DIR`` overrides the whole path). The hash covers
the sources, the flags, torch's version and CUDA version, nvcc's version, Python's version and
the machine, so anything that changes the library builds a new one next to the old, and an
unchanged one is never rebuilt. Concurrent processes (xdist workers) serialize on an ``fcntl``
lock; a ``READY`` file written last marks a finished build, which later processes load directly
(the cache, lock and loading are shared with the CPU kernels: :mod:`oracle.kernels._jit`).

Nothing here raises: :func:`probe` says, without building, why the kernels cannot run here (a
CPU-only torch, no GPU, a GPU older than Hopper, no nvcc, no ninja), and :func:`load` returns None
once the ops are loaded, else the reason they are not.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .. import _jit
from .._jit import Extension

CSRC = Path(__file__).resolve().parent / "csrc"
BUILD_DIR_ENV = "KV_ORACLE_CUDA_BUILD_DIR"
VERBOSE_ENV = "KV_ORACLE_CUDA_VERBOSE"
READY = _jit.READY
MIN_CAPABILITY = (9, 0)
# sm_90 machine code (cp.async.bulk and cvt ... e4m3x2 are plain sm_90 instructions, nothing needs
# sm_90a) plus compute_90 PTX so a newer GPU can JIT it. Naming the targets keeps
# torch.utils.cpp_extension from adding its own -gencode flags. No --use_fast_math: the fp8 path's
# division (fp8.cu, Fp8Divisor) relies on IEEE multiplies and FMAs that keep subnormals.
NVCC_FLAGS = ("-O3", "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90",
              "-lineinfo")
CXX_FLAGS = ("-O3",)
# A C++ symbol every dynamically linked libstdc++ defines and a statically linked copy would carry
# into the library (std::ostream::_M_insert<long>): see libstdcxx_ldflags().
_LIBSTDCXX_PROBE = "_ZNSo9_M_insertIlEERSoT_"


def _loaded_libstdcxx() -> str | None:
    """The libstdc++ shared object this process runs with (torch loaded it), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "/libstdc++.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def libstdcxx_ldflags() -> list[str]:
    """Link the library against the very libstdc++.so this process has loaded, named first.

    On the H100 image (g++ 13, torch 2.11's cpp_extension) the library built without this carried
    its own copy of libstdc++'s iostream and locale code next to the process's shared one (the
    crash ran ``std::ostream::_M_insert<long>`` inside the library; which archive the link took it
    from was not pinned down). The first ``std::ostringstream << int`` (a plan string, any
    TORCH_CHECK message with a number) then mixed the two copies' locale state and segfaulted. An
    explicit shared libstdc++ ahead of the driver's own ``-lstdc++`` resolves every C++ runtime
    symbol dynamically, so no archive member is pulled in; ``status()["static_libstdcxx"]`` (from
    :func:`carries_libstdcxx`) records whether a built library still carries a copy."""
    path = _loaded_libstdcxx()
    return [path] if path else []


def carries_libstdcxx(library: Path) -> bool | None:
    """Whether ``library`` defines libstdc++'s own symbols (a static copy linked in), or None when
    ``nm`` cannot tell."""
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return _LIBSTDCXX_PROBE in out.stdout


MAIN = Extension("kv_oracle_cuda", ("binding.cpp", "bind_common.cpp", "bind_store.cpp", "bind_mla.cpp",
                                    "bind_paged.cpp", "check.cu", "copy.cu", "fp8.cu", "mla.cu",
                                    "mla_checked.cu"),
                 ("bind.h", "kv_cuda.h", "common.cuh", "slot_check.cuh", "paged_rows.cuh"))
BAD = Extension("kv_oracle_cuda_bad", ("bad.cu", "bad_binding.cpp"), ())


def nvcc_path() -> str | None:
    """The nvcc torch.utils.cpp_extension would use (CUDA_HOME/bin/nvcc), or one on PATH."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - a broken torch install
        CUDA_HOME = None
    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("nvcc")


_NVCC_VERSION: dict = {}


def nvcc_version(nvcc: str | None = None) -> str:
    """``nvcc --version``'s last line ("Build cuda_13.0.r13.0/compiler..."), or "" without nvcc."""
    nvcc = nvcc or nvcc_path()
    if not nvcc:
        return ""
    if nvcc not in _NVCC_VERSION:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            _NVCC_VERSION[nvcc] = out.strip().splitlines()[-1] if out.strip() else ""
        except (OSError, subprocess.SubprocessError):
            _NVCC_VERSION[nvcc] = ""
    return _NVCC_VERSION[nvcc]


def probe() -> str | None:
    """Why the CUDA kernels cannot run in this process (every reason, joined), or None. Never
    builds, never raises; initializes CUDA only when torch has it."""
    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
                       "the kernels need a CUDA build of torch")
    else:
        try:
            if not torch.cuda.is_available():
                reasons.append("no CUDA device is visible (torch.cuda.is_available() is False)")
            else:
                capability = torch.cuda.get_device_capability()
                if tuple(capability) < MIN_CAPABILITY:
                    name = torch.cuda.get_device_name()
                    reasons.append(f"{name} has compute capability {capability[0]}.{capability[1]}; the "
                                   "kernels are built for Hopper (sm_90: cp.async.bulk, fp8 cvt) and "
                                   "need 9.0 or newer")
        except Exception as exc:  # a broken driver: report it, do not crash the registration
            reasons.append(f"querying the CUDA device failed: {type(exc).__name__}: {exc}")
    if nvcc_path() is None:
        reasons.append("nvcc was not found (set CUDA_HOME or put nvcc on PATH); the kernels are "
                       "compiled on first use")
    try:
        from torch.utils import cpp_extension

        cpp_extension.verify_ninja_availability()
    except Exception:
        reasons.append("ninja is not installed (pip install ninja); torch.utils.cpp_extension needs it")
    if platform.system() != "Linux":
        reasons.append(f"the kernels are built on Linux only (this is {platform.system()})")
    return "; ".join(reasons) or None


def source_hash(ext: Extension = MAIN) -> str:
    """sha256 over everything that determines the built library."""
    return _jit.digest(CSRC, ext.sources + ext.headers, (
        NVCC_FLAGS, CXX_FLAGS, tuple(libstdcxx_ldflags()), torch.__version__, torch.version.cuda, nvcc_version(),
        os.environ.get("CXX", "c++"), sys.version, platform.machine(), platform.system()))


def build_dir(ext: Extension = MAIN) -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override) / ext.namespace if ext is not MAIN else Path(override)
    return _jit.cache_dir("cuda" if ext is MAIN else "cuda-bad", source_hash(ext))


def library_name(ext: Extension = MAIN) -> str:
    return f"{ext.namespace}_{source_hash(ext)}"


def library_path(ext: Extension = MAIN, directory: Path | None = None) -> Path:
    return (directory or build_dir(ext)) / f"{library_name(ext)}.so"


def status(ext: Extension = MAIN) -> dict:
    """What happened in this process: the build directory, whether it built (and how long it
    took) or loaded a cached library, or why it failed."""
    return dict(ext.state)


def load(ext: Extension = MAIN) -> str | None:
    """Load ``ext``'s ops into this process, building them first if no cached build exists.
    Returns None on success, else the reason (cached: a failure is not retried). Builds only when
    :func:`probe` finds nothing missing."""
    return _jit.load(ext, csrc=CSRC, what="CUDA", check=probe, directory=lambda: build_dir(ext),
                     library=lambda directory: library_path(ext, directory),
                     build=lambda directory: _build(ext, directory))


def _build(ext: Extension, directory: Path) -> str | None:
    reason = _jit.compile_library(
        ext, directory, name=library_name(ext), csrc=CSRC, what="CUDA", clip=(1500, 2500),
        extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=list(NVCC_FLAGS), extra_ldflags=libstdcxx_ldflags(),
        with_cuda=True, verbose=bool(os.environ.get(VERBOSE_ENV)))
    if reason is None:
        ext.state["static_libstdcxx"] = carries_libstdcxx(library_path(ext, directory))
    return reason
