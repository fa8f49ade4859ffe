"""Build (once per machine and torch version) and load the Hopper CUDA kernels.

``csrc/`` holds a torch-facing binding (``binding.cpp``, the only file that includes torch) and
CUDA translation units that depend on the CUDA runtime and plain C++ only (``*.cu``, interface in
``kv_cuda.h``). :func:`load` compiles them with ``torch.utils.cpp_extension.load`` (ninja, nvcc
``-gencode=arch=compute_90,code=sm_90`` plus compute_90 PTX, ``-lineinfo`` so compute-sanitizer
names source lines) into ``$XDG_CACHE_HOME/kv-oracle/cuda-<torch version>-<hash>`` (``~/.cache``
without XDG_CACHE_HOME; ``KV_ORACLE_CUDA_BUILD_DIR`` overrides the whole path). The hash covers
the sources, the flags, torch's version and CUDA version, nvcc's version, Python's version and
the machine, so anything that changes the library builds a new one next to the old, and an
unchanged one is never rebuilt. Concurrent processes (xdist workers) serialize on an ``fcntl``
lock; a ``READY`` file written last marks a finished build, which later processes load directly.

Nothing here raises: :func:`probe` says, without building, why the kernels cannot run here (a
CPU-only torch, no GPU, a GPU older than Hopper, no nvcc, no ninja), and :func:`load` returns None
once the ops are loaded, else the reason they are not.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
BUILD_DIR_ENV = "KV_ORACLE_CUDA_BUILD_DIR"
VERBOSE_ENV = "KV_ORACLE_CUDA_VERBOSE"
READY = "READY"
MIN_CAPABILITY = (9, 0)
# sm_90 machine code (cp.async.bulk and cvt ... e4m3x2 are plain sm_90 instructions, nothing needs
# sm_90a) plus compute_90 PTX so a newer GPU can JIT it. Naming the targets keeps
# torch.utils.cpp_extension from adding its own -gencode flags. No --use_fast_math: the fp8 path
# divides with IEEE rounding (it calls __fdiv_rn explicitly anyway).
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


@dataclass(frozen=True)
class Extension:
    """One library: its namespace (``torch.ops.<namespace>``), sources and headers in csrc/."""

    namespace: str
    sources: tuple
    headers: tuple
    state: dict = field(default_factory=dict, compare=False, hash=False)
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, hash=False)


MAIN = Extension("kv_oracle_cuda", ("binding.cpp", "copy.cu", "fp8.cu", "mla.cu"), ("kv_cuda.h", "common.cuh"))
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
    h = hashlib.sha256()
    for name in ext.sources + ext.headers:
        path = CSRC / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    for part in (NVCC_FLAGS, CXX_FLAGS, tuple(libstdcxx_ldflags()), torch.__version__, torch.version.cuda,
                 nvcc_version(), os.environ.get("CXX", "c++"), sys.version, platform.machine(), platform.system()):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:16]


def build_dir(ext: Extension = MAIN) -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override) / ext.namespace if ext is not MAIN else Path(override)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    torch_version = torch.__version__.replace("+", "_")
    prefix = "cuda" if ext is MAIN else "cuda-bad"
    return Path(root) / "kv-oracle" / f"{prefix}-{torch_version}-{source_hash(ext)}"


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
    Returns None on success, else the reason (cached: a failure is not retried)."""
    with ext.lock:
        if "result" not in ext.state:
            ext.state["result"] = _load_once(ext)
        return ext.state["result"]


def _load_once(ext: Extension) -> str | None:
    missing = [name for name in ext.sources + ext.headers if not (CSRC / name).is_file()]
    if missing:
        return f"the CUDA sources are not installed ({', '.join(missing)} missing in {CSRC})"
    reason = probe()
    if reason:
        return reason
    directory = build_dir(ext)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"kv-oracle-{os.getuid()}" / directory.name
        try:
            fallback.mkdir(parents=True, exist_ok=True)
        except OSError:
            return f"cannot create the build directory {directory}: {exc}"
        directory = fallback
    ext.state["build_dir"] = str(directory)
    library = library_path(ext, directory)
    if (directory / READY).is_file() and library.is_file():
        return _load_library(ext, library, built=False)
    import fcntl

    with open(directory / ".kv-oracle.lock", "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes or the process dies
        try:
            if (directory / READY).is_file() and library.is_file():  # another process built it
                return _load_library(ext, library, built=False)
            reason = _build(ext, directory)
            if reason:
                return reason
            (directory / (READY + ".tmp")).write_text(library.name + "\n")
            os.replace(directory / (READY + ".tmp"), directory / READY)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return None


def _build(ext: Extension, directory: Path) -> str | None:
    from torch.utils import cpp_extension

    stale = directory / "lock"
    if stale.exists():  # torch's own lock, left by a killed build; we hold the fcntl lock
        stale.unlink()
    start = time.perf_counter()
    try:
        cpp_extension.load(
            name=library_name(ext), sources=[str(CSRC / s) for s in ext.sources],
            extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=list(NVCC_FLAGS), extra_ldflags=libstdcxx_ldflags(),
            extra_include_paths=[str(CSRC)], build_directory=str(directory),
            is_python_module=False, with_cuda=True, verbose=bool(os.environ.get(VERBOSE_ENV)))
    except Exception as exc:  # a compiler error, a missing header, a link failure
        text = str(exc).strip()
        if len(text) > 4000:
            text = text[:1500] + "\n...\n" + text[-2500:]
        ext.state["build_seconds"] = round(time.perf_counter() - start, 1)
        return f"building the CUDA kernels in {directory} failed: {type(exc).__name__}: {text}"
    ext.state.update(built=True, build_seconds=round(time.perf_counter() - start, 1),
                     loaded=str(library_path(ext, directory)))  # load() also loaded it
    ext.state["static_libstdcxx"] = carries_libstdcxx(library_path(ext, directory))
    return None


def _load_library(ext: Extension, library: Path, *, built: bool) -> str | None:
    if "loaded" in ext.state:
        return None
    try:
        torch.ops.load_library(str(library))
    except Exception as exc:
        return f"loading {library} failed: {type(exc).__name__}: {exc}"
    ext.state["loaded"] = str(library)
    ext.state.setdefault("built", built)
    return None
