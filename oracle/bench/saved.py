"""A saved bench report (``oracle bench --json``) read back: loaded with clear errors, older rows
completed, and printed as the Markdown tables of ``oracle report bench-table``.

Reports written before the bench timed CUDA kernels both ways have rows without ``mode`` and
``l2``: their CUDA rows were graph-replayed with inputs rotated past the L2 (graph, cold), their
CPU rows eager with inputs hot, and :func:`load` says so in each row."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from .output import groups, markdown_table
from .runner import Row

_ROW_FIELDS = {f.name for f in fields(Row)}


def load(path) -> dict:
    """The report at ``path``, every row with its ``mode`` and ``l2``. Raises ValueError naming
    the path when the file cannot be read, is not JSON, or holds no bench rows."""
    try:
        report = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the bench report: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list) or not report["rows"]:
        raise ValueError(f"{path}: not a bench report: no \"rows\" (write one with oracle bench --json)")
    rows = []
    for i, row in enumerate(report["rows"]):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: rows[{i}] is not an object")
        cuda = str(row.get("device", "")).startswith("cuda")
        rows.append({"mode": "graph" if cuda else "eager", "l2": "cold" if cuda else "hot", **row})
    return dict(report, rows=rows)


def rows_of(report: dict, path="the report") -> list[Row]:
    """The rows of a loaded report as runner.Row (fields a newer bench added are ignored)."""
    out = []
    for i, row in enumerate(report["rows"]):
        try:
            out.append(Row(**{k: v for k, v in row.items() if k in _ROW_FIELDS}))
        except TypeError as exc:  # a required field is missing
            raise ValueError(f"{path}: rows[{i}] is not a bench row ({exc})") from None
    return out


def header(report: dict) -> list[str]:
    """Where and how the report was made: the machine (GPU or CPU, torch, date), the commit where
    the report records one (reports since the bench did), each device's copy ceiling, and the
    exact command."""
    m = report.get("machine", {})
    cpu = f"{m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs"
    where = f"{m['cuda']} ({cpu})" if m.get("cuda") else cpu
    commit = (report.get("tool") or {}).get("git_commit")
    lines = [f"Machine: {where}, torch {m.get('torch', '?')}, {str(m.get('date', '?'))[:10]}"
             + (f", commit {commit[:10]}." if commit else ".")]
    ceilings = ", ".join(f"{device} {copy['gbps']:.1f} GB/s" for device, copy in report.get("copy", {}).items())
    if ceilings:
        lines.append(f"Copy ceiling (a large copy_, bytes read + written): {ceilings}.")
    lines.append(f"Command: `{report.get('command', 'not recorded')}`")
    return lines


def bench_table(report: dict, mode: str = "both", l2: str = "both", path="the report") -> str:
    """The report as Markdown: :func:`header`, then a table per op, variant and timing
    (output.markdown_table) for the rows timed in ``mode`` (eager, graph or both) with the L2
    ``l2`` (cold, hot or both); CPU rows count as eager and hot. Raises ValueError when no row
    matches."""
    modes = ("eager", "graph") if mode == "both" else (mode,)
    states = ("cold", "hot") if l2 == "both" else (l2,)
    rows = [r for r in rows_of(report, path) if r.mode in modes and r.l2 in states]
    if not rows:
        held = sorted({(r["mode"], r["l2"]) for r in report["rows"]})
        raise ValueError(f"{path}: no row was timed with --mode {mode} --l2 {l2}; the report holds "
                         + ", ".join(f"{m}/{s}" for m, s in held))
    out = [line for h in header(report) for line in (h, "")][:-1]  # a paragraph each in Markdown
    for op, variant, how, group in groups(rows):
        device = "cpu" if how == "CPU" else "cuda"
        try:
            ceiling = report["copy"][device]["gbps"]
        except (KeyError, TypeError):
            raise ValueError(f"{path}: no copy ceiling for {device} (\"copy\": {{\"{device}\": ...}})") from None
        out += ["", f"**{op} [{variant}]**, {how}: us per call (% of the copy ceiling)", "",
                markdown_table(group, ceiling)]
    return "\n".join(out)
