"""The speed goals of the GPU writers, judged from one saved bench report
(``oracle report bench-goals REPORT.json [--before OLD.json]``).

Every figure comes from the same run, eager and graph-replayed with inputs rotated past the L2
(``oracle bench --mode both --l2 cold``); each goal line says what was measured, the target and
whether it is met. The goals:

- MLA 512+64 bf16, N = 16384, eager: every CUDA and Triton writer at >= 85% of the copy ceiling
  and >= 2.9x the seed's writer; each validating writer <= 1.1x its ``.unchecked`` twin (the
  ``.checked_index`` writers, given an index checked once per input set, too). A validating
  writer is judged twice: as the bench calls it, each input set's index tensor kept, so its
  check is reused (oracle.kernels.check_reuse), and with a check on every call (the rows
  ``<name> [index checked each call]``).
- N = 1, 16, 64, eager: each validating writer within 1.5 us of its ``.unchecked`` twin (the
  difference taken round by round: :func:`gap`) and no slower than plain ``index_put_``.
- store_cache, 2 KiB rows, N = 16384, eager: CUDA and Triton writers at >= 85% of the ceiling.
- reshape_and_cache_flash, auto and e4m3fn, N = 1, 64, 4096, 16384, eager: every writer at least
  as fast as the fastest peer (sglang's and vLLM's Triton writers, ``--peer-file``).
- reshape_and_cache_block (MXFP8 e4m3fn, NVFP4), N = 16384, eager: every Triton writer at >= 80%
  of the copy ceiling (its bytes: sources, index, codes and scale bytes).
- with a report from before: inside CUDA graphs, no writer more than 3% slower than there.

A goal whose rows the report lacks (a size not timed, no peers) is left out, not failed.
"""

from __future__ import annotations

import statistics

WRITER_BACKENDS = ("cuda", "triton")

Goal = tuple  # (goal, measured, target, met): str, str, str, bool


def _rows(report: dict, op: str, variant: str, n: int, mode: str = "eager", l2: str = "cold") -> dict:
    return {r["kernel"]: r for r in report["rows"]
            if (r["op"], r["variant"], r["n"], r["mode"], r["l2"]) == (op, variant, n, mode, l2)}


def _writers(rows: dict) -> dict:
    return {name: r for name, r in rows.items() if r["backend"] in WRITER_BACKENDS}


CHECKED = ".checked_index"  # a validating writer given an index checked beforehand (oracle.kernels.check_index)
# a validating writer timed with check reuse off (oracle.kernels.check_reuse): its index checked on
# every call, as a new index tensor is; eager rows of N > 256 only differ from the writer's own
FRESH = " [index checked each call]"


def _validating(rows: dict) -> list[str]:
    # "cuda.store_cache" and "cuda.store_cache.checked_index" validate; their twin is "cuda.store_cache.unchecked"
    return [name for name in _writers(rows) if name.count(".") == 1 or name.endswith(CHECKED)]


def _twin(name: str) -> str:
    return name.removesuffix(FRESH).removesuffix(CHECKED) + ".unchecked"


PAIRED_FROM = 5  # rounds both rows were sampled in, at least, for a difference taken round by round


def _rounds(row: dict) -> list:
    """The sampling round of each of the row's samples: recorded since the bench did (Sampler);
    in an older report, the sample's position where no sample was dropped (the kernels of a
    cell were sampled round-robin, so the i-th sample of each came from round i); else none."""
    if row.get("rounds"):
        return row["rounds"]
    return list(range(len(row["samples_us"]))) if row.get("samples_us") and not row.get("dropped") else []


def gap(row: dict, twin: dict) -> tuple[float, str]:
    """(how many microseconds ``row`` takes over ``twin``, how that was taken). Round by round
    where both were sampled in at least PAIRED_FROM rounds: the median over those rounds of row's
    sample minus twin's. An eager call at small N is host time, and a host's slow spells (an
    interrupt, another process) last for whole rounds, so two medians taken apart can differ by
    several microseconds that neither kernel caused; the rounds' differences cancel them.
    Otherwise the difference of the medians."""
    twin_at = dict(zip(_rounds(twin), twin.get("samples_us") or ()))
    paired = [mine - twin_at[r] for r, mine in zip(_rounds(row), row.get("samples_us") or ()) if r in twin_at]
    if len(paired) >= PAIRED_FROM:
        return statistics.median(paired), f"round by round, {len(paired)} rounds"
    return row["us"] - twin["us"], "medians"


