"""``oracle report bench-table``, ``bench-goals`` and ``bench-plot`` read a saved bench report: built
here from a small synthetic report, so every figure the output should show follows from the rows.

The numbers are chosen to read at a glance: a cell moves 3 MB (read + written) and the CUDA copy
ceiling is 3000 GB/s, so those bytes take 1 us at the ceiling and a kernel of 2 us runs at 50%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.cli import main

CEILING = 3000.0  # GB/s
BYTES = 1_500_000  # read, and as many written: 3 MB per call
COMMAND = "oracle bench --backend triton,cuda --sizes 64,16384 --mode both --l2 cold --json out.json"


def row(kernel: str, n: int, us: float, mode: str = "graph", l2: str = "cold", device: str = "cuda",
        backend: str = "cuda", same: float | None = 75.0, check: str = "ok", ceiling: float = CEILING) -> dict:
    """One row as oracle bench --json writes it; ``same`` is % of the same-size copy."""
    gbps = 2 * BYTES / (us * 1e-6) / 1e9
    return {"op": "set_mla_kv_buffer", "variant": "bf16", "kernel": kernel, "backend": backend, "device": device,
            "n": n, "us": us, "gbps": gbps, "x_baseline": 1.0, "pct_copy": 100 * gbps / ceiling,
            "bytes_read": BYTES, "bytes_written": BYTES, "samples": 7, "calls_per_sample": 100, "min_us": us,
            "check": check, "timer": "cuda events", "samples_us": [us] * 7, "dropped": 0, "baseline": "",
            "pct_same_copy": same, "mode": mode, "l2": l2}


def gpu_report() -> dict:
    rows = []
    for mode, scale in (("graph", 1.0), ("eager", 10.0)):
        for n in (64, 16384):
            rows += [row("cuda.set_mla_kv_buffer", n, 2.0 * scale, mode),
                     row("triton.set_mla_kv_buffer", n, 4.0 * scale, mode, backend="triton",
                         check="DIFF 12 B" if (mode, n) == ("graph", 64) else "ok"),
                     row("ref:index_put_", n, 8.0 * scale, mode, backend="reference"),
                     row("ref:seed 1-D Triton BLOCK=128", n, 5.0 * scale, mode, backend="reference"),
                     row("peer:sglang.cache_ops", n, 3.0 * scale, mode, backend="peer")]
    rows.append(row("torch.set_mla_kv_buffer", 64, 400.0, "eager", "hot", device="cpu", backend="torch",
                    same=None, ceiling=100.0))
    return {"machine": {"date": "2026-11-25T10:29:45+00:00", "cpu": "Test Xeon", "cpus": 16,
                        "torch": "2.11.0+cu130", "cuda": "NVIDIA H100 80GB HBM3"},
            "copy": {"cpu": {"gbps": 100.0}, "cuda": {"gbps": CEILING}}, "rows": rows, "command": COMMAND,
            "tool": {"name": "kv-oracle", "version": "0.1.0", "git_commit": "0123456789abcdef"}}


def write(tmp_path, report: dict, name: str = "bench.json"):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


def table_of(text: str, title: str | None = None) -> list[list[str]]:
    """The cells of the first Markdown table after the line that starts with ``title`` (or in
    ``text``): the header line first, the separator left out."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) if title else 0
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip("|").split("|")])
    return [table[0], *table[2:]]


def titles(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("**")]


