"""The committed hand-derived fp8 golden vectors: pinned by sha256, each case checked against
``quantize``, and each hand derivation cross-checked against ml_dtypes (clamped to ±max for the
saturating preset) so a mistake in the derivation itself cannot hide."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference import golden
from oracle.reference.fp8 import quantize

MODES = ("ocp_satfinite", "ml_dtypes")
CASES = json.loads(golden.GOLDEN_PATH.read_bytes())["cases"]


def case_id(case):
    extra = "".join(f"-{k}={case[k]}" for k in ("scale", "intermediate") if k in case)
    return f"{case['fmt']}-{case['x']}{extra}"


def test_sha256_is_pinned():
    assert golden.file_sha256() == golden.GOLDEN_SHA256, (
        "fp8_golden.json changed: re-derive the edited cases by hand and update GOLDEN_SHA256")


def test_tampered_file_is_refused(tmp_path):
    data = golden.GOLDEN_PATH.read_bytes().replace(b'"0x7E"', b'"0x7D"', 1)
    bad = tmp_path / "fp8_golden.json"
    bad.write_bytes(data)
    with pytest.raises(golden.GoldenIntegrityError, match="GOLDEN_SHA256"):
        golden.load_golden(bad)
    with pytest.raises(ValueError, match="sha256"):
        golden.run_golden(bad)


def test_file_is_well_formed():
    doc = golden.load_golden()
    assert doc["version"] == 1
    seen = set()
    for case in doc["cases"]:
        assert set(case) <= {"fmt", "x", "scale", "intermediate", "expected", "why"}, case
        assert case["fmt"] in o.FORMAT_NAMES
        assert set(case["expected"]) == set(MODES), case
        assert len(case["why"]) > 3
        for value in (case["x"], case.get("scale", "0x3F800000")):
            assert value.startswith("0x") and len(value) == 10, value
        for code in case["expected"].values():
            assert code.startswith("0x") and len(code) == 4 and int(code, 16) < 256
        key = case_id(case)
        assert key not in seen, f"duplicate case {key}"
        seen.add(key)


def test_coverage_of_the_corner_cases():
    """Every format has zero, the min subnormal, its half (tie), the max, the tie above max,
    ±inf and NaN, in both modes."""
    for fmt in o.FORMAT_NAMES:
        xs = {c["x"] for c in CASES if c["fmt"] == fmt and "scale" not in c
              and "intermediate" not in c}
        values = representable = o.representable_magnitudes(fmt)
        min_sub, fmax = representable[1], representable[-1]
        tie_above = fmax + (values[-1] - values[-2]) / 2
        for v in (0.0, min_sub, min_sub / 2, 1.5 * min_sub, fmax, tie_above, np.inf, -np.inf):
            bits = f"0x{int(np.array([v], np.float32).view(np.uint32)[0]):08X}"
            assert bits in xs, f"{fmt}: no case for {v!r} ({bits})"
        assert any(np.isnan(np.array([int(x, 16)], np.uint32).view(np.float32)[0]) for x in xs)
    assert any("scale" in c for c in CASES) and any("intermediate" in c for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("mode", MODES)
def test_case_vs_quantize(case, mode):
    x = np.array([int(case["x"], 16)], np.uint32).view(np.float32)
    got = int(quantize(x, case["fmt"], preset=mode, **golden.case_knobs(case))[0])
    expected = int(case["expected"][mode], 16)
    assert got == expected, f"{case_id(case)} {mode}: quantize gives 0x{got:02X}, " \
        f"hand-derived 0x{expected:02X} ({case['why']})"


def _oracle_quotient(case) -> np.ndarray:
    """The float32 value that is converted, computed with numpy / ml_dtypes only."""
    x = np.array([int(case["x"], 16)], np.uint32).view(np.float32)
    if "scale" in case:
        x = x / np.array([int(case["scale"], 16)], np.uint32).view(np.float32)
    if case.get("intermediate") == "float16":
        x = x.astype(np.float16).astype(np.float32)
    elif case.get("intermediate") == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hand_derivation_vs_ml_dtypes(case):
    """ml_preset: exactly ml_dtypes. ocp_satfinite: ml_dtypes after a clamp to ±max, except
    that its NaN byte is the canonical one: there only "is a NaN with the input's sign" (or
    the fnuz 0x80) is checked."""
    fmt = case["fmt"]
    q = _oracle_quotient(case)
    ml_expected = int(o.ml_codes(q, fmt)[0])
    assert int(case["expected"]["ml_dtypes"], 16) == ml_expected, (
        f"{case_id(case)}: hand-derived ml_dtypes 0x{int(case['expected']['ml_dtypes'], 16):02X}, "
        f"ml_dtypes gives 0x{ml_expected:02X}")
    sat = int(case["expected"]["ocp_satfinite"], 16)
    if np.isnan(q[0]):
        decoded = np.array([sat], np.uint8).view(o.ML_TYPES[fmt]).astype(np.float32)[0]
        assert np.isnan(decoded), f"{case_id(case)}: 0x{sat:02X} is not a NaN of {fmt}"
        if not o.FNUZ[fmt]:
            assert (sat >> 7) == int(np.signbit(q[0])), f"{case_id(case)}: NaN sign"
    else:
        clamped = int(o.ml_saturating(q, fmt)[0])
        assert sat == clamped, (f"{case_id(case)}: hand-derived ocp_satfinite 0x{sat:02X}, "
                                f"clamped ml_dtypes gives 0x{clamped:02X}")


def test_run_golden_reports_every_format_and_mode():
    results = golden.run_golden()
    names = [r.name for r in results]
    assert names == [f"{fmt} {mode}" for fmt in o.FORMAT_NAMES for mode in MODES]
    assert sum(r.cases for r in results) == 2 * len(CASES)
    assert all(r.failures == 0 for r in results), results
    for name, cases, failures in results:  # plain (name, cases, failures) rows
        assert isinstance(name, str) and cases > 0 and failures == 0


def test_run_golden_counts_failures(tmp_path, monkeypatch):
    doc = json.loads(golden.GOLDEN_PATH.read_bytes())
    doc["cases"][0]["expected"]["ml_dtypes"] = "0x55"
    path = tmp_path / "fp8_golden.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(golden, "GOLDEN_SHA256", golden.file_sha256(path))
    results, failures = golden.check_golden(path)
    assert [(r.name, r.failures) for r in results if r.failures] == [("e4m3fn ml_dtypes", 1)]
    assert failures[0].expected == "0x55" and failures[0].x == doc["cases"][0]["x"]


def test_golden_imports_no_gpu_stack():
    import subprocess
    import sys

    code = ("import sys; import oracle.reference.golden as g; g.run_golden(); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
