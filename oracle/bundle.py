"""Failing cases as self-contained ``.npz`` bundles, and their replay on another machine.

A bundle holds every region's bytes as the kernel first saw them (guard bands included), the view
layout, the call's arguments, the expected regions, and the case and contract as JSON: replaying
needs the kernel and kv-oracle, not the case generator. A ``repeat`` case's bundle also holds the
memory as it was before its first call, which the replay calls the kernel on first, on the same
tensors. Load with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .buffers import Arena, Region, SparseBytes, ViewSpec, fill_tiled, to_numpy, to_torch
from .compare import expected_regions, first_difference
from .ops import get_spec
from .ops._modes import as_called, call_context, fresh_compile
from .ops.base import Case, Prepared, is_bad
from .reference.slots import OneOfRows

FORMAT = 1


def write_bundle(directory, kernel, case: Case, outcome) -> Path:
    prepared: Prepared = outcome.prepared
    arena = prepared.arena
    arrays = {f"region.{name}": _packed(data) for name, data in prepared.before.items()}
    arrays.update({f"tile.{name}": data.tile for name, data in prepared.before.items()
                   if isinstance(data, SparseBytes)})
    if prepared.earlier is not None and not any(isinstance(d, SparseBytes) for d in prepared.earlier.values()):
        # a repeat case (never a large one): the first call's memory, replayed first
        arrays.update({f"earlier.{name}": _packed(data) for name, data in prepared.earlier.items()})
    if outcome.expected is not None:
        expected, _ = expected_regions(arena, prepared.before, prepared.before, _bases(outcome.expected))
        arrays.update({f"expected.{name}": _packed(data) for name, data in expected.items()})
    args = []
    for position, arg in enumerate(prepared.args):
        if isinstance(arg, torch.Tensor):
            name = _view_of(arena, arg)
            if name is not None:
                args.append({"view": name})
            else:  # a tensor made outside the arena (a bad-input variant)
                arrays[f"arg.{position}"] = to_numpy(arg)
                args.append({"array": position, "dtype": str(arg.dtype).removeprefix("torch.")})
        else:
            args.append({"value": arg})
    meta = {
        "format": FORMAT, "kv_oracle": __version__, "torch": torch.__version__,
        "op": case.op, "case_class": case.cls, "case_id": case.id, "params": case.params,
        "seed": case.seed, "kernel": kernel.name, "contract": kernel.contract.as_dict(),
        "regions": {n: _region_meta(r, prepared.before[n]) for n, r in arena.regions.items()},
        "views": [asdict(v) for v in arena.views.values()], "caches": list(prepared.caches),
        "args": args, "message": outcome.message,
    }
    arrays["meta"] = np.array(json.dumps(meta, default=_jsonable))
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / (re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{case.op}-{kernel.name}-{case.id}") + ".npz")
    np.savez_compressed(target, **arrays)
    return target


def replay(path, kernel) -> tuple[bool, str]:
    """Run ``kernel`` on a bundle; ``(passed, report)``. Duplicated-slot cases are re-judged by
    the reference under the replaying kernel's contract (several results are allowed there)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in data.files}
    if meta["format"] != FORMAT:
        raise ValueError(f"{path}: bundle format {meta['format']}, this kv-oracle reads {FORMAT}")
    if meta["op"] != kernel.contract.op:
        raise ValueError(f"{path} is a {meta['op']} case; kernel {kernel.name} implements {kernel.contract.op}")
    case = Case(meta["op"], meta["case_class"], tuple((k, _tuple(v)) for k, v in meta["params"]))
    fresh_compile(case)
    with call_context(case):  # the bundle's tensors made, and the kernel called, in the case's mode
        return _replay(case, meta, arrays, kernel)


