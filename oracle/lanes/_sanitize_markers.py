"""pytest plug-in used under compute-sanitizer (``-p oracle.lanes._sanitize_markers``):
writes one unbuffered marker line to stdout when each test starts and ends, so the sanitizer's
reports, which share the output stream, can be attributed to the test that was running."""

from __future__ import annotations

import os
import sys

START = "@@kv-oracle-sanitize start "
END = "@@kv-oracle-sanitize end "


def _mark(text: str) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.write(1, (text + "\n").encode("utf-8", "replace"))


def pytest_runtest_logstart(nodeid, location):
    _mark(START + nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _mark(END + nodeid)