def test_bench_table_prints_the_machine_the_command_and_each_kernel_beside_the_references(tmp_path, capsys):
    assert main(["report", "bench-table", write(tmp_path, gpu_report())]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "NVIDIA H100 80GB HBM3" in first and "torch 2.11.0+cu130" in first and "2026-11-25" in first
    assert "commit 0123456789" in first
    assert f"`{COMMAND}`" in out
    assert [t.split(":")[0] for t in titles(out)] == [  # a table per op, variant and timing
        "**set_mla_kv_buffer [bf16]**, graph, L2 cold", "**set_mla_kv_buffer [bf16]**, eager, L2 cold",
        "**set_mla_kv_buffer [bf16]**, CPU"]
    graph = table_of(out, "**set_mla_kv_buffer [bf16]**, graph, L2 cold")
    assert graph[0] == ["kernel", "N = 64", "N = 16384"]
    cells = {line[0]: line[1:] for line in graph[1:]}
    assert cells["`cuda.set_mla_kv_buffer`"] == ["2.00 (50%)", "2.00 (50%)"]
    assert cells["`triton.set_mla_kv_buffer`"] == ["4.00 (25%) DIFF 12 B", "4.00 (25%)"]  # a failed check shows
    assert cells["`ref:index_put_`"] == ["8.00 (12%)", "8.00 (12%)"]
    assert cells["`ref:seed 1-D Triton BLOCK=128`"] == ["5.00 (20%)", "5.00 (20%)"]
    assert cells["`peer:sglang.cache_ops`"] == ["3.00 (33%)", "3.00 (33%)"]
    # the copy_ of the same bytes: 75% of the kernel's 2 us; the ceiling: 3 MB at 3000 GB/s
    assert cells["copy_ of the same bytes"] == ["1.50 (67%)", "1.50 (67%)"]
    assert cells["the same bytes at the ceiling (3000 GB/s)"] == ["1.00 (100%)", "1.00 (100%)"]
    names = [line[0] for line in graph[1:]]  # the writers first, then the references, the copies last
    assert names.index("`triton.set_mla_kv_buffer`") < names.index("`ref:index_put_`") \
        < names.index("`peer:sglang.cache_ops`") < names.index("copy_ of the same bytes")
    eager = {line[0]: line[1:] for line in table_of(out, "**set_mla_kv_buffer [bf16]**, eager, L2 cold")[1:]}
    assert eager["`cuda.set_mla_kv_buffer`"] == ["20.0 (5%)", "20.0 (5%)"]
    cpu = {line[0]: line[1:] for line in table_of(out, "**set_mla_kv_buffer [bf16]**, CPU")[1:]}
    assert cpu["`torch.set_mla_kv_buffer`"] == ["400.0 (8%)"]  # 3 MB in 400 us against the CPU's 100 GB/s
    assert "copy_ of the same bytes" not in cpu  # this row was timed without one


def test_bench_table_keeps_only_the_timing_asked_for(tmp_path, capsys):
    path = write(tmp_path, gpu_report())
    assert main(["report", "bench-table", path, "--mode", "graph"]) == 0
    shown = titles(capsys.readouterr().out)
    assert shown == ["**set_mla_kv_buffer [bf16]**, graph, L2 cold: us per call (% of the copy ceiling)"]
    assert main(["report", "bench-table", path, "--mode", "eager", "--l2", "hot"]) == 0
    shown = titles(capsys.readouterr().out)
    assert shown == ["**set_mla_kv_buffer [bf16]**, CPU: us per call (% of the copy ceiling)"]
    assert main(["report", "bench-table", path, "--mode", "graph", "--l2", "hot"]) == 2
    err = capsys.readouterr().err
    assert path in err and "--mode graph --l2 hot" in err and "graph/cold" in err


def test_an_older_report_without_mode_reads_as_graph_cold_on_cuda_and_eager_on_the_cpu(tmp_path, capsys):
    report = gpu_report()
    for r in report["rows"]:
        del r["mode"], r["l2"], r["pct_same_copy"]
    report["rows"] = [r for r in report["rows"] if r["us"] < 10 or r["device"] == "cpu"]  # the graph rows
    assert main(["report", "bench-table", write(tmp_path, report)]) == 0
    out = capsys.readouterr().out
    cells = {line[0]: line[1:] for line in table_of(out, "**set_mla_kv_buffer [bf16]**, graph, L2 cold")[1:]}
    assert cells["`cuda.set_mla_kv_buffer`"] == ["2.00 (50%)", "2.00 (50%)"]
    assert "copy_ of the same bytes" not in cells
    assert "**set_mla_kv_buffer [bf16]**, CPU" in out


@pytest.mark.parametrize("command", ["bench-table", "bench-goals", "bench-plot"])
def test_a_missing_file_or_a_report_without_rows_is_an_error_naming_the_path(tmp_path, capsys, command):
    extra = [str(tmp_path / "out.png")] if command == "bench-plot" else []
    missing = str(tmp_path / "nowhere.json")
    assert main(["report", command, missing, *extra]) == 2
    err = capsys.readouterr().err
    assert missing in err and "cannot read" in err
    conformance = write(tmp_path, {"schema_version": 3, "cases": []}, "conformance.json")
    assert main(["report", command, conformance, *extra]) == 2
    err = capsys.readouterr().err
    assert conformance in err and '"rows"' in err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["report", command, str(broken), *extra]) == 2
    assert str(broken) in capsys.readouterr().err


def goal_report(cuda_us: float) -> dict:
    """MLA at N = 16384, eager: the CUDA writer at ``cuda_us``, its unchecked twin at 2 us, the
    seed's writer at 8 us, at a ceiling where 2 us is 50%."""
    report = gpu_report()
    report["rows"] = [row("cuda.set_mla_kv_buffer", 16384, cuda_us, "eager"),
                      row("cuda.set_mla_kv_buffer.unchecked", 16384, 2.0, "eager"),
                      row("ref:seed 1-D Triton BLOCK=128", 16384, 8.0, "eager", backend="reference"),
                      row("cuda.set_mla_kv_buffer", 16384, cuda_us, "graph")]
    return report


