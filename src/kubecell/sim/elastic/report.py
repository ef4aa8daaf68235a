"""Writes an elastic run's report: summary.json, jobs.csv, the plots and an index.html.

The plots show what Table 3's averages hide: the JCT distribution per policy (a CDF per trace family: do
short jobs wait behind long ones?) and how many GPUs each running job holds over time (an elastic policy
spreads and shrinks jobs with the load; the rigid baseline holds each job's TunedJobs size throughout).
"""

from __future__ import annotations

import csv
import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kubecell.sim.cells import spreadsheet_text
from kubecell.sim.elastic.metrics import FAMILY_KEYS, PAPER_TABLE3, PAPER_TRACE, RUN_KEYS, Figures
from kubecell.sim.elastic.runner import ElasticRun, write_summary
from kubecell.sim.elastic.simulator import SimulationResult
from kubecell.sim.figures import plain_text

JOB_COLUMNS = ("policy", "workload", "name", "application", "submitted_s", "num_replicas", "batch_size",
               "first_start_s", "completion_s", "jct_s", "restarts", "gpu_hours", "restart_gpu_hours", "max_gpus")


def _round(value: float | None, digits: int = 3) -> object:
    return "" if value is None else round(value, digits)


def write_jobs(out: Path, results: Sequence[SimulationResult]) -> Path:
    """One row per policy, workload and job: every figure can be recomputed from it."""
    path = out / "jobs.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(JOB_COLUMNS)
        for result in results:
            for r in result.records:
                writer.writerow([result.policy, spreadsheet_text(result.workload), spreadsheet_text(r.name),
                                 spreadsheet_text(r.application), _round(r.submitted),
                                 r.num_replicas, r.batch_size, _round(r.first_start), _round(r.completion),
                                 _round(r.jct), r.restarts, _round(r.gpu_seconds / 3600, 4),
                                 _round(r.restart_gpu_seconds / 3600, 4), r.max_gpus])
    return path


def _by_family(results: Sequence[SimulationResult]) -> dict[str, dict[str, list[SimulationResult]]]:
    grouped: dict[str, dict[str, list[SimulationResult]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        grouped[result.family][result.policy].append(result)
    return grouped


@plain_text
def plot_jct_cdf(out: Path, results: Sequence[SimulationResult]) -> Path | None:
    """Per family, the CDF of job completion times of each policy (all its workloads pooled)."""
    grouped = _by_family(results)
    if not grouped:
        return None
    fig, axes = plt.subplots(1, len(grouped), figsize=(5.2 * len(grouped), 3.8), squeeze=False)
    for ax, (family, by_policy) in zip(axes[0], grouped.items(), strict=True):
        for policy, runs in by_policy.items():
            hours = sorted(jct / 3600 for result in runs for r in result.records if (jct := r.jct) is not None)
            if hours:
                ax.step(hours, [(i + 1) / len(hours) for i in range(len(hours))], where="post", label=policy)
        ax.set_xscale("log")
        ax.set(xlabel="job completion time (hours, log scale)", ylabel="fraction of jobs",
               title=f"{family} ({PAPER_TRACE.get(family, family)}): JCT CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "jct_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@plain_text
def plot_gpus_per_job(out: Path, results: Sequence[SimulationResult]) -> Path | None:
    """Per family (its first workload): GPUs allocated, and GPUs per running job, over time, per policy."""
    grouped = _by_family(results)
    if not grouped:
        return None
    fig, axes = plt.subplots(2, len(grouped), figsize=(5.2 * len(grouped), 6.0), squeeze=False, sharex="col")
    for column, by_policy in enumerate(grouped.values()):
        top, bottom = axes[0][column], axes[1][column]
        shown = ""
        for policy, runs in by_policy.items():
            result = runs[0]
            shown = result.workload
            hours = [s.time / 3600 for s in result.samples]
            top.plot(hours, [s.allocated_gpus for s in result.samples], linewidth=1, label=policy)
            bottom.plot(hours, [s.allocated_gpus / s.running_jobs if s.running_jobs else 0.0 for s in result.samples],
                        linewidth=1, label=policy)
            top.axhline(result.total_gpus, color="grey", linestyle=":", linewidth=1)
        top.set(ylabel="GPUs allocated", title=f"{shown}: GPUs allocated (dotted: cluster)")
        bottom.set(xlabel="simulated hours", ylabel="GPUs per running job", title=f"{shown}: GPUs per running job")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "gpus_per_job.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}"
    return html.escape(str(value))


def _table(rows: Sequence[Mapping[str, object]], keys: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(key)}</th>" for key in keys)
    body = "".join("<tr>" + "".join(f"<td>{_cell(row.get(key))}</td>" for key in keys) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def paper_rows(family: str) -> list[Figures]:
    """Sia's Table 3 rows of one family, shaped like our family figures (policy named ``paper: ...``)."""
    rows: list[Figures] = []
    for policy, figures in PAPER_TABLE3.get(family, {}).items():
        rows.append({"policy": f"paper: {policy}", "family": family, **figures})
    return rows


def write_html(out: Path, run: ElasticRun, meta: Mapping[str, object], plots: Sequence[Path]) -> Path:
    family_rows: list[Mapping[str, object]] = []
    for family, by_policy in run.families.items():
        family_rows.extend(by_policy.values())
        family_rows.extend(paper_rows(family))
    images = "".join(f'<p><img src="{p.name}" alt="{p.stem}" style="max-width:100%"></p>' for p in plots)
    command = html.escape(str(meta.get("command", "")))
    where = html.escape(str(meta.get("directory", "")))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kubecell elastic simulation</title>
<style>body{{font-family:sans-serif;max-width:1400px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
pre{{background:#f4f4f4;padding:.6em;white-space:pre-wrap}}</style>
</head><body><h1>kubecell elastic simulation: the Pollux/Sia job model</h1>
<h2>Reproduce</h2><p>Run in <code>{where}</code>:</p><pre>{command}</pre>
<h2>Per trace family (Sia Table 3 figures; "paper:" rows are Sia's published ones)</h2>
{_table(family_rows, FAMILY_KEYS)}
<h2>Per workload</h2>
{_table(run.runs, RUN_KEYS)}
{images}
<p>Files: summary.json, jobs.csv. The job model, its sources and its departures from Sia's simulator:
docs/elastic.md.</p>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def write_report(out: Path, run: ElasticRun, meta: Mapping[str, object]) -> Path:
    """Everything in ``out``; returns the index page."""
    out.mkdir(parents=True, exist_ok=True)
    write_summary(out, run, meta)
    write_jobs(out, run.results)
    plots = [p for p in (plot_jct_cdf(out, run.results), plot_gpus_per_job(out, run.results)) if p is not None]
    return write_html(out, run, meta, plots)
