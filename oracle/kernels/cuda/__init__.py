"""The ``cuda`` backend: Hopper (sm_90) KV-cache writers in CUDA C++ (``csrc/``), registered as
torch custom ops ``torch.ops.kv_oracle_cuda.*`` and, through :func:`register`, as oracle kernels.

- ``set_mla_kv_buffer``: sglang's SM90 MLA writer, two paths. Direct: a warp per row,
  global-to-global vector copies, taken wherever every pointer and stride allows 16-byte vectors
  (2-3% faster on the H100). TMA: each warp stages a whole row (nope then rope) in shared memory
  and one lane stores it with a bulk copy (``cp.async.bulk.global.shared::cta`` after
  ``fence.proxy.async.shared::cta``; ``bulk_group`` commit, ``wait_group.read`` before a buffer
  is reused), taken where only the sources are less aligned and the bulk copy can take the row
  (``path="tma"`` forces it).
- Every writer is launched with programmatic dependent launch by default (``pdl=True``; ``pdl=False``
  launches plainly): its launch overlaps the kernel before it, and every warp first asks the L2 for
  its first rows (``prefetch.global.L2``, a hint) before ``griddepcontrol.wait``.
- A validating call checks its slots on the device: each block scans a short index itself (one
  launch); the MLA direct path checks one of up to ``ops().mla_checked_rows(row_bytes)`` entries
  in its own grid, which loads its rows, scans the index and meets at a grid barrier before its
  first store (one launch); a longer one is checked by a small check grid first, which lets the
  writer launch at once, so the writer asks the L2 for its sources while the kernels before the
  check still run and reads the verdict after its PDL wait (the ``check_early`` tuning knob 0 lets
  it launch only once those kernels have completed, loading its first row before its wait).
- ``store_cache``: sglang's flat K/V scatter, one warp per row, 16-byte vector copies where every
  pointer and stride allows (else the widest width that does).
- ``reshape_and_cache_flash``: vLLM's paged K/V write on any cache view (NHD, HND, padded blocks):
  a bitwise copy for ``"auto"``, else fp8 e4m3fn / e5m2 codes of ``x / scale`` (IEEE float32
  division, per-tensor or per-head scale) by ``cvt.rn.satfinite``; negative slots skipped. A
  validating fp8 call also checks every element of both scales on the device (finite and > 0),
  after the slots and before any store: a bad scale writes nothing and is reported like a slot.

A validating call on a long index that the writer's grid does not check itself reuses the verdict
of an earlier call's check while torch sees that index tensor unchanged (its version counter:
:mod:`oracle.kernels.check_reuse`), as every layer of a step passes one index.

Slots are checked on the device (``validate``, default True): a call with an illegal slot writes
nothing, returns without synchronizing, and its error is raised by the next validating call on
that device, by ``oracle.kernels.raise_deferred_errors()``, or at once with ``validate="sync"`` or
``KV_ORACLE_SYNC_ERRORS=1`` (:mod:`oracle.kernels._deferred`). ``validate=False`` skips the check
(registered as ``<name>.unchecked``). Each writer takes an ``oracle.kernels.CheckedIndex`` in place of
its index (checked once for many writes, :mod:`oracle.kernels.checked_index`): it then reads the
checked copy and its verdict word, and nothing else is launched.

The library is compiled on first use (``available()`` or the first call) and cached per machine
and torch version (see ``_build``); registering never builds, and a machine without a CUDA torch,
a Hopper GPU, nvcc or ninja gets a kernel whose ``available()`` says why. Each Python function
here has exactly the positional signature of the torch baseline (``oracle.kernels.torch_native``).

Entry point: ``oracle.kernels: cuda = "oracle.kernels.cuda:register"`` (or
``ORACLE_PLUGINS=oracle.kernels.cuda:register``).
"""

from __future__ import annotations

import functools
import os

import torch

import oracle

from .. import _deferred, _jit
from ..check_reuse import reusing
from ..checked_index import CHECKED_NOTE, CheckedIndex, CheckedIndexWriter, resolve, slots_of
from . import _build