def goal_lines(out: str) -> dict:
    table = table_of(out)
    assert table[0] == ["goal", "measured", "target", "met"]
    return {line[0]: line[1:] for line in table[1:]}


def test_bench_goals_judges_the_report_as_a_markdown_table(tmp_path, capsys):
    assert main(["report", "bench-goals", write(tmp_path, goal_report(2.0))]) == 0
    out = capsys.readouterr().out
    lines = goal_lines(out)
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer vs the copy ceiling"] == ["2.0 us, 50%", ">= 85%",
                                                                                     "**no**"]
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer vs the seed's writer (8.0 us)"] == ["4.00x", ">= 2.9x",
                                                                                              "yes"]
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer / cuda.set_mla_kv_buffer.unchecked"] == [
        "1.00x", "<= 1.1x", "yes"]
    met = sum(v[-1] == "yes" for v in lines.values())
    assert f"{met} of {len(lines)} goals met" in out


def test_bench_goals_judge_a_checked_index_writer_against_the_unchecked_twin(tmp_path, capsys):
    report = goal_report(3.0)
    report["rows"].append(row("cuda.set_mla_kv_buffer.checked_index", 16384, 2.4, "eager"))
    assert main(["report", "bench-goals", write(tmp_path, report)]) == 0
    lines = goal_lines(capsys.readouterr().out)
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer.checked_index / cuda.set_mla_kv_buffer.unchecked"] == [
        "1.20x", "<= 1.1x", "**no**"]
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer / cuda.set_mla_kv_buffer.unchecked"] == [
        "1.50x", "<= 1.1x", "**no**"]
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer.checked_index vs the copy ceiling"] == [
        "2.4 us, 42%", ">= 85%", "**no**"]


def test_bench_goals_judge_a_writer_checking_its_index_each_call_against_the_same_twin(tmp_path, capsys):
    """The row of a validating writer timed with check reuse off is judged against the writer's own
    ``.unchecked`` twin at N = 16384, and left out at N <= 64, where no call reuses a check."""
    fresh = "cuda.set_mla_kv_buffer [index checked each call]"
    report = goal_report(2.1)
    report["rows"] += [row(fresh, 16384, 2.6, "eager"), row(fresh, 64, 9.0, "eager"),
                       row("cuda.set_mla_kv_buffer", 64, 8.0, "eager"),
                       row("cuda.set_mla_kv_buffer.unchecked", 64, 7.5, "eager")]
    assert main(["report", "bench-goals", write(tmp_path, report)]) == 0
    lines = goal_lines(capsys.readouterr().out)
    assert lines[f"MLA N=16384 eager: {fresh} / cuda.set_mla_kv_buffer.unchecked"] == ["1.30x", "<= 1.1x", "**no**"]
    assert lines["MLA N=16384 eager: cuda.set_mla_kv_buffer / cuda.set_mla_kv_buffer.unchecked"] == [
        "1.05x", "<= 1.1x", "yes"]
    assert lines[f"MLA N=16384 eager: {fresh} vs the copy ceiling"] == ["2.6 us, 38%", ">= 85%", "**no**"]
    assert "set_mla_kv_buffer [bf16] N=64 eager: cuda.set_mla_kv_buffer - .unchecked" in lines
    assert not [goal for goal in lines if "N=64" in goal and fresh in goal]


def test_bench_goals_judge_the_block_scaled_triton_writer_against_the_ceiling(tmp_path, capsys):
    report = goal_report(2.0)
    for kernel, us in (("triton.reshape_and_cache_block", 1.2), ("triton.reshape_and_cache_block.unchecked", 1.1),
                       ("cpu.reshape_and_cache_block", 1.0)):
        report["rows"].append(dict(row(kernel, 16384, us, "eager", backend=kernel.split(".")[0]),
                                   op="reshape_and_cache_block", variant="nvfp4"))
    assert main(["report", "bench-goals", write(tmp_path, report)]) == 0
    lines = goal_lines(capsys.readouterr().out)
    block = {k: v for k, v in lines.items() if k.startswith("reshape_and_cache_block")}
    assert block == {  # 2 us is 50% of the ceiling
        "reshape_and_cache_block [nvfp4] N=16384 eager: triton.reshape_and_cache_block vs the copy ceiling":
            ["1.2 us, 83%", ">= 80%", "yes"],
        "reshape_and_cache_block [nvfp4] N=16384 eager: triton.reshape_and_cache_block.unchecked vs the copy ceiling":
            ["1.1 us, 91%", ">= 80%", "yes"]}


def test_bench_goals_before_flags_a_graph_regression(tmp_path, capsys):
    before = write(tmp_path, goal_report(2.0), "before.json")
    now = write(tmp_path, goal_report(2.2), "now.json")  # 10% slower in the graph too
    assert main(["report", "bench-goals", now, "--before", before]) == 0
    lines = goal_lines(capsys.readouterr().out)
    assert lines["graph set_mla_kv_buffer [bf16] N=16384: cuda.set_mla_kv_buffer now / before"] == [
        "2.20 / 2.00 us = 1.10x", "<= 1.03x", "**no**"]