def goals(report: dict) -> list[Goal]:
    """The goal lines of one report (loaded by saved.load, so every row has ``mode`` and ``l2``).
    Raises ValueError when the report has no CUDA copy ceiling: the goals judge GPU writers."""
    if "cuda" not in report.get("copy", {}):
        raise ValueError("no CUDA rows: the goals judge the GPU writers (run oracle bench on a GPU)")
    out = []
    ceiling = report["copy"]["cuda"]["gbps"]
    mla = _rows(report, "set_mla_kv_buffer", "bf16", 16384)
    seed = next((r for name, r in mla.items() if name.startswith("ref:seed")), None)
    for name, r in sorted(_writers(mla).items()):
        pct = 100 * r["gbps"] / ceiling
        out.append((f"MLA N=16384 eager: {name} vs the copy ceiling", f"{r['us']:.1f} us, {pct:.0f}%", ">= 85%",
                    pct >= 85))
        if seed is not None:
            x = seed["us"] / r["us"]
            out.append((f"MLA N=16384 eager: {name} vs the seed's writer ({seed['us']:.1f} us)", f"{x:.2f}x",
                        ">= 2.9x", x >= 2.9))
    for name in _validating(mla):
        twin = mla.get(_twin(name))
        if twin:
            ratio = mla[name]["us"] / twin["us"]
            out.append((f"MLA N=16384 eager: {name} / {twin['kernel']}", f"{ratio:.2f}x", "<= 1.1x", ratio <= 1.1))
    for op, variant in (("set_mla_kv_buffer", "bf16"), ("store_cache", "bf16"), ("reshape_and_cache_flash", "auto"),
                        ("reshape_and_cache_flash", "e4m3fn")):
        for n in (1, 16, 64):
            rows = _rows(report, op, variant, n)
            put = rows.get("ref:index_put_")
            for name in _validating(rows):
                if name.endswith(FRESH):
                    continue  # at these lengths every call checks its index: the writer's own row
                twin = rows.get(_twin(name))
                if twin:
                    over, how = gap(rows[name], twin)
                    if how != "medians":
                        how += f"; medians {rows[name]['us'] - twin['us']:+.2f}"
                    out.append((f"{op} [{variant}] N={n} eager: {name} - .unchecked", f"{over:+.2f} us ({how})",
                                "<= 1.5 us", over <= 1.5))
                if put:
                    out.append((f"{op} [{variant}] N={n} eager: {name} vs index_put_",
                                f"{rows[name]['us']:.1f} vs {put['us']:.1f} us", "<=", rows[name]["us"] <= put["us"]))
    store = _rows(report, "store_cache", "bf16", 16384)
    for name, r in sorted(_writers(store).items()):
        pct = 100 * r["gbps"] / ceiling
        out.append((f"store_cache N=16384 eager: {name} vs the copy ceiling", f"{r['us']:.1f} us, {pct:.0f}%",
                    ">= 85%", pct >= 85))
    for variant in ("auto", "e4m3fn"):
        for n in (1, 64, 4096, 16384):
            rows = _rows(report, "reshape_and_cache_flash", variant, n)
            peers = {name: r for name, r in rows.items() if name.startswith("peer:")}
            if not peers:
                continue
            best_name, best = min(peers.items(), key=lambda item: item[1]["us"])
            for name, r in sorted(_writers(rows).items()):
                out.append((f"reshape_and_cache_flash [{variant}] N={n} eager: {name} vs {best_name}",
                            f"{r['us']:.1f} vs {best['us']:.1f} us", "<=", r["us"] <= best["us"]))
    for variant in ("mxfp8_e4m3fn", "nvfp4"):
        rows = _rows(report, "reshape_and_cache_block", variant, 16384)
        for name, r in sorted(rows.items()):
            if r["backend"] == "triton":
                pct = 100 * r["gbps"] / ceiling
                out.append((f"reshape_and_cache_block [{variant}] N=16384 eager: {name} vs the copy ceiling",
                            f"{r['us']:.1f} us, {pct:.0f}%", ">= 80%", pct >= 80))
    return out


def graph_regressions(report: dict, before: dict, tolerance: float = 1.03) -> list[Goal]:
    """Inside CUDA graphs, each writer of ``before`` (an earlier report, loaded by saved.load)
    against this report's graph-replayed, cold row of the same op, variant, N and name: at most
    ``tolerance`` times slower. Writers only one report holds are left out."""
    now = {(r["op"], r["variant"], r["n"], r["kernel"]): r for r in report["rows"]
           if (r["mode"], r["l2"]) == ("graph", "cold")}
    out = []
    for r in before["rows"]:
        if (r["mode"], r["l2"]) != ("graph", "cold") or r["backend"] not in WRITER_BACKENDS:
            continue
        mine = now.get((r["op"], r["variant"], r["n"], r["kernel"]))
        if mine is None:
            continue
        ratio = mine["us"] / r["us"]
        out.append((f"graph {r['op']} [{r['variant']}] N={r['n']}: {r['kernel']} now / before",
                    f"{mine['us']:.2f} / {r['us']:.2f} us = {ratio:.2f}x", f"<= {tolerance:.2f}x",
                    ratio <= tolerance))
    return out


def render(lines: list[Goal]) -> str:
    """The goal lines as a Markdown table, then "M of N goals met"."""
    out = ["| goal | measured | target | met |", "| --- | --- | --- | --- |"]
    out += [f"| {goal} | {measured} | {target} | {'yes' if met else '**no**'} |" for goal, measured, target, met in lines]
    return "\n".join(out + ["", f"{sum(met for *_, met in lines)} of {len(lines)} goals met"])
