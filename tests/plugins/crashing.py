"""A plug-in whose store_cache kernel kills its process on one case (N == 7), the way a kernel
with a wild pointer segfaults: `oracle run` must report that case as crashed and go on."""

import ctypes
import os

import oracle
from oracle.kernels.torch_native import store_cache


def segfaults_on_seven_rows(k, v, k_cache, v_cache, loc):
    if loc.shape[0] == 7:
        os.environ.setdefault("KV_ORACLE_CRASHED", "1")
        ctypes.string_at(0)  # SIGSEGV
    store_cache(k, v, k_cache, v_cache, loc)


def register():
    oracle.register(segfaults_on_seven_rows, op="store_cache", name="crashing.store_cache",
                    backend="crashing", dtypes=("bfloat16",), validates=True)
