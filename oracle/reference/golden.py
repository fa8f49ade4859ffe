"""Hand-derived fp8 golden vectors: load them (sha256-checked) and run them against the reference.

``golden/fp8_golden.json`` holds fp8 corner cases whose expected codes were derived by hand from
the format definitions (each case says why), for the presets ``ocp_satfinite`` (saturating) and
``ml_dtypes`` (non-saturating), a few with a scale or a 16-bit intermediate. The file's sha256 is
pinned in :data:`GOLDEN_SHA256`, so any edit of the file must also edit this constant, loudly.

``run_golden()`` is what ``oracle selfcheck`` prints: one row per (format, preset) with the number
of cases and of failures. ``golden/mx_golden.json`` holds MXFP8 blocks in the same spirit (the
E8M0 scale and the element codes, per MX preset), checked by :func:`check_mx_golden` and pinned in
:data:`MX_GOLDEN_SHA256`; ``golden/nvfp4_golden.json`` holds NVFP4 blocks (a global scale, the
e4m3fn scale byte and the packed e2m1 bytes, per NVFP4 preset), checked by
:func:`check_nvfp4_golden` and pinned in :data:`NVFP4_GOLDEN_SHA256`. Imports neither torch nor
triton.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .fp8 import quantize
from .mx import quantize_mxfp8
from .nvfp4 import quantize_nvfp4

GOLDEN_PATH = Path(__file__).with_name("golden") / "fp8_golden.json"
GOLDEN_SHA256 = "8504214001e02e620f8f5bcb4f5c5875b32141ab04186b9c66cfb16bcf11f806"
MX_GOLDEN_PATH = Path(__file__).with_name("golden") / "mx_golden.json"
MX_GOLDEN_SHA256 = "316cf8520d51af8c12b0f3d0c779fc63102d0022b10ea5de52c46bdab976c54d"
NVFP4_GOLDEN_PATH = Path(__file__).with_name("golden") / "nvfp4_golden.json"
NVFP4_GOLDEN_SHA256 = "386190b60587b58326d2f6b2889250fe8d372ff3fe0a3a6a9f34315095ee9661"


class GoldenIntegrityError(ValueError):
    """The golden file's sha256 is not :data:`GOLDEN_SHA256`."""


class GoldenResult(NamedTuple):
    name: str  # "<format> <preset>", e.g. "e4m3fn ocp_satfinite"
    cases: int
    failures: int


class GoldenFailure(NamedTuple):
    name: str
    x: str  # float32 bits
    knobs: dict  # scale / intermediate, where the case has them
    expected: str
    actual: str
    why: str


def file_sha256(path: Path = GOLDEN_PATH) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_golden(path: Path = GOLDEN_PATH, *, verify: bool = True, sha256: str | None = None,
                constant: str = "GOLDEN_SHA256") -> dict:
    """The parsed golden file; with ``verify`` (default) its sha256 must equal ``sha256`` (the
    pinned constant named ``constant``; default: :data:`GOLDEN_SHA256`, read at call time)."""
    if sha256 is None:
        sha256 = GOLDEN_SHA256
    data = Path(path).read_bytes()
    if verify:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise GoldenIntegrityError(
                f"{path} has sha256 {digest}, expected {constant} = {sha256}; the golden "
                f"vectors were edited: re-derive and review them, then update {constant}")
    return json.loads(data)


def _bits_to_float32(hex_bits: str) -> np.float32:
    return np.array([int(hex_bits, 16)], dtype=np.uint32).view(np.float32)[0]


def case_knobs(case: dict) -> dict:
    """The quantize keyword arguments of a case besides its preset (scale, intermediate)."""
    knobs = {}
    if "scale" in case:
        knobs["scale"] = _bits_to_float32(case["scale"])
    if "intermediate" in case:
        knobs["intermediate"] = case["intermediate"]
    return knobs


