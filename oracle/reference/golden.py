"""Hand-derived fp8 golden vectors: load them (sha256-checked) and run them against the reference.

``golden/fp8_golden.json`` holds fp8 corner cases whose expected codes were derived by hand from
the format definitions (each case says why), for the presets ``ocp_satfinite`` (saturating) and
``ml_dtypes`` (non-saturating), a few with a scale or a 16-bit intermediate. The file's sha256 is
pinned in :data:`GOLDEN_SHA256`, so any edit of the file must also edit this constant, loudly.

``run_golden()`` is what ``oracle selfcheck`` prints: one row per (format, preset) with the number
of cases and of failures. Imports neither torch nor triton.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .fp8 import quantize

GOLDEN_PATH = Path(__file__).with_name("golden") / "fp8_golden.json"
GOLDEN_SHA256 = "8504214001e02e620f8f5bcb4f5c5875b32141ab04186b9c66cfb16bcf11f806"


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


def load_golden(path: Path = GOLDEN_PATH, *, verify: bool = True) -> dict:
    """The parsed golden file; with ``verify`` (default) its sha256 must equal GOLDEN_SHA256."""
    data = Path(path).read_bytes()
    if verify:
        digest = hashlib.sha256(data).hexdigest()
        if digest != GOLDEN_SHA256:
            raise GoldenIntegrityError(
                f"{path} has sha256 {digest}, expected GOLDEN_SHA256 = {GOLDEN_SHA256}; the golden "
                "vectors were edited: re-derive and review them, then update GOLDEN_SHA256")
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