def _replay(case: Case, meta: dict, arrays: dict, kernel) -> tuple[bool, str]:
    arena = Arena(kernel.contract.device, meta["seed"])
    for name, info in meta["regions"].items():
        if "windows" in info:  # sparse: the tile everywhere, then the saved windows
            tile = arrays[f"tile.{name}"]
            tensor = fill_tiled(info["payload"] + 2 * info["guard"], tile, arena.device)
            packed = torch.from_numpy(arrays[f"region.{name}"]).to(arena.device)
            at = 0
            for start, end in info["windows"]:
                tensor[start:end] = packed[at: at + end - start]
                at += end - start
            arena.regions[name] = Region(name, info["payload"], info["guard"], tensor, tile)
        else:
            tensor = torch.from_numpy(arrays[f"region.{name}"].copy()).to(arena.device)
            arena.regions[name] = Region(name, info["payload"], info["guard"], tensor)
    for view in meta["views"]:
        arena.views[view["name"]] = ViewSpec(**{**view, "shape": tuple(view["shape"]),
                                               "strides": tuple(view["strides"])})
    args = []
    for arg in meta["args"]:
        if "view" in arg:
            args.append(arena.torch_view(arena.views[arg["view"]]))
        elif "array" in arg:
            args.append(to_torch(arrays[f"arg.{arg['array']}"]).to(arena.device))
        else:
            args.append(arg["value"])
    header = (f"replaying {meta['op']} case {meta['case_id']} (class {meta['case_class']}, seed "
              f"{meta['seed']}, first failed by {meta['kernel']}) on {kernel.name}")
    try:
        if any(k.startswith("earlier.") for k in arrays):
            _first_call(arena, arrays, as_called(case, kernel.fn), args)
        prepared = Prepared(arena, tuple(args), tuple(meta["caches"]), before=arena.snapshot())
        returned = as_called(case, kernel.fn)(*prepared.args)
        if arena.device.startswith("cuda"):
            torch.cuda.synchronize()
    except _FirstCallFailed as exc:
        return False, f"{header}\nthe first of the case's two calls raised {exc}"
    except Exception as exc:
        if is_bad(case):
            return True, f"{header}\nrejected with {type(exc).__name__}: {exc}"
        return False, f"{header}\nthe kernel raised {type(exc).__name__}: {exc}"
    after = arena.snapshot()
    spec = get_spec(case.op)
    if spec.returns:  # the op writes nothing: its returned tensor is judged
        _, problem, _ = spec.check_returned(prepared, {}, returned)
        if problem:
            return False, f"{header}\n{problem}"
    if dict(case.params).get("dups") or not any(k.startswith("expected.") for k in arrays):
        expected = spec.expected(prepared, case, kernel.contract)
        regions, problems = expected_regions(arena, prepared.before, after, expected)
    else:
        regions = {n: _unpacked(arrays[f"expected.{n}"], prepared.before[n]) for n in meta["regions"]}
        problems = []
    difference = first_difference(arena, regions, after)
    if difference is None and not problems:
        return True, f"{header}\npass"
    return False, "\n".join([header, *problems, difference.text if difference else ""]).rstrip()


class _FirstCallFailed(Exception):
    """The first call of a replayed repeat case raised."""


def _first_call(arena: Arena, arrays: dict, call, args: list) -> None:
    """A repeat case's first call (oracle.ops._repeat), on the same tensors as the second: the
    memory as it was before the first call, the call, then the memory as it was before the
    second (inputs redrawn in place, the caches as the first call wrote them)."""
    second = {name: region.tensor.clone() for name, region in arena.regions.items()}
    for name, region in arena.regions.items():
        region.tensor.copy_(torch.from_numpy(arrays[f"earlier.{name}"]).to(arena.device))
    try:
        call(*args)
        if arena.device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as exc:
        raise _FirstCallFailed(f"{type(exc).__name__}: {exc}") from exc
    for name, region in arena.regions.items():
        region.tensor.copy_(second[name])


def _packed(data):
    return data.data if isinstance(data, SparseBytes) else data


def _unpacked(saved: np.ndarray, like):
    if isinstance(like, SparseBytes):
        return SparseBytes(like.size, like.starts, like.ends, saved, like.tile)
    return saved


def _region_meta(region: Region, snapshot) -> dict:
    info = {"payload": region.payload, "guard": region.guard}
    if isinstance(snapshot, SparseBytes):
        info["windows"] = [[int(a), int(b)] for a, b in zip(snapshot.starts, snapshot.ends)]
    return info


def _bases(expected: dict) -> dict:
    return {name: outcome.base if isinstance(outcome, OneOfRows) else outcome
            for name, outcome in expected.items()}


def _view_of(arena: Arena, tensor: torch.Tensor) -> str | None:
    for name, spec in arena.views.items():
        candidate = arena.torch_view(spec)
        if (candidate.data_ptr() == tensor.data_ptr() and candidate.shape == tensor.shape
                and candidate.stride() == tensor.stride() and candidate.dtype == tensor.dtype):
            return name
    return None


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {value!r} in a bundle")


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value