def check_golden(path: Path = GOLDEN_PATH) -> tuple[list[GoldenResult], list[GoldenFailure]]:
    """Run every case for every preset it lists: the per-(format, preset) results and the
    failing cases."""
    golden = load_golden(path)
    counts: dict[str, list[int]] = {}
    failures: list[GoldenFailure] = []
    for case in golden["cases"]:
        x = np.array([int(case["x"], 16)], dtype=np.uint32).view(np.float32)
        knobs = case_knobs(case)
        for preset, expected in case["expected"].items():
            name = f"{case['fmt']} {preset}"
            row = counts.setdefault(name, [0, 0])
            row[0] += 1
            actual = int(quantize(x, case["fmt"], preset=preset, **knobs)[0])
            if actual != int(expected, 16):
                row[1] += 1
                failures.append(GoldenFailure(name, case["x"],
                                              {k: case[k] for k in ("scale", "intermediate")
                                               if k in case},
                                              expected, f"0x{actual:02X}", case["why"]))
    results = [GoldenResult(name, n, bad) for name, (n, bad) in counts.items()]
    return results, failures


def run_golden(path: Path = GOLDEN_PATH) -> list[GoldenResult]:
    """One (name, cases, failures) row per (format, preset), in file order."""
    return check_golden(path)[0]


def check_mx_golden(path: Path = MX_GOLDEN_PATH) -> tuple[list[GoldenResult], list[GoldenFailure]]:
    """The MXFP8 golden vectors (``golden/mx_golden.json``, sha256 pinned in
    :data:`MX_GOLDEN_SHA256`): each case is one block, with the hand-derived E8M0 scale and
    element codes per MX preset. Results per (element format, preset) and the failing cases."""
    golden = load_golden(path, sha256=MX_GOLDEN_SHA256, constant="MX_GOLDEN_SHA256")
    counts: dict[str, list[int]] = {}
    failures: list[GoldenFailure] = []
    for case in golden["cases"]:
        x = np.array([int(h, 16) for h in case["x"]], dtype=np.uint32).view(np.float32)
        for preset, expected in case["expected"].items():
            name = f"mxfp8 {case['fmt']} {preset}"
            row = counts.setdefault(name, [0, 0])
            row[0] += 1
            codes, scales = quantize_mxfp8(x, case["fmt"], preset=preset)
            actual = " ".join([f"0x{int(scales[0]):02X}"] + [f"0x{int(c):02X}" for c in codes])
            wanted = " ".join([expected["scale"]] + expected["codes"])
            if actual != wanted:
                row[1] += 1
                failures.append(GoldenFailure(name, " ".join(case["x"]), {}, wanted, actual, case["why"]))
    return [GoldenResult(name, n, bad) for name, (n, bad) in counts.items()], failures


def check_nvfp4_golden(path: Path = NVFP4_GOLDEN_PATH) -> tuple[list[GoldenResult], list[GoldenFailure]]:
    """The NVFP4 golden vectors (``golden/nvfp4_golden.json``, sha256 pinned in
    :data:`NVFP4_GOLDEN_SHA256`): each case is one block with a global scale (and optional knobs
    applied under every preset), with the hand-derived e4m3fn scale byte and packed e2m1 bytes
    per NVFP4 preset. Results per preset and the failing cases."""
    golden = load_golden(path, sha256=NVFP4_GOLDEN_SHA256, constant="NVFP4_GOLDEN_SHA256")
    counts: dict[str, list[int]] = {}
    failures: list[GoldenFailure] = []
    for case in golden["cases"]:
        x = np.array([int(h, 16) for h in case["x"]], dtype=np.uint32).view(np.float32)
        gs = _bits_to_float32(case["global_scale"])
        knobs = case.get("knobs", {})
        for preset, expected in case["expected"].items():
            name = f"nvfp4 {preset}"
            row = counts.setdefault(name, [0, 0])
            row[0] += 1
            packed, scales = quantize_nvfp4(x, gs, preset=preset, **knobs)
            actual = " ".join([f"0x{int(scales[0]):02X}"] + [f"0x{int(b):02X}" for b in packed])
            wanted = " ".join([expected["scale"]] + expected["packed"])
            if actual != wanted:
                row[1] += 1
                failures.append(GoldenFailure(name, " ".join(case["x"]),
                                              {"global_scale": case["global_scale"], **knobs},
                                              wanted, actual, case["why"]))
    return [GoldenResult(name, n, bad) for name, (n, bad) in counts.items()], failures
