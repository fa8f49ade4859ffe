"""The bench's tables and plot: the plain table ``oracle bench`` prints as it runs, the Markdown
tables ``oracle report bench-table`` makes from a saved report, and the GB/s plot.

Both tables are built from runner.Row objects, grouped by :func:`groups` and laid out by
:func:`render`, so a live run and a saved report read the same way."""

from __future__ import annotations


def render(cols: list[str], body: list[list[str]], markdown: bool = False) -> list[str]:
    """Lines of a table: the first column left-aligned, the others right-aligned (numbers). Plain
    text pads the columns with two spaces between them; Markdown is a pipe table with the same
    alignment."""
    if markdown:
        return ["| " + " | ".join(cols) + " |", "| --- |" + " ---: |" * (len(cols) - 1),
                *("| " + " | ".join(b) + " |" for b in body)]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    return ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths)))
            for line in (cols, *body)]


def groups(rows: list) -> list[tuple[str, str, str, list]]:
    """(op, variant, how, rows) for each table: one per op, variant, device kind and timing, in
    the order the rows first appear. ``how`` says how the rows were timed: "CPU" for CPU rows
    (always eager, inputs hot), "eager, L2 cold" and so on for CUDA rows. CPU and CUDA rows never
    share a table, since their copy ceilings differ."""
    def key(r):
        return r.op, r.variant, r.device.startswith("cuda"), r.mode, r.l2

    out = []
    for op, variant, cuda, mode, l2 in dict.fromkeys(map(key, rows)):
        group = [r for r in rows if key(r) == (op, variant, cuda, mode, l2)]
        out.append((op, variant, f"{mode}, L2 {l2}" if cuda else "CPU", group))
    return out


def format_table(rows: list, op: str, variant: str, how: str = "") -> str:
    """The rows (runner.Row) of one op, variant and timing (``how``: "eager, L2 cold", ...) as a
    plain-text table, one line per kernel and N."""
    header = f"{op} [{variant}]" + (f" ({how})" if how else "")
    cols = ["kernel", "N", "us", "GB/s", "x baseline", "% of copy", "% of same-size copy", "check"]
    body = [[r.kernel, str(r.n), f"{r.us:.1f}", f"{r.gbps:.2f}",
             "-" if r.x_baseline is None else f"{r.x_baseline:.2f}",
             "-" if r.pct_copy is None else f"{r.pct_copy:.0f}%",
             "-" if r.pct_same_copy is None else f"{r.pct_same_copy:.0f}%", r.check] for r in rows]
    return "\n".join([header, *render(cols, body)])


# Where a kernel's line goes in a Markdown table: the writers under test first, then the torch
# baselines, plain index_put_ and the seed's writer ("ref:"), the peers ("peer:").
def _rank(r) -> tuple:
    if r.kernel.startswith("peer:"):
        return 3, r.kernel
    if r.kernel.startswith("ref:"):
        return 2, r.kernel
    return (1 if r.backend == "torch" else 0), r.kernel


def _us(us: float) -> str:
    # graph-replayed small writes take 1-3 us, CPU writes of 16384 rows milliseconds
    # (and the ceiling's time for a row's bytes well under a microsecond: two significant digits)
    if us < 0.1:
        return f"{us:.2g}"
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def markdown_table(rows: list, ceiling_gbps: float) -> str:
    """One group's rows (runner.Row: one op, variant, device and timing) as a Markdown table: a
    line per kernel, a column per N, each cell "us (% of the copy ceiling)", a failed byte check
    appended to its cell. Two lines close it, both derived from the cell's own bytes: the copy_ of
    the same bytes timed beside the kernels (when the report has it) and the time those bytes take
    at the copy ceiling (``ceiling_gbps``, bytes read + written)."""
    sizes = sorted({r.n for r in rows})
    cells: dict[str, dict[int, str]] = {}
    for r in sorted(rows, key=_rank):
        cell = f"{_us(r.us)} ({r.pct_copy:.0f}%)" if r.pct_copy is not None else _us(r.us)
        if r.check not in ("ok", "baseline"):
            cell += f" {r.check}"
        cells.setdefault(f"`{r.kernel}`", {})[r.n] = cell
    same, ceiling = {}, {}
    for r in rows:
        if r.pct_same_copy and r.pct_copy is not None:  # the same-size copy's time and % of ceiling
            same.setdefault(r.n, f"{_us(r.us * r.pct_same_copy / 100)} ({r.pct_copy * 100 / r.pct_same_copy:.0f}%)")
        ceiling.setdefault(r.n, f"{_us((r.bytes_read + r.bytes_written) / ceiling_gbps / 1e3)} (100%)")
    if same:
        cells["copy_ of the same bytes"] = same
    cells[f"the same bytes at the ceiling ({ceiling_gbps:.4g} GB/s)"] = ceiling
    body = [[name, *(line.get(n, "-") for n in sizes)] for name, line in cells.items()]
    return "\n".join(render(["kernel", *(f"N = {n}" for n in sizes)], body, markdown=True))


def plot(result: dict, path: str) -> None:
    """GB/s against N, a panel per op and variant, a colour per kernel: CUDA kernels graph-replayed
    (solid) and eager (dotted), inputs cold where the report has cold rows; CPU kernels as timed
    (solid). ``result`` is a report as ``oracle bench --json`` writes it, every row with its mode
    and l2 (saved.load fills them in for older reports)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    panels = list(dict.fromkeys((r["op"], r["variant"]) for r in rows))
    cols = min(2, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(8.5 * cols, 4.2 * nrows), squeeze=False)
    most = max(len({r["kernel"] for r in rows if (r["op"], r["variant"]) == panel}) for panel in panels)
    colours = plt.get_cmap("tab10" if most <= 10 else "tab20").colors  # tab10 contrasts more
    for ax, (op, variant) in zip(axes.flat, panels):
        mine = [r for r in rows if (r["op"], r["variant"]) == (op, variant)]
        cold = any(r["l2"] == "cold" for r in mine)  # plot the cold rows where there are any
        for i, kernel in enumerate(dict.fromkeys(r["kernel"] for r in mine)):
            theirs = [r for r in mine if r["kernel"] == kernel]
            on_cuda = theirs[0]["device"].startswith("cuda")
            label = kernel  # on the kernel's first line only: its colour names it
            for mode in ("graph", "eager"):
                pts = sorted((r["n"], r["gbps"]) for r in theirs
                             if r["mode"] == mode and (r["l2"] == "cold" or not (on_cuda and cold)))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ":" if on_cuda and mode == "eager" else "-",
                            marker=".", color=colours[i % len(colours)], label=label)
                    label = None
        for device, copy in result["copy"].items():
            ax.axhline(copy["gbps"], linestyle="--", color="grey", linewidth=1)
            ax.annotate(f"copy_ ({device})", (0, copy["gbps"]), xycoords=("axes fraction", "data"),
                        ha="left", va="bottom", fontsize=7, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (rows)")
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{op} [{variant}]", fontsize=9)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    machine = result["machine"]
    cuda = any(r["device"].startswith("cuda") for r in rows)
    fig.suptitle(f"oracle bench: {machine.get('cuda') or machine['cpu']}, torch {machine['torch']}, "
                 f"{machine['date'][:10]}" + ("; CUDA: graph-replayed solid, eager dotted, inputs cold" if cuda else ""),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
