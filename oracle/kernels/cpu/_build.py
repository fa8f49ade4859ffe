"""Build (once per machine) and load the C++ kernels.

The sources in ``csrc/`` are compiled with ``torch.utils.cpp_extension.load`` (ninja) into
``$XDG_CACHE_HOME/kv-oracle/cpu-<torch version>-<hash>`` (``~/.cache`` without XDG_CACHE_HOME;
``KV_ORACLE_CPU_BUILD_DIR`` overrides the whole path). The hash covers the sources, the compiler
flags, the compiler named by ``CXX``, torch's and Python's versions and the machine, so a change to
any of them builds a new library next to the old one, and an unchanged one is never rebuilt.

Concurrent processes serialize on a lock in the build directory and a ``READY`` file marks a
finished build, which later processes load without running ninja (see :mod:`oracle.kernels._jit`).

Nothing here raises: :func:`load` returns None when the ops are loaded, else the reason they are
not, which the kernels' ``available()`` reports.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

import torch

from .. import _jit

NAMESPACE = "kv_oracle_cpu"
CSRC = Path(__file__).resolve().parent / "csrc"
# kv_cpu.cpp registers the ops; common.cpp holds what they share (kv_cpu.h), the others one op family each
SOURCES = ("kv_cpu.cpp", "common.cpp", "flat.cpp", "paged.cpp", "quantize.cpp", "block.cpp")
HEADERS = ("kv_cpu.h", "fp8.h", "block_scaled.h")
# No -march: one build runs on any x86-64; fp8.h picks AVX-512 / AVX2 / scalar at run time.
# -fopenmp: at::parallel_for is inline OpenMP code (torch's CPU build uses the OpenMP backend),
# without it every loop would run on one thread. No -ffast-math: the fp8 path needs IEEE division.
CFLAGS = ("-O3", "-fopenmp", "-Wall", "-Wno-maybe-uninitialized", "-Wno-unused-function")
LDFLAGS = ("-fopenmp",)
BUILD_DIR_ENV = "KV_ORACLE_CPU_BUILD_DIR"
VERBOSE_ENV = "KV_ORACLE_CPU_VERBOSE"
READY = _jit.READY

EXTENSION = _jit.Extension(NAMESPACE, SOURCES, HEADERS)


def source_hash() -> str:
    """sha256 over everything that determines the built library."""
    return _jit.digest(CSRC, SOURCES + HEADERS, (
        CFLAGS, LDFLAGS,
        (os.environ.get("CXX", "c++"), torch.__version__, sys.version, platform.machine(), platform.system())))


def build_dir() -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    return Path(override) if override else _jit.cache_dir("cpu", source_hash())


def library_name() -> str:
    return f"{NAMESPACE}_{source_hash()}"


def library_path(directory: Path | None = None) -> Path:
    return (directory or build_dir()) / f"{library_name()}.so"


def status() -> dict:
    """What happened in this process: the build directory, whether it built (and how long it
    took) or loaded a cached library, or why it failed."""
    return dict(EXTENSION.state)


def load() -> str | None:
    """Load the ops into this process (building them first if no cached build exists).
    Returns None on success, else the reason (cached: a failure is not retried)."""
    return _jit.load(EXTENSION, csrc=CSRC, what="C++", check=_linux_only, directory=build_dir,
                     library=library_path, build=_build)


def _linux_only() -> str | None:
    if platform.system() != "Linux":
        return f"the CPU kernels are built on Linux only (this is {platform.system()})"
    return None


def _build(directory: Path) -> str | None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH (set CXX or install g++)"
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja); torch.utils.cpp_extension needs it to build"
    return _jit.compile_library(EXTENSION, directory, name=library_name(), csrc=CSRC, what="C++", clip=(1000, 2000),
                                extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                                verbose=bool(os.environ.get(VERBOSE_ENV)))
