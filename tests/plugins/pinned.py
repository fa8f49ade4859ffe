"""A plug-in of one correct store_cache that records, into the file ``KV_ORACLE_RECORD`` names,
which xdist worker ran each call, which GPUs that worker's process was allowed to see
(``CUDA_VISIBLE_DEVICES``) and how many CPU threads torch ran with, and that kills its process
once (the first call with N == 7, a segfault): the device-pinning test checks the round-robin
assignment, that the worker xdist starts in place of the dead one is pinned to the same device,
and that the workers share out the cores."""

import ctypes
import json
import os

import torch

import oracle
from oracle.kernels.torch_native import store_cache


def records_its_device(k, v, k_cache, v_cache, loc):
    record = os.environ["KV_ORACLE_RECORD"]
    with open(record, "a") as out:
        out.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "pid": os.getpid(),
                              "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "n": int(loc.shape[0]),
                              "threads": torch.get_num_threads()}) + "\n")
    if loc.shape[0] == 7 and not os.path.exists(record + ".crashed"):
        open(record + ".crashed", "w").close()
        ctypes.string_at(0)  # SIGSEGV
    store_cache(k, v, k_cache, v_cache, loc)


def register():
    oracle.register(records_its_device, op="store_cache", name="pinned.store_cache", backend="pinned",
                    dtypes=("bfloat16",), validates=True)
