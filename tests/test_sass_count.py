"""benchmarks/sass_count.py: the block-scaled Triton writer compiles for sm_90 on a machine
without a GPU (Triton's bundled ptxas), and the settings the host picks on an H100 (32-bit rows,
hardware fp8, row-only masks) issue fewer instructions than the portable integer path. The
compile runs in a subprocess without TRITON_INTERPRET (which the suite sets: kernels defined for
the interpreter cannot be compiled)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not importable (pip install triton==3.6.0)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import json, sys
sys.path.insert(0, "benchmarks")
import sass_count as sc
out = {}
for fmt in (1, 3):
    for name, speed in (("portable", dict(WIDE=1, HW_FP8=0, WHOLE=0)), ("h100", dict(WIDE=0, HW_FP8=1, WHOLE=1))):
        ops, plain, _ = sc.sass_counts(sc.compile_sm90(fmt, **speed))
        out[f"{fmt} {name}"] = dict(ops)
        out[f"{fmt} {name} plain"] = dict(plain)
print("RESULT " + json.dumps(out))
"""


def test_the_h100_settings_issue_fewer_instructions():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    counts = json.loads(lines[-1][len("RESULT "):])
    for fmt in ("1", "3"):  # MXFP8 e4m3fn, NVFP4
        portable, h100 = counts[f"{fmt} portable"], counts[f"{fmt} h100"]
        assert h100.get("F2FP", 0) > 0 and portable.get("F2FP", 0) == 0  # the hardware conversion, only there
        assert sum(h100.values()) < sum(portable.values())
        assert h100.get("CALL", 0) <= portable.get("CALL", 0)  # 64-bit divisions are library calls
        # the plain path leaves the special-value branch out, and still converts in hardware
        plain = counts[f"{fmt} h100 plain"]
        assert 0.4 * sum(h100.values()) < sum(plain.values()) < 0.9 * sum(h100.values())
        assert plain.get("F2FP", 0) > 0
