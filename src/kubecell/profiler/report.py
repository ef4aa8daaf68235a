"""``kubecell profile report``: the job history as one HTML page with plots, for the people who size requests.

Three questions, one plot each: what did each job use (its utilization deciles as a bar from p10 to p90, a mark
at the median and whiskers to p0 and p100); how much of what each VC and workload family asked for did it use
(GPU-hours asked against GPU-hours used); and what each family should ask for instead (``recommend``). Then,
where time-sliced pods shared GPUs, how fast each family ran beside each other one (``pairs``), as the
scheduler's co-location rule reads it. Plots are PNG files beside the page (matplotlib, no JavaScript), so the
report can be mailed or archived as a folder.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kubecell.core.model import MILLI_PER_GPU
from kubecell.profiler.history import JobRecord
from kubecell.profiler.pairs import PairSpeed
from kubecell.profiler.recommend import GPU_UTILIZATION, FamilyAdvice, advise

MAX_JOBS_PLOTTED = 40
MAX_GROUPS_PLOTTED = 60
"""VCs, and workload families, in the asked-and-used plot: those that asked the most GPU-hours."""


def gpu_hours(record: JobRecord) -> tuple[float, float] | None:
    """(GPU-hours asked, GPU-hours used) of a job that ran, or None without a duration or a GPU series."""
    util = record.metrics.get(GPU_UTILIZATION)
    seconds = record.seconds
    if util is None or seconds is None or record.gpus_per_pod <= 0:
        return None
    asked = record.pod_count * record.gpus_per_pod * min(record.milli_gpu_per_pod, MILLI_PER_GPU) / MILLI_PER_GPU
    return asked * seconds / 3600.0, _possible(util.mean, record) * record.pod_count * seconds / 3600.0


def _possible(utilization: float, record: JobRecord) -> float:
    """A pod's GPU utilization within what its GPUs could show (0 to one per GPU): the series are what a pod's
    node, or a tenant's own exporter, wrote, and one tenant's 1e18 squashed every other job's bar and cut its
    VC's used GPU-hours."""
    return min(max(utilization, 0.0), float(max(record.gpus_per_pod, 1)))


def _usage_plot(records: Sequence[JobRecord], path: Path) -> bool:
    shown = [r for r in records if GPU_UTILIZATION in r.metrics][:MAX_JOBS_PLOTTED]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(shown) + 1.5))
    for row, record in enumerate(shown):
        d = [_possible(value, record) for value in record.metrics[GPU_UTILIZATION].deciles]
        ax.plot([d[0], d[10]], [row, row], color="0.6", linewidth=1)
        ax.barh(row, d[9] - d[1], left=d[1], height=0.6, color="tab:blue", alpha=0.6)
        ax.plot([d[5]], [row], marker="|", color="black", markersize=10)
    ax.set_yticks(range(len(shown)), [f"{r.namespace}/{r.owner_name}"[:48] for r in shown], fontsize=7)
    ax.set_xlabel("GPU utilization per pod (1.0 = one GPU busy); bar p10-p90, mark p50, line p0-p100")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _asked_used(records: Sequence[JobRecord]) -> dict[str, dict[str, tuple[float, float]]]:
    """By VC and by family: (GPU-hours asked, GPU-hours used)."""
    out: dict[str, dict[str, tuple[float, float]]] = {"VC": {}, "family": {}}
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for record in records:
        hours = gpu_hours(record)
        if hours is None:
            continue
        for kind, name in (("VC", record.vc or "(none)"), ("family", f"{record.namespace}/{record.family}")):
            sums[(kind, name)][0] += hours[0]
            sums[(kind, name)][1] += hours[1]
    for (kind, name), (asked, used) in sorted(sums.items()):
        out[kind][name] = (asked, used)
    return out


