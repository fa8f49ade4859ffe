"""A plug-in of store_cache kernels that never return on one case (N == 7) and copy correctly on
every other, for the time-limit tests: each must end as TIMEOUT, and the run must go on.

- ``hanging.sleeps``: sleeps forever in Python (the GIL is released while it sleeps);
- ``hanging.spins``: a busy loop in C called through ``ctypes.PyDLL``, so the GIL stays held;
- ``hanging.waits``: a CUDA-like wait in C, spinning on a completion flag in shared memory that
  never flips, the GIL held too.

The C kernels come from ``hang.c``, built by the test into the shared library that the environment
variable ``KV_ORACLE_HANG_LIB`` names (only those two kernels need it).
"""

import ctypes
import mmap
import os
import time

import oracle
from oracle.kernels.torch_native import store_cache

LIBRARY_VARIABLE = "KV_ORACLE_HANG_LIB"


def _library() -> ctypes.PyDLL:
    path = os.environ.get(LIBRARY_VARIABLE)
    if not path:
        raise RuntimeError(f"{LIBRARY_VARIABLE} is unset: build tests/plugins/hang.c and name the library there")
    return ctypes.PyDLL(path)  # PyDLL: calls keep the GIL, as a C extension that never releases it


def sleeps(k, v, k_cache, v_cache, loc):
    while loc.shape[0] == 7:
        time.sleep(3600)
    store_cache(k, v, k_cache, v_cache, loc)


def spins(k, v, k_cache, v_cache, loc):
    if loc.shape[0] == 7:
        _library().spin_forever()
    store_cache(k, v, k_cache, v_cache, loc)


def waits(k, v, k_cache, v_cache, loc):
    if loc.shape[0] == 7:
        flag = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous and shared, as host-mapped device memory is
        _library().wait_for_flag(ctypes.byref(ctypes.c_int.from_buffer(flag)))
    store_cache(k, v, k_cache, v_cache, loc)


def register():
    for fn in (sleeps, spins, waits):
        oracle.register(fn, op="store_cache", name=f"hanging.{fn.__name__}.store_cache",
                        backend="hanging", dtypes=("bfloat16",), validates=True)
