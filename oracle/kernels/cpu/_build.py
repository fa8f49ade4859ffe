"""Build (once per machine) and load the C++ kernels.

The sources in ``csrc/`` are compiled with ``torch.utils.cpp_extension.load`` (ninja) into
``$XDG_CACHE_HOME/kv-oracle/cpu-<torch version>-<hash>`` (``~/.cache`` without XDG_CACHE_HOME;
``KV_ORACLE_CPU_BUILD_DIR`` overrides the whole path). The hash covers the sources, the compiler
flags, the compiler named by ``CXX``, torch's and Python's versions and the machine, so a change to
any of them builds a new library next to the old one, and an unchanged one is never rebuilt.

Concurrent processes (pytest-xdist workers) serialize on an ``fcntl`` lock in the build directory:
the first builds, the others wait and then load the same library. A finished build is marked by a
``READY`` file written last, so a later process loads the library directly, without running ninja
(or needing it). torch's own ``lock`` file, which a killed build would leave behind and on which
every later build would wait forever, is removed while the fcntl lock is held (only a lock holder
ever builds, so such a file is always stale there).

Nothing here raises: :func:`load` returns None when the ops are loaded, else the reason they are
not, which the kernels' ``available()`` reports.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import torch

NAMESPACE = "kv_oracle_cpu"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("kv_cpu.cpp",)
HEADERS = ("fp8.h",)
# No -march: one build runs on any x86-64; fp8.h picks AVX-512 / AVX2 / scalar at run time.
# -fopenmp: at::parallel_for is inline OpenMP code (torch's CPU build uses the OpenMP backend),
# without it every loop would run on one thread. No -ffast-math: the fp8 path needs IEEE division.
CFLAGS = ("-O3", "-fopenmp", "-Wall", "-Wno-maybe-uninitialized", "-Wno-unused-function")
LDFLAGS = ("-fopenmp",)
BUILD_DIR_ENV = "KV_ORACLE_CPU_BUILD_DIR"
READY = "READY"

_lock = threading.Lock()
_state: dict = {}


def source_hash() -> str:
    """sha256 over everything that determines the built library."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    for part in (CFLAGS, LDFLAGS, (os.environ.get("CXX", "c++"), torch.__version__, sys.version,
                                    platform.machine(), platform.system())):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:16]


def build_dir() -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    torch_version = torch.__version__.replace("+", "_")
    return Path(root) / "kv-oracle" / f"cpu-{torch_version}-{source_hash()}"


def library_name() -> str:
    return f"{NAMESPACE}_{source_hash()}"


def library_path(directory: Path | None = None) -> Path:
    return (directory or build_dir()) / f"{library_name()}.so"


def status() -> dict:
    """What happened in this process: directory, whether it built or loaded a cached library."""
    return dict(_state)


def load() -> str | None:
    """Load the ops into this process (building them first if no cached build exists).
    Returns None on success, else the reason (cached: a failure is not retried)."""
    with _lock:
        if "result" not in _state:
            _state["result"] = _load_once()
        return _state["result"]


def _load_once() -> str | None:
    missing = [name for name in SOURCES + HEADERS if not (CSRC / name).is_file()]
    if missing:
        return f"the C++ sources are not installed ({', '.join(missing)} missing in {CSRC})"
    if platform.system() != "Linux":
        return f"the CPU kernels are built on Linux only (this is {platform.system()})"
    directory = build_dir()
    _state["build_dir"] = str(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"kv-oracle-{os.getuid()}" / directory.name
        try:
            fallback.mkdir(parents=True, exist_ok=True)
        except OSError:
            return f"cannot create the build directory {directory}: {exc}"
        directory = fallback
        _state["build_dir"] = str(directory)
    library = library_path(directory)
    if (directory / READY).is_file() and library.is_file():
        return _load_library(library, built=False)
    import fcntl

    with open(directory / ".kv-oracle.lock", "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes or the process dies
        try:
            if (directory / READY).is_file() and library.is_file():  # another process built it
                return _load_library(library, built=False)
            reason = _build(directory)
            if reason:
                return reason
            (directory / (READY + ".tmp")).write_text(library.name + "\n")
            os.replace(directory / (READY + ".tmp"), directory / READY)
            _state["built"] = True
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return _load_library(library, built=True)


def _build(directory: Path) -> str | None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH (set CXX or install g++)"
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja); torch.utils.cpp_extension needs it to build"
    stale = directory / "lock"
    if stale.exists():  # left by a killed build; we hold the directory's fcntl lock
        stale.unlink()
    # Only the .so must be fresh: ninja decides from timestamps; the hash in the name covers the rest.
    try:
        cpp_extension.load(
            name=library_name(), sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
            extra_include_paths=[str(CSRC)], build_directory=str(directory),
            is_python_module=False, verbose=bool(os.environ.get("KV_ORACLE_CPU_VERBOSE")))
    except Exception as exc:  # a compiler error, a missing header, a link failure
        text = str(exc).strip()
        if len(text) > 3000:
            text = text[:1000] + "\n...\n" + text[-2000:]
        return f"building the C++ kernels in {directory} failed: {type(exc).__name__}: {text}"
    # load() also loaded the library into this process.
    _state["loaded"] = str(library_path(directory))
    return None


def _load_library(library: Path, *, built: bool) -> str | None:
    if "loaded" in _state:
        return None
    try:
        torch.ops.load_library(str(library))
    except Exception as exc:
        return f"loading {library} failed: {type(exc).__name__}: {exc}"
    _state["loaded"] = str(library)
    _state.setdefault("built", built)
    return None
