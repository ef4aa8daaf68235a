"""Writes a dynamic run's results: summary.json, jobs.csv, timeseries.csv, plots and an index.html.

``summary.json`` is the machine-readable record (one object per policy: ``policy``, ``overall``,
``per_vc`` with the sharing anomaly, ``seconds``); ``jobs.csv`` lets anyone recompute any figure from
the per-job records (policy ``private`` rows are the per-VC private-cluster baselines); the plots show
what a table hides: when the cluster was busy, and which tenants held more or less than their guarantee.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kubecell.sim.cells import spreadsheet_text
from kubecell.sim.dynamic.metrics import PolicyMetrics
from kubecell.sim.dynamic.private import PrivateBaseline
from kubecell.sim.dynamic.simulator import JobRecord, SimulationResult
from kubecell.sim.figures import plain_text

JOB_COLUMNS = ("policy", "name", "vc", "gpus", "members", "priority", "submit_s", "first_start_s", "finish_s",
               "queueing_delay_s", "jct_s", "preemptions", "failures", "rejected", "first_class",
               "within_guarantee", "lost_gpu_seconds")
PRIVATE = "private"


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else round(value, 3)
    return spreadsheet_text(value) if isinstance(value, str) else value


def write_summary(out: Path, metrics: Sequence[PolicyMetrics], meta: Mapping[str, object],
                  private: Mapping[str, Mapping[str, Any]]) -> Path:
    """summary.json (one object per policy), private.json (the baselines) and run.json (the inputs)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps([m.as_dict() for m in metrics], indent=2) + "\n", encoding="utf-8")
    (out / "private.json").write_text(json.dumps(dict(private), indent=2) + "\n", encoding="utf-8")
    (out / "run.json").write_text(json.dumps(dict(meta), indent=2, default=str) + "\n", encoding="utf-8")
    return path


def _job_row(policy: str, record: JobRecord) -> list[object]:
    return [policy, record.name, record.vc, record.gpus, record.members, record.priority, record.submit,
            record.first_start, record.finish, record.queueing_delay, record.completion_time, record.preemptions,
            record.failures, record.rejected, record.first_class, int(record.within_guarantee),
            record.lost_gpu_seconds]


