import subprocess
import sys

import oracle


def run(*args):
    return subprocess.run([sys.executable, "-m", "oracle", *args], capture_output=True, text=True,
                          timeout=120)


def test_version():
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"kv-oracle {oracle.__version__}"


def test_selfcheck_prints_table_and_passes():
    done = run("selfcheck")
    assert done.returncode == 0, done.stdout + done.stderr
    for fmt in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "mxfp8 e4m3fn ocp_mx_v1", "mxfp8 e5m2 rceil",
                "nvfp4 nvfp4_ref", "nvfp4 nvfp4_prescaled"):
        assert fmt in done.stdout
    assert "FAIL" not in done.stdout
    assert "golden fp8, MXFP8 and NVFP4 vectors agree with the reference" in done.stdout


def test_no_command_prints_help_and_fails():
    done = run()
    assert done.returncode == 2
    assert "selfcheck" in done.stdout
