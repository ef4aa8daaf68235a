"""Writes the packing experiment's results: summary.json, curves.csv and figures like the paper's.

``allocation.png`` is comparable to Fig. 9(a) (allocated GPU % vs arrived workload); ``fragmentation.png``
to Fig. 7 (fragmentation amount and ratio vs arrived workload). Lines are means over seeds, bands
one standard deviation.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from kubecell.sim.figures import plain_text
from kubecell.sim.packing.metrics import ARRIVED_PCT, PolicySummary, Stat
from kubecell.sim.packing.runner import format_seeds

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


@plain_text
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


METRIC_NOTES: tuple[tuple[str, str], ...] = (
    ("unallocated GPU % at 100 % arrived",
     "share of the cluster's GPU capacity (in milli-GPU) left unallocated once the GPU requests that arrived "
     "(placed or failed) add up to 100 % of that capacity; what a policy wastes when demand exactly matches "
     "supply (FGD paper, Fig. 9(a)). Lower is better."),
    ("at 130 %",
     "the same once arrivals reach 130 % of capacity: how much a policy still packs under overload. Lower is "
     "better."),
    ("fragmentation ratio % at 90 %",
     "share of the idle GPU capacity that the workload's typical pods cannot use (FGD's fragmentation measure "
     "divided by idle capacity) when arrivals reach 90 % of capacity (Fig. 7). Lower is better."),
    ("failed pods",
     "pods that found no node when they arrived, mean over seeds (the experiment never retries). Lower is better; "
     "compare only runs with the same inflation."),
    ("seconds", "time spent placing, summed over the policy's seeds. Lower is faster."),
)
"""What each column of the report means and which direction is better (shown on the page)."""

_FACT_LABELS = {
    "kubecell": "kubecell version",
    "nodes": "node list",
    "pods": "pod list",
    "placement": "placement policies",
    "seeds": "seeds",
    "inflate": "workload inflated to",
    "jobs": "worker processes",
    "allow_impossible": "pods no node can hold replayed as failures",
    "impossible_pods": "pods no node can hold",
    "wall_seconds": "wall time",
}


def _fact(key: str, value: object) -> str:
    """One input of the run in words: lists joined, seeds as ranges, units spelled out."""
    if key == "seeds" and isinstance(value, list | tuple):
        return f"{format_seeds([int(v) for v in value])} ({len(value)} seeds)"
    if key == "inflate" and isinstance(value, int | float):
        return f"{value:g} x the cluster's GPU capacity"
    if key == "wall_seconds" and isinstance(value, int | float):
        return f"{value:.1f} s"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return str(value)


def write_html(out: Path, summaries: Sequence[PolicySummary], meta: Mapping[str, object],
               plots: Sequence[Path]) -> Path:
    """A self-contained page: how to reproduce the run, its inputs, the headline figures with what each
    means, why any figure is missing, and the plots."""
    rows = []
    reasons: dict[str, None] = {}
    for summary in summaries:
        failed = summary.at_runs("failed")
        cells = []
        for metric, x in HEADLINE:
            stat = summary.at(metric, x)
            why = summary.why_undefined(metric, x)
            if why is not None:
                reasons[why] = None
            cells.append(f"<td>{format_stat(stat, len(summary.runs), html_sd=True)}</td>")
        rows.append(f"<tr><td>{html.escape(summary.policy)}</td>{''.join(cells)}"
                    f"<td>{failed.mean:.0f}</td><td>{summary.seconds:.1f}</td></tr>")
    images = "".join(f'<p><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}" style="max-width:100%"></p>'
                     for p in plots)
    command = meta.get("command")
    directory = meta.get("directory")
    reproduce = ""
    if command:
        where = f" in <code>{html.escape(str(directory))}</code>" if directory else ""
        reproduce = f"<h2>Reproduce</h2><p>Run{where}:</p><pre>{html.escape(str(command))}</pre>"
    facts = "".join(f"<li><b>{html.escape(_FACT_LABELS.get(k, k))}</b>: {html.escape(_fact(k, v))}</li>"
                    for k, v in meta.items() if k not in ("command", "directory"))
    notes = "".join(f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>" for name, text in METRIC_NOTES)
    missing = "".join(f"<li>{html.escape(reason)}</li>" for reason in reasons)
    missing = f"<p>n/a: not measured in this run:</p><ul>{missing}</ul>" if missing else ""
    seeds = max((len(s.runs) for s in summaries), default=0)
    spread = "mean &plusmn; sample SD over seeds" if seeds > 1 else "one seed, so no SD"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kubecell packing report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}
pre{{background:#f4f4f4;padding:.6em;white-space:pre-wrap}}dt{{font-weight:bold}}dd{{margin:0 0 .5em 1.5em}}</style>
</head><body><h1>kubecell packing experiment</h1>{reproduce}<h2>Inputs</h2><ul>{facts}</ul>
<h2>Results</h2><p>Figures are {spread}.</p>
<table><tr><th>placement policy</th><th>unallocated GPU % at 100 % arrived</th><th>at 130 %</th>
<th>fragmentation ratio % at 90 %</th><th>failed pods (mean)</th><th>seconds</th></tr>
{''.join(rows)}</table>{missing}
<h2>What the figures mean</h2><dl>{notes}</dl>
<p>Files: summary.json (every figure, nulls explained under <code>not_measured</code>), curves.csv (per seed),
curves_mean.csv, run.json (these inputs).</p>
{images}</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


HEADLINE: tuple[tuple[str, int], ...] = (("unallocated_pct", 100), ("unallocated_pct", 130), ("frag_ratio_pct", 90))
"""The (curve, arrived %) figures of the console table and the page, in column order."""


def format_stat(value: Stat, runs: int, *, html_sd: bool = False) -> str:
    """'2.99 ± 0.41' over several seeds, '2.99' for one (a sample SD needs two), 'n/a' when undefined."""
    if not math.isfinite(value.mean):
        return "n/a"
    if runs < 2:
        return f"{value.mean:.2f}"
    return f"{value.mean:.2f} {'&plusmn;' if html_sd else '±'} {value.sd:.2f}"