NAMESPACE = _build.MAIN.namespace
FP8_FORMATS = ("e4m3fn", "e5m2")
SCANNED_INDEX_MAX = 256  # the library's kFusedCheckMax: every block of a writer scans an index this short

def _load() -> str | None:
    """Build or load the library, then give it every visible device's error mailbox (so a direct
    ``torch.ops.kv_oracle_cuda`` call validates and reports as the wrappers' calls do)."""
    reason = _build.load(_build.MAIN)
    if reason is None:
        for index in range(torch.cuda.device_count()):
            torch.ops.kv_oracle_cuda.set_error_mailbox(_deferred.mailbox(torch.device("cuda", index)), index)
    return reason


_LIB = _jit.Library("CUDA", NAMESPACE, _load, f"{__name__}._fake")
available = _LIB.available  # None when the CUDA kernels are loaded (built on first use), else why not
ops = _LIB.ops  # torch.ops.kv_oracle_cuda, loading the library first; RuntimeError when unavailable


def build_info() -> dict:
    """Where the library lives and whether this process built it (and in how many seconds)."""
    return {"build_dir": str(_build.build_dir()), "hash": _build.source_hash(), **_build.status()}


# ---- the kernels, in the torch baseline's calling conventions -----------------------------------


def _begin(cache: torch.Tensor, validate) -> tuple:
    """(the op library, validate as the op takes it, whether the call raises its own error at once)
    for a call writing ``cache``; for a validating call, first raise an earlier call's error on that
    device (host memory only: no synchronization; the library got every device's mailbox when it
    loaded)."""
    lib = _LIB.loaded or ops()
    if validate is False:
        return lib, 0, False
    sync = _deferred.sync_requested(validate)  # rejects any other value before the launch
    _deferred.take(cache.get_device())
    return lib, 1, sync


def _index(argument: str, index, cache, lead: int, padding: str) -> tuple:
    """(the index tensor the op reads, the verdict it reads or None): a CheckedIndex
    (oracle.kernels.check_index) as its copy and verdict, once it is known to have been checked
    against the slots of ``cache`` (the product of its first ``lead`` dims) under ``padding``; the
    copy alone where it is short enough for every block to scan it (SCANNED_INDEX_MAX), which the
    op does then in place of reading a verdict (the verdict left out saves its argument checks)."""
    if type(index) is not CheckedIndex:
        return index, None
    num_slots = slots_of(cache, lead)
    if num_slots is None:
        return index.index, None  # not a cache of that rank: the op refuses it before it reads anything
    if num_slots != index.num_slots or padding != index.padding:  # else resolve's answer, without its call
        resolve(argument, index, num_slots, padding)  # raises the ValueError naming both, or accepts it
    return index.index, (index.verdict if index.entries > SCANNED_INDEX_MAX else None)


# The ops' own defaults (csrc/binding.cpp), passed positionally: the dispatcher binds a call's
# arguments to an op's schema 0.4-1.2 us faster per call on the H100's host when they come in order
# to its `default` overload than as keywords (benchmarks/host_cost.py).
MAX_VEC = 16
MLA_PATH = "auto"


def _finish(cache: torch.Tensor, sync: bool) -> None:
    """Raise the call's own error at once where that was asked for (``sync``, from _begin;
    synchronizing its stream; not under capture, where the binding leaves the check out)."""
    if not sync or torch._C._cuda_isCurrentStreamCapturing():
        return
    _deferred.raise_at_once(cache.get_device())


@reusing("store_cache", padding="none")
def store_cache(k, v, k_cache, v_cache, loc, *, pdl=True, validate=True):
    """``k_cache[loc] = k; v_cache[loc] = v`` (sglang's store_cache; every slot must be in range).
    ``pdl``: launch with programmatic dependent launch (default; see :data:`PDL_NOTE`; False: a plain launch).
    ``validate``: True (slots checked on the device, errors deferred), "sync" or False (see above).
    ``loc`` may be a CheckedIndex (see above)."""
    loc, verdict = _index("loc", loc, k_cache, 1, "none")
    lib, check, sync = _begin(k_cache, validate)
    lib.store_cache.default(k, v, k_cache, v_cache, loc, MAX_VEC, pdl, check, verdict)
    _finish(k_cache, sync)


