"""Triton kernels for every op, registered through the public plug-in API.

Entry point ``oracle.kernels: triton = "oracle.kernels.triton:register"`` (or
``ORACLE_PLUGINS=oracle.kernels.triton:register``). Where they run decides the backend:

- a CUDA device (and TRITON_INTERPRET unset): backend ``triton``, device ``cuda``; fp8 e4m3fn and
  e5m2 declared with preset ``triton_sm90`` on sm_90 and newer (older GPUs round float32 through
  float16 first, so no fp8 is declared there);
- TRITON_INTERPRET=1: backend ``triton-interpret``, device ``cpu``, copies only (the
  interpreter's fp8 conversion is wrong, so no fp8 format is declared and the fp8 paths refuse),
  except the block-scaled writers (``quantize_block``, ``reshape_and_cache_block``: MXFP8, NVFP4),
  which convert by integer arithmetic and declare every block format wherever they run;
- neither, or triton not installed: backend ``triton``, device ``cuda``, registered with
  ``available()`` saying why it cannot run here.

Each writer is also registered as ``<name>.unchecked`` (``validate=False``: the decode fast path).
On sm_90+ both launch with programmatic dependent launch (the writers' default there; the GPU
tests also run the plain launch, ``pdl=False``).

Importing this package imports neither triton nor the kernels; :func:`register` does, guarded.
"""

from __future__ import annotations

import functools
import os

import oracle

from ..checked_index import CHECKED_NOTE, CheckedIndexWriter
from . import block_ops, ops

OPS = ("store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "translate_full_to_swa",
       "reshape_and_cache_flash", "quantize_fp8", "quantize_block", "reshape_and_cache_block")
FP8 = ("e4m3fn", "e5m2")
BLOCK_FORMATS = ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4")
INTERPRETER_COMPILE = ("torch.compile traces the Triton interpreter's numpy emulation of each launch, which "
                       "dynamo cannot run on fake tensors; compiled calls are judged on a GPU")