def write_jobs(out: Path, results: Sequence[SimulationResult], baselines: Mapping[str, PrivateBaseline]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "jobs.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(JOB_COLUMNS)
        for result in results:
            for record in sorted(result.records, key=lambda r: (r.submit, r.name)):
                writer.writerow([_cell(v) for v in _job_row(result.policy, record)])
        for baseline in baselines.values():
            for record in sorted(baseline.result.records, key=lambda r: (r.submit, r.name)):
                writer.writerow([_cell(v) for v in _job_row(PRIVATE, record)])
    return path


def write_timeseries(out: Path, results: Sequence[SimulationResult]) -> Path:
    """Per policy, per sample, per VC: GPUs held by class (the data behind the plots)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeseries.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "hours", "allocated_gpus", "pending_jobs", "vc", "guaranteed_gpus",
                         "guaranteed_used_gpus", "borrowed_gpus", "opportunistic_gpus"])
        for result in results:
            for sample in result.samples:
                hours = round((sample.time - result.start) / 3600.0, 4)
                for vc, (used, borrowed, opportunistic) in sample.per_vc.items():
                    writer.writerow([result.policy, hours, sample.allocated_milli / 1000, sample.pending,
                                     spreadsheet_text(vc),
                                     result.guaranteed_gpus.get(vc, 0), used, borrowed, opportunistic])
    return path


def _days(result: SimulationResult) -> list[float]:
    return [(s.time - result.start) / 86_400.0 for s in result.samples]


@plain_text
def plot_utilisation(out: Path, results: Sequence[SimulationResult]) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4))
    for result in results:
        ax.plot(_days(result), [s.allocated_milli / 1000 for s in result.samples], linewidth=1.2,
                label=f"{result.policy} ({result.utilisation:.0%} time-averaged)")
    if results:
        ax.axhline(results[0].total_gpus, color="grey", linestyle=":", linewidth=1, label="cluster GPUs")
    ax.set(xlabel="Simulated time (days)", ylabel="Allocated GPUs", title="GPUs allocated over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "utilisation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@plain_text
def plot_allocation_by_vc(out: Path, results: Sequence[SimulationResult]) -> Path | None:
    """One panel per VC: GPUs held (solid: all classes; dotted: inside the guarantee) per policy,
    against the guarantee (dashed)."""
    if not results:
        return None
    vcs = list(results[0].guaranteed_gpus)
    if not vcs:
        return None
    columns = min(3, len(vcs))
    rows = math.ceil(len(vcs) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 2.9 * rows), squeeze=False, sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, vc in enumerate(vcs):
        ax = axes[index // columns][index % columns]
        for number, result in enumerate(results):
            colour = colours[number % len(colours)]
            held = [sum(s.per_vc.get(vc, (0.0, 0.0, 0.0))) for s in result.samples]
            inside = [s.per_vc.get(vc, (0.0, 0.0, 0.0))[0] for s in result.samples]
            ax.plot(_days(result), held, color=colour, linewidth=1.1, label=result.policy)
            ax.plot(_days(result), inside, color=colour, linewidth=0.8, linestyle=":")
        ax.axhline(results[0].guaranteed_gpus[vc], color="black", linestyle="--", linewidth=0.9, label="guarantee")
        ax.set_title(f"VC {vc}", fontsize=9)
        ax.grid(alpha=0.3)
        if index % columns == 0:
            ax.set_ylabel("GPUs")
        if index == 0:
            ax.legend(fontsize=7)
    for index in range(len(vcs), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("days")
    fig.suptitle("GPUs held per VC (solid: all; dotted: within guarantee) vs guarantee (dashed)", fontsize=10)
    fig.tight_layout()
    path = out / "allocation_by_vc.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@plain_text
def plot_queueing_delay(out: Path, metrics: Sequence[PolicyMetrics],
                        private: Mapping[str, Mapping[str, Any]]) -> Path | None:
    """Per VC: mean queueing delay of within-guarantee jobs per policy, next to the private cluster."""
    if not metrics:
        return None
    vcs = [vc for vc in metrics[0].per_vc if vc in private]
    if not vcs:
        return None
    series: list[tuple[str, list[float]]] = []
    for m in metrics:
        series.append((m.policy, [m.per_vc[vc]["within_guarantee_queueing_delay_minutes"]["mean"] or 0.0
                                  for vc in vcs]))
    series.append(("private cluster", [private[vc]["queueing_delay_minutes"]["mean"] or 0.0 for vc in vcs]))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(vcs) + 2), 4))
    for number, (label, values) in enumerate(series):
        positions = [i + (number - (len(series) - 1) / 2) * width for i in range(len(vcs))]
        ax.bar(positions, values, width=width, label=label, color="grey" if label == "private cluster" else None)
    ax.set_xticks(range(len(vcs)), vcs)
    ax.set(xlabel="Virtual cluster", ylabel="Mean queueing delay (minutes)",
           title="Within-guarantee jobs: queueing delay per policy vs private cluster")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "queueing_delay.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(out: Path, results: Sequence[SimulationResult], metrics: Sequence[PolicyMetrics],
                private: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_utilisation(out, results), plot_allocation_by_vc(out, results),
             plot_queueing_delay(out, metrics, private)]
    return [p for p in paths if p is not None]


def _fact(value: object) -> str:
    if isinstance(value, list | tuple):
        return "<ul>" + "".join(f"<li>{html.escape(str(item))}</li>" for item in value) + "</ul>"
    return html.escape(str(value))


def _times100(value: object) -> object:
    return value * 100 if isinstance(value, float) else value


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def write_html(out: Path, metrics: Sequence[PolicyMetrics], private: Mapping[str, Mapping[str, Any]],
               meta: Mapping[str, object], plots: Sequence[Path]) -> Path:
    """A self-contained page: the per-policy table, the per-VC comparison table and the plots."""
    policy_rows = []
    for m in metrics:
        o = m.overall
        policy_rows.append(
            f"<tr><td>{html.escape(m.policy)}</td><td>{o['gpu_utilisation'] * 100:.1f}</td>"
            f"<td>{_fmt(_times100(o['gpu_utilisation_until_last_arrival']))}</td>"
            f"<td>{_fmt(o['jct_hours']['mean'], 2)}</td><td>{_fmt(o['queueing_delay_minutes']['mean'])}</td>"
            f"<td>{_fmt(o['queueing_delay_minutes']['p95'])}</td>"
            f"<td>{_fmt(o['within_guarantee_queueing_delay_minutes']['mean'])}</td>"
            f"<td>{o['gangs_broken']}</td><td>{o['preemptions_per_job']['max']}</td>"
            f"<td>{_fmt(o['gpu_hours_lost_to_preemption'])}</td><td>{o['rejected']}</td><td>{o['unfinished']}</td>"
            f"<td>{m.seconds:.1f}</td></tr>")
    vcs = list(metrics[0].per_vc) if metrics else []
    head = "".join(f"<th>{html.escape(m.policy)}: delay (min)</th><th>{html.escape(m.policy)}: anomaly (min)</th>"
                   for m in metrics)
    vc_rows = []
    for vc in vcs:
        first = metrics[0].per_vc[vc]
        base = private.get(vc)
        cells = "".join(
            f"<td>{_fmt(m.per_vc[vc]['within_guarantee_queueing_delay_minutes']['mean'])}</td>"
            f"<td>{_fmt(m.per_vc[vc]['sharing_anomaly_minutes'])}</td>" for m in metrics)
        private_delay = _fmt(base["queueing_delay_minutes"]["mean"]) if base else "n/a"
        vc_rows.append(f"<tr><td>{html.escape(vc)}</td><td>{first['guaranteed_gpus']}</td><td>{first['jobs']}</td>"
                       f"<td>{private_delay}</td>{cells}</tr>")
    images = "".join(f'<p><img src="{p.name}" alt="{p.stem}" style="max-width:100%"></p>' for p in plots)
    facts = "".join(f"<li><b>{html.escape(str(k))}</b>: {_fact(v)}</li>" for k, v in meta.items()
                    if k not in ("command", "directory"))
    reproduce = ""
    if meta.get("command"):
        where = f" in <code>{html.escape(str(meta['directory']))}</code>" if meta.get("directory") else ""
        reproduce = f"<h2>Reproduce</h2><p>Run{where}:</p><pre>{html.escape(str(meta['command']))}</pre>"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kubecell dynamic simulation</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
pre{{background:#f4f4f4;padding:.6em;white-space:pre-wrap}}</style>
</head><body><h1>kubecell dynamic simulation</h1>{reproduce}<h2>Inputs</h2><ul>{facts}</ul>
<h2>Per tenancy preset</h2>
<p>n/a marks a figure this run could not measure: a mean JCT when no job finished, a delay when no job
started, utilisation until the last arrival when every job arrived at once, a private delay or anomaly for a
VC without jobs (no private run) or without a within-guarantee job that started in both runs.</p>
<table><tr><th>tenancy preset</th><th>GPU utilisation %</th><th>until the last arrival %</th>
<th>mean JCT (h)</th><th>mean delay (min)</th>
<th>p95 delay (min)</th><th>within-guarantee mean delay (min)</th><th>gangs broken</th><th>max preemptions</th>
<th>GPU h lost to preemption</th><th>rejected</th><th>unfinished</th><th>seconds</th></tr>
{''.join(policy_rows)}</table>
<h2>Per virtual cluster: sharing anomaly</h2>
<p>Delay = mean queueing delay of the VC's within-guarantee jobs. Anomaly = that delay minus the same jobs'
delay on a private cluster made of exactly the VC's guaranteed cells (positive: sharing hurt the tenant).</p>
<table><tr><th>VC</th><th>guaranteed GPUs</th><th>jobs</th><th>private cluster: delay (min)</th>{head}</tr>
{''.join(vc_rows)}</table>
{images}
<p>Files: summary.json, private.json, jobs.csv, timeseries.csv, run.json. Trace-to-job mapping and its
assumptions: docs/dynamic.md.</p>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
