"""Writes the packing experiment's results: summary.json, curves.csv and figures like the paper's.

``allocation.png`` is comparable to Fig. 9(a) (allocated GPU % vs arrived workload); ``fragmentation.png``
to Fig. 7 (fragmentation amount and ratio vs arrived workload). Lines are means over seeds, bands
one standard deviation.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from kubecell.sim.packing.metrics import ARRIVED_PCT, PolicySummary, Stat

METRICS = ("allocated_pct", "unallocated_pct", "frag_amount_pct", "frag_ratio_pct")


def _number(value: float) -> str:
    return "" if value != value else f"{value:.4f}"  # NaN -> empty cell


def write_summary(out: Path, summaries: Sequence[PolicySummary], meta: Mapping[str, object]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps([s.as_dict() for s in summaries], indent=2) + "\n", encoding="utf-8")
    (out / "run.json").write_text(json.dumps(dict(meta), indent=2, default=str) + "\n", encoding="utf-8")
    return path


def write_curves(out: Path, summaries: Sequence[PolicySummary]) -> list[Path]:
    """Per-seed curves (curves.csv) and their mean and SD per policy (curves_mean.csv)."""
    out.mkdir(parents=True, exist_ok=True)
    per_seed = out / "curves.csv"
    with per_seed.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "seed", "arrived_pct", *METRICS])
        for summary in summaries:
            for run in summary.runs:
                columns = [getattr(run, m) for m in METRICS]
                for i, x in enumerate(ARRIVED_PCT):
                    writer.writerow([summary.policy, run.seed, int(x), *(_number(c[i]) for c in columns)])
    mean_path = out / "curves_mean.csv"
    with mean_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "arrived_pct", *(f"{m}_{k}" for m in METRICS for k in ("mean", "sd"))])
        for summary in summaries:
            stats = [summary.mean_curve(m) for m in METRICS]
            for i, x in enumerate(ARRIVED_PCT):
                row = [summary.policy, int(x)]
                for mean, sd in stats:
                    row += [_number(mean[i]), _number(sd[i])]
                writer.writerow(row)
    return [per_seed, mean_path]


def _band(ax: Axes, summary: PolicySummary, metric: str) -> None:
    mean, sd = summary.mean_curve(metric)
    line = ax.plot(ARRIVED_PCT, mean, label=summary.policy, linewidth=1.6)[0]
    ax.fill_between(ARRIVED_PCT, mean - sd, mean + sd, color=line.get_color(), alpha=0.18, linewidth=0)


def write_plots(out: Path, summaries: Sequence[PolicySummary], title: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for summary in summaries:
        _band(ax, summary, "allocated_pct")
    ax.plot([0, 130], [0, 130], color="grey", linestyle=":", linewidth=1, label="arrived")
    ax.set(xlabel="Arrived workload (% of cluster GPU capacity)", ylabel="GPU allocation ratio (%)",
           xlim=(0, 130), ylim=(0, 105), title=title or "GPU allocation vs arrived workload")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "allocation.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for summary in summaries:
        _band(left, summary, "frag_amount_pct")
        _band(right, summary, "frag_ratio_pct")
    left.set(xlabel="Arrived workload (%)", ylabel="Fragmented GPUs (% of all GPUs)", xlim=(0, 130),
             title="Fragmentation amount")
    right.set(xlabel="Arrived workload (%)", ylabel="Fragmented GPUs (% of idle GPUs)", xlim=(0, 130),
              ylim=(0, 105), title="Fragmentation ratio")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "fragmentation.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_html(out: Path, summaries: Sequence[PolicySummary], meta: Mapping[str, object],
               plots: Sequence[Path]) -> Path:
    """A self-contained page: the table of headline figures and the plots next to it."""
    rows = []
    for summary in summaries:
        failed = summary.at_runs("failed")
        rows.append(
            f"<tr><td>{summary.policy}</td><td>{_fmt(summary.at('unallocated_pct', 100))}</td>"
            f"<td>{_fmt(summary.at('unallocated_pct', 130))}</td><td>{_fmt(summary.at('frag_ratio_pct', 90))}</td>"
            f"<td>{failed.mean:.0f}</td><td>{summary.seconds:.1f}</td></tr>"
        )
    images = "".join(f'<p><img src="{p.name}" alt="{p.stem}" style="max-width:100%"></p>' for p in plots)
    facts = "".join(f"<li><b>{k}</b>: {v}</li>" for k, v in meta.items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kubecell packing report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}</style>
</head><body><h1>kubecell packing experiment</h1><ul>{facts}</ul>
<table><tr><th>policy</th><th>unallocated GPU % at 100 % arrived</th><th>at 130 %</th>
<th>fragmentation ratio % at 90 %</th><th>failed pods (mean)</th><th>seconds</th></tr>
{''.join(rows)}</table>{images}</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _fmt(value: Stat) -> str:
    if value.mean != value.mean:
        return "n/a"
    return f"{value.mean:.2f} &plusmn; {value.sd:.2f}"