_in_grid_rows: dict = {}  # MLA row bytes -> the longest index the writer's own grid checks


def _mla_reuse_from(args: tuple) -> int:
    """The shortest index whose check set_mla_kv_buffer reuses (oracle.kernels.check_reuse): past
    what its own grid checks in the same launch (up to 7508 rows of 1152 bytes on the H100)."""
    nope, rope = args[2], args[3]
    if not (isinstance(nope, torch.Tensor) and isinstance(rope, torch.Tensor)):
        return 1 << 62  # the writer refuses them itself
    row_bytes = nope.shape[-1] * nope.element_size() + rope.shape[-1] * rope.element_size()
    found = _in_grid_rows.get(row_bytes)
    if found is None:  # the grid checks only rows of 16-byte vectors (mla_checked.cu)
        in_grid = int(ops().mla_checked_rows(row_bytes)) if row_bytes > 0 and row_bytes % 16 == 0 else 0
        found = _in_grid_rows[row_bytes] = in_grid + 1
    return found


@reusing("set_mla_kv_buffer", padding="none", reuse_from=_mla_reuse_from)
def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, *, pdl=True, validate=True):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)`` (sglang's SM90 TMA writer; every slot in
    range). ``pdl``, ``validate``, ``loc``: as store_cache's."""
    loc, verdict = _index("loc", loc, kv_buffer, 1, "none")
    lib, check, sync = _begin(kv_buffer, validate)
    lib.set_mla_kv_buffer.default(kv_buffer, loc, cache_k_nope, cache_k_rope, MLA_PATH, MAX_VEC, pdl, check, verdict)
    _finish(kv_buffer, sync)


@reusing("reshape_and_cache_flash", padding="negative")
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, *,
                            pdl=True, validate=True):
    """vLLM's paged K/V writer on any [num_blocks, block_size, H, D] cache view (NHD or HND);
    fp8 e4m3fn / e5m2 with per-tensor [1] or per-head [H] scales; negative slots skipped.
    ``pdl``, ``validate``: as store_cache's; ``slot_mapping`` may be a CheckedIndex (padding "negative")."""
    if kv_cache_dtype == "auto":  # scales are ignored, as vLLM does; they need not be tensors
        k_scale = k_scale if isinstance(k_scale, torch.Tensor) else None
        v_scale = v_scale if isinstance(v_scale, torch.Tensor) else None
    else:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(scale, torch.Tensor):
                raise TypeError(f"{name} must be a float32 tensor, got {type(scale).__name__}")
    slot_mapping, verdict = _index("slot_mapping", slot_mapping, key_cache, 2, "negative")
    lib, check, sync = _begin(key_cache, validate)
    lib.reshape_and_cache_flash.default(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                        v_scale, MAX_VEC, pdl, check, verdict)
    _finish(key_cache, sync)


# ---- registration -------------------------------------------------------------------------------

CHECKS = ("devices, dtypes, shapes and strides checked on the host before anything is launched; slots checked "
          "on the device (a long index by a check grid whose verdict the writer reads after its PDL wait, or for "
          "set_mla_kv_buffer's direct path up to one pass by the writer's "
          "own grid at a grid barrier), never read on the host (not while a CUDA graph is captured: the replay then drops any "
          "slot outside the cache, as the unchecked path does), and fp8 scales (finite and > 0) beside them: a call "
          "with an illegal slot or scale writes "
          "nothing and its error is raised by the next validating call or oracle.kernels.raise_deferred_errors() "
          "(errors='deferred'; at once with validate='sync' or KV_ORACLE_SYNC_ERRORS=1); a long index's check is "
          "reused while torch sees the index tensor unchanged (oracle.kernels.check_reuse)")
UNCHECKED_NOTE = ("validate=False: no slot or scale check (the caller vouches for them); metadata still checked, "
                  "out-of-range slots skipped")
LAYOUT = ("any source/cache row and head strides, only the last dim contiguous; int64 byte offsets; vector "
          "width = the widest of 16/8/4/2/1 bytes dividing every pointer and stride")