def _asked_used_plot(groups: dict[str, dict[str, tuple[float, float]]], path: Path) -> bool:
    """Per kind (VCs, families), the ``MAX_GROUPS_PLOTTED`` that asked the most GPU-hours: a row per group made a
    history of thousands of families one image of hundreds of megabytes."""
    rows = [(f"{kind}: {name}", asked, used) for kind, by in groups.items()
            for name, (asked, used) in sorted(by.items(), key=lambda item: -item[1][0])[:MAX_GROUPS_PLOTTED]]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    positions = range(len(rows))
    ax.barh([p - 0.2 for p in positions], [r[1] for r in rows], height=0.4, label="asked", color="0.7")
    ax.barh([p + 0.2 for p in positions], [r[2] for r in rows], height=0.4, label="used (mean)", color="tab:green")
    ax.set_yticks(list(positions), [r[0][:48] for r in rows], fontsize=7)
    ax.set_xlabel("GPU-hours")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _advice_rows(advice: Sequence[FamilyAdvice]) -> str:
    rows = []
    for item in advice:
        got = item.advice
        asked = f"{item.asked_gpus} x {item.asked_milli} milli"
        share = "—" if got.milli is None else ("whole GPU" if got.whole_gpu else f"{got.milli} milli")
        memory = "—" if got.memory_mib is None else f"{got.memory_mib} MiB"
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in (
            item.namespace, item.family, got.jobs, asked, share, memory, got.reason)) + "</tr>")
    return "\n".join(rows)


def _pair_rows(pairs: Sequence[PairSpeed]) -> str:
    rows = []
    for pair in pairs:
        alone = "—" if pair.busy_alone is None else f"{pair.busy_alone:.0%}"
        speed = "—" if pair.speed is None else f"{pair.speed:.2f}"
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in (
            pair.family, pair.partner, f"{pair.seconds / 3600:.2f}", f"{pair.busy_beside:.0%}", alone, speed,
            pair.why)) + "</tr>")
    return "\n".join(rows)


def write_report(records: Sequence[JobRecord], out: Path, pairs: Sequence[PairSpeed] = ()) -> Path:
    """Write ``index.html`` and its plots under ``out`` (created); return the page's path. ``pairs``: what the
    history says of families that shared a GPU (``pair_speeds``), a table where there are any."""
    out.mkdir(parents=True, exist_ok=True)
    groups = _asked_used(records)
    advice = advise(records)
    parts = [f"<h1>kubecell job history</h1><p>{len(records)} jobs.</p>"]
    # labels are job and family names, a user's to choose: matplotlib would read '$...$' in them as maths,
    # and one it cannot parse would fail every plot of the report
    with plt.rc_context({"text.parse_math": False}):
        usage = _usage_plot(records, out / "usage.png")
        asked_used = _asked_used_plot(groups, out / "asked-used.png")
    if usage:
        parts.append(f"<h2>What jobs used (the {MAX_JOBS_PLOTTED} newest with a GPU series)</h2>"
                     "<img src='usage.png' alt='per-job GPU utilization deciles'>")
    if asked_used:
        parts.append(f"<h2>Asked and used, per VC and workload family (the {MAX_GROUPS_PLOTTED} of each that asked "
                     "the most)</h2>"
                     "<img src='asked-used.png' alt='GPU-hours asked and used'>")
    parts.append("<h2>Recommended requests (per GPU)</h2><table border='1' cellpadding='4'>"
                 "<tr><th>namespace</th><th>family</th><th>jobs</th><th>asked per pod</th><th>share</th>"
                 f"<th>GPU memory</th><th>why</th></tr>{_advice_rows(advice)}</table>")
    if pairs:
        parts.append("<h2>Speed beside a partner on a shared GPU (time-sliced)</h2>"
                     "<p>Busy beside the partner over busy alone, from the pods' own utilization; the scheduler's "
                     "<code>--colocation</code> asks it first (<code>--pair-floor</code>).</p>"
                     "<table border='1' cellpadding='4'><tr><th>family</th><th>beside</th><th>hours together</th>"
                     "<th>busy beside</th><th>busy alone</th><th>speed</th><th>why</th></tr>"
                     f"{_pair_rows(pairs)}</table>")
    problems = [(r, p) for r in records for p in r.problems]
    if problems:
        parts.append("<h2>Series problems</h2><ul>" + "".join(
            f"<li>{html.escape(r.namespace)}/{html.escape(r.owner_name)}: {html.escape(p)}</li>"
            for r, p in problems[:500]) + "</ul>")
    page = out / "index.html"
    # UTF-8 as the page declares, not the locale's encoding: names are any Unicode a user wrote, and an ASCII or
    # cp1252 locale would fail the whole report on one
    page.write_text("<!doctype html><html><head><meta charset='utf-8'><title>kubecell job history</title></head>"
                    "<body>" + "\n".join(parts) + "</body></html>\n", encoding="utf-8")
    return page