def test_bench_goals_refuses_a_report_without_cuda_rows(tmp_path, capsys):
    report = gpu_report()
    report["rows"] = [r for r in report["rows"] if r["device"] == "cpu"]
    del report["copy"]["cuda"]
    path = write(tmp_path, report)
    assert main(["report", "bench-goals", path]) == 2
    err = capsys.readouterr().err
    assert path in err and "no CUDA rows" in err


def test_bench_plot_draws_the_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    assert main(["report", "bench-plot", write(tmp_path, gpu_report()), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert str(out) in capsys.readouterr().out


def test_a_report_the_bench_writes_reads_back_with_its_command_and_commit(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench.json"
    monkeypatch.setattr("sys.argv", ["oracle", "bench", "--backend", "torch", "--op", "quantize_fp8"])
    assert main(["bench", "--backend", "torch", "--op", "quantize_fp8", "--sizes", "1,16", "--repeats", "1",
                 "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["report", "bench-table", str(out)]) == 0
    text = capsys.readouterr().out
    assert "`oracle bench --backend torch --op quantize_fp8`" in text
    commit = saved["tool"]["git_commit"]
    assert commit is None or f"commit {commit[:10]}" in text.splitlines()[0]
    cells = {line[0]: line[1:] for line in table_of(text, "**quantize_fp8 [e4m3fn]**, CPU")[1:]}
    by_n = {r["n"]: r for r in saved["rows"] if r["kernel"] == "torch.quantize_fp8"}
    for n, cell in zip((1, 16), cells["`torch.quantize_fp8`"]):  # the row's median, rounded
        assert float(cell.split()[0]) == pytest.approx(by_n[n]["us"], rel=0.01, abs=0.01)


@pytest.mark.parametrize("args", [["bench-table", "reports/h100-bench.json", "--l2", "cold"],
                                  ["bench-table", "reports/cpu-bench.json"],
                                  ["bench-table", "reports/cpu-block-bench.json"],
                                  ["bench-goals", "reports/h100-bench.json"]])
def test_docs_benchmarks_holds_what_the_commands_print_from_the_committed_reports(args, capsys, monkeypatch):
    """docs/benchmarks.md pastes these commands' output: a report or a formatter that changes
    without the doc being regenerated fails here."""
    root = Path(__file__).parent.parent
    monkeypatch.chdir(root)
    assert main(["report", *args]) == 0
    printed = capsys.readouterr().out.strip()
    doc = (root / "docs" / "benchmarks.md").read_text()
    assert f"oracle report {' '.join(args)}" in doc
    assert printed in doc, f"regenerate docs/benchmarks.md from: oracle report {' '.join(args)}"


def test_a_small_n_gap_is_taken_round_by_round_where_the_rounds_are_known(tmp_path, capsys):
    """A host's slow spells hit whole rounds: here the validating writer was sampled slow in four
    of seven rounds and its twin in three, so their medians lie 9 us apart while each round's
    difference is +0.5 us. Without rounds, and with a sample dropped, the medians are compared."""
    from oracle.bench.goals import gap

    fast_slow = [10.0, 20.0, 10.0, 20.0, 20.0, 10.0, 20.0]
    twin = dict(row("cuda.set_mla_kv_buffer.unchecked", 64, 9.5, "eager"), rounds=list(range(7)),
                samples_us=[x - 0.5 if i != 6 else 9.5 for i, x in enumerate(fast_slow)])
    mine = dict(row("cuda.set_mla_kv_buffer", 64, 20.0, "eager"), rounds=list(range(7)), samples_us=fast_slow)  # medians 20, 9.5
    assert gap(mine, twin) == (0.5, "round by round, 7 rounds")
    assert gap(mine, dict(twin, rounds=[], dropped=1)) == (10.5, "medians")
    # rounds are matched by number, not position: a twin that skipped round 2 is paired in the others
    shifted = dict(twin, rounds=[0, 1, 3, 4, 5, 6, 7], samples_us=[9.5, 19.5, 19.5, 19.5, 9.5, 19.5, 1.0])
    assert gap(mine, shifted) == (0.5, "round by round, 6 rounds")
    report = goal_report(2.0)
    report["rows"] += [mine, twin]
    assert main(["report", "bench-goals", write(tmp_path, report)]) == 0
    lines = goal_lines(capsys.readouterr().out)
    assert lines["set_mla_kv_buffer [bf16] N=64 eager: cuda.set_mla_kv_buffer - .unchecked"] == [
        "+0.50 us (round by round, 7 rounds; medians +10.50)", "<= 1.5 us", "yes"]
