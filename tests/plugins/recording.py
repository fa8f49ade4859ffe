"""A plug-in of two correct store_cache kernels that record when each call starts and ends (and
in which process) into the file ``KV_ORACLE_RECORD`` names, holding each call for a second, for
the memory-budget test: two large cases under a budget for one must never overlap."""

import json
import os
import time

import oracle
from oracle.kernels.torch_native import store_cache

HOLD_S = 1.0  # long enough that two cases run side by side would overlap for certain


def _recording(name):
    def kernel(k, v, k_cache, v_cache, loc):
        start = time.time()
        time.sleep(HOLD_S)
        store_cache(k, v, k_cache, v_cache, loc)
        with open(os.environ["KV_ORACLE_RECORD"], "a") as out:
            out.write(json.dumps({"kernel": name, "n": int(loc.shape[0]), "pid": os.getpid(),
                                  "start": start, "end": time.time()}) + "\n")
    return kernel


def register():
    for name in ("recording.first.store_cache", "recording.second.store_cache"):
        oracle.register(_recording(name), op="store_cache", name=name, backend="recording",
                        dtypes=("bfloat16", "uint8"), validates=True)
