"""benchmarks/stability.py's comparison: which reruns it calls different, on hand-made reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "stability.py"


@pytest.fixture(scope="module")
def stability():
    spec = importlib.util.spec_from_file_location("stability", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case(nodeid, status="pass", case_id="bf16-int32", seconds=0.01, cause=None, message=""):
    return {"nodeid": nodeid, "status": status, "case_id": case_id, "seconds": seconds,
            "cause": {"id": cause, "text": "", "class": "", "also": []} if cause else None,
            "message": message}


def test_times_do_not_count_but_status_case_cause_and_message_do(stability):
    base = [case("a"), case("b", "fail", cause="scale_missing", message="slot 3 differs"),
            case("t::p[k]", case_id="N12")]
    same_but_slower = [dict(c, seconds=c["seconds"] * 9) for c in base]
    runs = [stability.case_outcomes({"cases": cases}) for cases in (base, same_but_slower)]
    assert stability.differences(runs) == {}

    changed = [case("a", "not supported"), case("b", "fail", cause="scale_inverted", message="slot 3 differs"),
               case("t::p[k]", case_id="N13")]  # a property test that drew another last example
    runs.append(stability.case_outcomes({"cases": changed}))
    found = stability.differences(runs)
    assert sorted(found) == ["a", "b", "t::p[k]"]
    assert [o[0] for o in found["a"]] == ["pass", "pass", "not supported"]
    assert [o[2] for o in found["b"]] == ["scale_missing", "scale_missing", "scale_inverted"]
    assert [o[1] for o in found["t::p[k]"]] == ["N12", "N12", "N13"]


def test_a_case_missing_from_one_run_is_a_difference(stability):
    runs = [{"a": ("pass",), "b": ("pass",)}, {"a": ("pass",)}, {"a": ("pass",), "b": ("pass",)}]
    assert stability.differences(runs) == {"b": [("pass",), None, ("pass",)]}


def test_junit_outcomes(stability, tmp_path):
    xml = tmp_path / "run.xml"
    xml.write_text("""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
 <testcase classname="test_swa_pool" name="test_machine[cpu]" time="3.2"/>
 <testcase classname="test_kernels" name="test_store_cache[k][c]" time="0.1"><skipped message="n/s"/></testcase>
 <testcase classname="test_kernels" name="test_store_cache[k][d]" time="0.1"><failure message="x">x</failure></testcase>
 <testcase classname="test_selfcheck" name="test_golden" time="0.1"><error message="e">e</error></testcase>
</testsuite></testsuites>""")
    assert stability.junit_outcomes(xml) == {
        "junit:test_swa_pool::test_machine[cpu]": "passed",
        "junit:test_kernels::test_store_cache[k][c]": "skipped",
        "junit:test_kernels::test_store_cache[k][d]": "failure",
        "junit:test_selfcheck::test_golden": "error",
    }
