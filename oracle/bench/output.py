"""The bench's table and plot."""

from __future__ import annotations


def format_table(rows: list, op: str, variant: str, how: str = "") -> str:
    """The rows (runner.Row) of one op, variant and timing (``how``: "eager, L2 cold", ...) as a
    plain-text table."""
    header = f"{op} [{variant}]" + (f" ({how})" if how else "")
    cols = ("kernel", "N", "us", "GB/s", "x baseline", "% of copy", "% of same-size copy", "check")
    body = [(r.kernel, str(r.n), f"{r.us:.1f}", f"{r.gbps:.2f}",
             "-" if r.x_baseline is None else f"{r.x_baseline:.2f}",
             "-" if r.pct_copy is None else f"{r.pct_copy:.0f}%",
             "-" if r.pct_same_copy is None else f"{r.pct_same_copy:.0f}%", r.check) for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    lines = [header, "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    for b in body:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    panels = list(dict.fromkeys((r["op"], r["variant"]) for r in rows))
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, (op, variant) in zip(axes.flat, panels):
        mine = [r for r in rows if r["op"] == op and r["variant"] == variant
                and (r.get("mode"), r.get("l2")) in (("graph", "cold"), ("eager", "hot"))]
        for kernel in dict.fromkeys(r["kernel"] for r in mine):
            for mode, style in (("graph", "-"), ("eager", ":")):
                pts = sorted((r["n"], r["gbps"]) for r in mine if r["kernel"] == kernel and r.get("mode", "graph") == mode
                             and (r.get("l2") == "cold" or not r["device"].startswith("cuda")))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                            label=kernel + ("" if mode == "graph" or not r["device"].startswith("cuda") else " (eager)"))
        for device, copy in result["copy"].items():
            ax.axhline(copy["gbps"], linestyle="--", color="grey", linewidth=1)
            ax.annotate(f"copy_ ({device})", (1, copy["gbps"]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=7, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (rows)")
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{op} [{variant}]", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    machine = result["machine"]
    fig.suptitle(f"oracle bench: {machine['cpu']}, torch {machine['torch']}, {machine['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