NO_CUDA = "no CUDA device (set TRITON_INTERPRET=1 to run the copy kernels on the CPU interpreter)"


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def backend_info() -> dict:
    """Where the kernels would run here: ``backend``, ``device``, ``reason`` (None when they can
    run), ``interpret`` and ``fp8`` (declared formats) and, on CUDA, ``capability``."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return {"backend": "triton", "device": "cuda", "reason": "triton is not installed",
                "interpret": False, "fp8": ()}
    try:
        interpret = ops.interpreting()
    except Exception as exc:  # a broken triton install: report it instead of failing to register
        return {"backend": "triton", "device": "cuda", "interpret": False, "fp8": (),
                "reason": f"importing the Triton kernels failed: {type(exc).__name__}: {exc}"}
    if interpret:
        return {"backend": "triton-interpret", "device": "cpu", "reason": None, "interpret": True,
                "fp8": ()}
    import torch

    if not torch.cuda.is_available():
        reason = NO_CUDA
        if _env_interpret():  # set after the kernels were defined: too late for them
            reason = "TRITON_INTERPRET=1 was set after the Triton kernels were defined; " + NO_CUDA
        return {"backend": "triton", "device": "cuda", "reason": reason, "interpret": False, "fp8": ()}
    capability = torch.cuda.get_device_capability()
    return {"backend": "triton", "device": "cuda", "reason": None, "interpret": False,
            "capability": capability, "fp8": FP8 if capability >= (9, 0) else ()}


def register() -> None:
    info = backend_info()
    backend, device, reason = info["backend"], info["device"], info["reason"]

    def available() -> str | None:
        return reason

    fp8 = info["fp8"]
    if info["interpret"]:
        fp8_note = ("no fp8 declared: " + ops.INTERPRETER_FP8)
    elif reason is None and not fp8:
        fp8_note = (f"no fp8 declared: sm_{''.join(map(str, info['capability']))} is older than "
              "sm_90, where Triton rounds float32 through float16 before fp8 (double rounding)")
    else:
        fp8_note = ("fp8 e4m3fn/e5m2 on sm_90+: x / scale by IEEE division (div_rn) in float32, then "
              "Triton's conversion (saturating, inf -> ±max, NaN -> 0x7F); fnuz formats refused")
    # torch.compile traces the interpreter's numpy emulation of each launch, which dynamo cannot
    # run on fake tensors (and takes seconds a call trying): compiled calls are judged on GPUs
    compiles = dict(torch_compile=not info["interpret"],
                    reasons=(("torch_compile", INTERPRETER_COMPILE),) if info["interpret"] else ())
    common = dict(backend=backend, device=device, validates=True, available=available,
                  fp8_preset="triton_sm90", torch_compile=compiles["torch_compile"],
                  reasons=((("fp8_format", fp8_note),) if not fp8 else ()) + compiles["reasons"],
                  pdl=reason is None and not info["interpret"] and info["capability"] >= (9, 0))
    copy = "bitwise copy (rows reinterpreted as integers), int64 offsets, every stride honoured"
    _register(ops.store_cache, op="store_cache", name=f"{backend}.store_cache",
              dtypes=("float32", "float16", "bfloat16", "uint8"), padding="none", **common,
              notes=f"{copy}; sglang's policy: every slot must be in range")
    _register(ops.set_mla_kv_buffer, op="set_mla_kv_buffer", name=f"{backend}.set_mla_kv_buffer",
              dtypes=("float32", "float16", "bfloat16", "uint8"), padding="none", **common,
              notes=f"whole rows, one power-of-two tile per part (nope, rope); {copy}; "
                    "sglang's policy: every slot must be in range")
    _register(ops.concat_and_cache_mla, op="concat_and_cache_mla",
              name=f"{backend}.concat_and_cache_mla", padding="negative", fp8_formats=fp8,
              scales=("tensor",), **common,
              notes=f"fused concat + quantize + store; {copy}; -1 slots skipped; {fp8_note}")
    _register(ops.translate_full_to_swa, op="translate_full_to_swa",
              name=f"{backend}.translate_full_to_swa", padding="negative", **common,
              notes="mapping[loc] with loc up to 4-D and strided; -1 -> -1 handled in the "
                    "kernel, nothing read outside the table")
    _register(ops.reshape_and_cache_flash, op="reshape_and_cache_flash",
              name=f"{backend}.reshape_and_cache_flash", padding="negative", fp8_formats=fp8,
              **common,
              notes=f"fused quantize + store, NHD/HND/padded views by strides, per-tensor or "
                    f"per-head scales; {copy}; -1 slots skipped; {fp8_note}")
    _register(ops.quantize_fp8, op="quantize_fp8", name=f"{backend}.quantize_fp8",
              fp8_formats=fp8, **common, notes=f"the scale checked on the device (finite and > 0); {fp8_note}")
    # the block-scaled writers convert by integer arithmetic, exact on the interpreter and on any
    # GPU alike, so they declare every format wherever they run
    block = dict(backend=backend, device=device, validates=True, available=available,
                 dtypes=("float32", "float16", "bfloat16"), block_formats=BLOCK_FORMATS,
                 scale_layouts=("linear", "swizzled"), **compiles)
    block_note = ("MXFP8/NVFP4 by integer bit arithmetic (RNE fp8/e2m1, E8M0 floor(log2)), float32 "
                  "products and IEEE div_rn as the reference; slots and per-tensor scales checked on the device")
    if device == "cuda":
        from .. import raise_deferred_errors

        block.update(errors="deferred", raise_deferred=raise_deferred_errors)
        block_note = f"{DEFERRED_NOTE}; {block_note}"
    paged = dict(padding="negative", layouts=("NHD", "HND"))
    paged_note = "NHD/HND code caches, linear or 128x4 swizzled scales; -1 slots skipped"
    for fn, op, extra, note in ((block_ops.quantize_block, "quantize_block", {}, block_note),
                                (block_ops.reshape_and_cache_block, "reshape_and_cache_block", paged,
                                 f"{block_note}; {paged_note}")):
        oracle.register(fn, op=op, name=f"{backend}.{op}", notes=note, **extra, **block)
        if op == "reshape_and_cache_block" and device == "cuda":
            oracle.register(CheckedIndexWriter(fn, op, "negative"), op=op, name=f"{backend}.{op}.checked_index",
                            notes=f"{CHECKED_NOTE}; {note}", **extra, **block)
        # validate=False: nothing checked on the device (the decode fast path), bad input out of contract
        unchecked = dict(block, validates=False, errors="raise", raise_deferred=None)
        oracle.register(functools.partial(fn, validate=False), op=op, name=f"{backend}.{op}.unchecked",
                        notes=f"{UNCHECKED_NOTE}; {note}", **extra, **unchecked)


UNCHECKED_NOTE = ("validate=False: the decode fast path, no slot or scale check (the caller vouches for "
                  "them); metadata still checked, out-of-range slots skipped")
WRITERS = ("store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash")
VALIDATING = WRITERS + ("quantize_fp8",)  # the ops with a validate keyword: deferred errors, .unchecked twins


PDL_NOTE = ("launched with programmatic dependent launch (sm_90+; pdl=False launches plainly): each program "
            "first asks the L2 for its source rows (prefetch.global.L2, a hint), then griddepcontrol.wait before "
            "any load or store; a check grid lets the writer launch at once, so the writer's launch and "
            "prefetches overlap the kernels before the check too, and it reads the verdict after its wait")


DEFERRED_NOTE = ("slots and fp8 scales checked on the device, never read on the host (not while a CUDA graph is "
                 "captured: the replay then drops any slot outside the cache): a call with an illegal slot or "
                 "scale writes nothing and its error is raised by the next validating call or by "
                 "oracle.kernels.raise_deferred_errors() (errors='deferred'; at once with validate='sync' "
                 "or KV_ORACLE_SYNC_ERRORS=1); a long index's check is reused while torch sees the index "
                 "tensor unchanged (oracle.kernels.check_reuse)")


def _register(fn, pdl: bool = False, **fields) -> None:
    """Register ``fn`` (an op of VALIDATING on a GPU with ``errors="deferred"``: see DEFERRED_NOTE);
    such an op also as ``<name>.unchecked``, called with ``validate=False``: the
    same contract with ``validates=False``, so every in-contract case runs on the fast path too
    and only the bad-input cases are left out; and, on a GPU, as ``<name>.checked_index``, called
    with its index checked by ``oracle.kernels.check_index`` first (the same contract). ``pdl``:
    the writers launch with programmatic dependent launch here (an sm_90+ GPU), which the notes say."""
    if pdl and fields["op"] in WRITERS:
        fields = dict(fields, notes=f"{PDL_NOTE}; {fields['notes']}")
    plain_notes = fields["notes"]
    if fields["op"] in VALIDATING and fields["device"] == "cuda":
        from .. import raise_deferred_errors

        fields = dict(fields, errors="deferred", raise_deferred=raise_deferred_errors,
                      notes=f"{DEFERRED_NOTE}; {fields['notes']}")
    oracle.register(fn, **fields)
    if fields["op"] in WRITERS and fields["device"] == "cuda":
        oracle.register(CheckedIndexWriter(fn, fields["op"], fields["padding"]),
                        **dict(fields, name=fields["name"] + ".checked_index", notes=f"{CHECKED_NOTE}; {fields['notes']}"))
    if fields["op"] in VALIDATING:
        unchecked = dict(fields, name=fields["name"] + ".unchecked", validates=False,
                         notes=f"{UNCHECKED_NOTE}; {plain_notes}")
        oracle.register(functools.partial(fn, validate=False), **unchecked)