PDL_NOTE = ("launched with programmatic dependent launch (cudaLaunchKernelEx with programmatic stream "
            "serialization; pdl=False launches plainly): every block asks the L2 for its first rows (a hint), "
            "then runs griddepcontrol.wait before any load or store, then griddepcontrol.launch_dependents")


def _register(fn, **fields) -> None:
    """Register ``fn``; as ``<name>.unchecked``, the kernel called with ``validate=False``
    (``validates=False``: every in-contract case, no bad input); and as ``<name>.checked_index``,
    the kernel called with its index checked by ``oracle.kernels.check_index`` first (the same
    contract); all launched with PDL. The plain launch (``pdl=False``) is the same kernel without
    the wait; the GPU tests run it."""
    from .. import raise_deferred_errors

    fields = dict(fields, errors="deferred", raise_deferred=raise_deferred_errors,
                  notes=f"{PDL_NOTE}; {fields['notes']}")
    oracle.register(fn, **fields)
    oracle.register(CheckedIndexWriter(fn, fields["op"], fields["padding"]),
                    **dict(fields, name=fields["name"] + ".checked_index", notes=f"{CHECKED_NOTE}; {fields['notes']}"))
    oracle.register(functools.partial(fn, validate=False),
                    **dict(fields, name=fields["name"] + ".unchecked", validates=False,
                           notes=f"{UNCHECKED_NOTE}; {fields['notes'].replace(CHECKS, 'slots not checked')}"))


def register() -> None:
    """Register the CUDA kernels with :func:`oracle.register` (never builds: ``available()`` does),
    each also as ``<name>.unchecked``."""
    common = dict(backend="cuda", device="cuda", validates=True, available=available, duplicates="forbid",
                  row_bytes_multiple=1)
    _register(store_cache, op="store_cache", name="cuda.store_cache",
              dtypes=("float32", "float16", "bfloat16", "uint8"), padding="none",
              notes=f"one warp per (row, K/V), persistent grid; {LAYOUT}; sglang's policy without "
                    f"reserved_skip_index: every slot must be in range; {CHECKS}; duplicates forbidden "
                    "(a row is written by 32 lanes, so two colliding rows can tear)", **common)
    _register(set_mla_kv_buffer, op="set_mla_kv_buffer", name="cuda.set_mla_kv_buffer",
              dtypes=("float32", "float16", "bfloat16", "uint8"), padding="none",
              notes="direct global->global copies, a warp per row, where every pointer and stride allows "
                    "16-byte vectors; else sm_90 TMA where the bulk copy takes the row (row bytes % 16 == 0, "
                    "kv_buffer's address and row stride 16-byte aligned, rows up to 24 KiB): a warp stages "
                    "nope+rope in shared memory, one lane stores the row with cp.async.bulk "
                    "(fence.proxy.async first; bulk groups, wait_group.read before reuse); else direct at "
                    "the widest width that divides everything; each warp prefetches its first row into the "
                    f"L2; every slot must be in range; {CHECKS}; duplicates forbidden (two warps' copies of "
                    "one slot are unordered)", **common)
    _register(reshape_and_cache_flash, op="reshape_and_cache_flash", name="cuda.reshape_and_cache_flash",
              dtypes=("float32", "float16", "bfloat16"), padding="negative", layouts=("NHD", "HND"),
              fp8_formats=FP8_FORMATS, fp8_preset="cuda_satfinite", scales=("tensor", "head"),
              notes="one warp per (token, K/V), (block, offset) from the slot on any cache view (NHD, HND, "
                    f"padded); {LAYOUT}; fp8: x / scale, the IEEE float32 quotient wherever the code "
                    "can tell (the scale's reciprocal prepared once), then cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (overflow and inf to +-max, NaN to "
                    "0x7F without sign: preset cuda_satfinite), 16-byte loads; fnuz formats refused "
                    f"(NotImplementedError); negative slots skipped (vLLM); {CHECKS}", **common)


__all__ = ["available", "ops", "build_info", "register", "PDL_NOTE", "store_cache", "set_mla_kv_buffer",
           "reshape_and_cache_flash", "FP8_FORMATS", "NAMESPACE"]

if os.environ.get("KV_ORACLE_CUDA_EAGER"):  # build at import, e.g. to warm the cache in an image
    available()
