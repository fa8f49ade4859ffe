"""The reference is the part a vendor reads and trusts: it must run with numpy and ml_dtypes alone."""

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent("""
    import importlib.abc, pkgutil, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    import oracle.reference
    for info in pkgutil.walk_packages(oracle.reference.__path__, "oracle.reference."):
        __import__(info.name)
    import oracle.reference.golden as golden
    assert not any(r.failures for r in golden.run_golden())
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton"))
    assert not leaked, leaked
    print("ok", len([m for m in sys.modules if m.startswith("oracle.reference")]))
""")


def test_reference_imports_without_torch_or_triton():
    done = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


def test_blocker_really_blocks_torch():
    """Guards the test above: the finder must make torch unimportable, or it proves nothing."""
    probe = BLOCKER.split("import oracle.reference")[0] + textwrap.dedent("""
        try:
            import torch
        except ImportError as exc:
            print("blocked", exc)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "blocked" in done.stdout, done.stdout + done.stderr
