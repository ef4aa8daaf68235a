"""``kubecell sim elastic``: elastic policies on Sia's workloads under the Pollux/Sia job model.

Inputs (policies, cluster, ``--out``, the workload files and every profile table they need) are checked before
the first simulation; progress goes to stderr; the table printed at the end puts each trace family's figures
next to Sia's published Table 3 rows.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from kubecell.cli.output import check_out_dir, prepare_out_dir, stderr_console, stdout_console
from kubecell.cli.progress import RunProgress
from kubecell.sim.elastic import runner as elastic
from kubecell.sim.elastic.cluster import cluster_by_name
from kubecell.sim.elastic.metrics import Figures
from kubecell.sim.elastic.policies import DEFAULT_POLICIES, parse_policies
from kubecell.sim.elastic.report import paper_rows, write_report
from kubecell.sim.elastic.simulator import DEFAULT_MAX_HOURS, MAX_HANDOVER_SECONDS

COLUMNS = (("policy", "policy"), ("family", "family"), ("workloads", "work-\nloads"), ("jobs", "jobs"),
           ("avg_jct_hours", "avg\nJCT h"), ("p99_jct_hours", "p99\nJCT h"), ("makespan_hours", "makespan\nh"),
           ("gpu_hours_per_job", "GPU h\n/ job"), ("restarts_per_job", "restarts\n/ job"))


def _value(row: Figures, key: str) -> str:
    value = row.get(key)
    if value is None:
        return "" if key in ("workloads", "jobs", "restarts_per_job") else "n/a"
    if key in ("avg_jct_hours", "makespan_hours", "gpu_hours_per_job") and isinstance(value, float):
        spread = row.get(f"{key}_std")
        return f"{value:.2f} ± {spread:.1f}" if isinstance(spread, float) else f"{value:.2f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def families_table(run: elastic.ElasticRun) -> Table:
    """Per family: each policy's figures, then the paper's rows for that family."""
    table = Table(title="elastic simulation: per trace family (Sia Table 3 figures)", box=box.SIMPLE_HEAD,
                  padding=(0, 0, 0, 1), caption="± : spread (std) over the family's workloads; 'paper:' rows are "
                  "Sia SOSP'23 Table 3 (Helios = saturn)")
    for key, header in COLUMNS:
        table.add_column(header, justify="left" if key in ("policy", "family") else "right", no_wrap=True)
    for family, by_policy in run.families.items():
        for row in [*by_policy.values(), *paper_rows(family)]:
            table.add_row(*(_value(row, key) for key, _ in COLUMNS))
    return table


def sim_elastic(
    workload: Annotated[Path, typer.Option(
        help="A Sia workload CSV, or a directory: every workload-*.csv below it, grouped by trace family (the "
        "folder name, e.g. philly, saturn).")],
    out: Annotated[Path, typer.Option(help="Report directory (created; checked before anything runs).")] = Path(
        "kubecell-elastic"),
    cluster: Annotated[str, typer.Option(help="Simulated cluster: sia64 (6x4 T4, 3x8 RTX 2080Ti, 2x8 A100).")] = (
        "sia64"),
    policy: Annotated[str, typer.Option(
        help="Comma-separated elastic policies: kubecell (the path a cluster runs: the core engine admits, places "
        "and takes back, the allocator sizes jobs on goodput learned online, moves them between GPU types and "
        "chooses where they start), gavel (Gavel's max-sum-throughput time-slicing with TunedJobs, as the Sia "
        "artifact runs it), rigid (TunedJobs sizes, FIFO with backfill, never preempted); also the diagnostics "
        "kubecell-allocator (the allocator alone, with the whole cluster's authority), kubecell-no-moves, "
        "kubecell-true-noise and kubecell-oracle.")] = (
        ",".join(DEFAULT_POLICIES)),
    models: Annotated[Path | None, typer.Option(
        help="The profile tables (models/ of sia-sosp23-workloads; default: the nearest models/ folder beside "
        "the workload or above it).")] = None,
    max_hours: Annotated[float, typer.Option(
        help="Stop with an error if jobs are still unfinished after this much simulated time.", min=1.0,
        max=1e6)] = (
        DEFAULT_MAX_HOURS),
    handover_seconds: Annotated[float, typer.Option(
        help="Seconds a GPU that one job gives up (shrunk, moved, preempted) stays unusable for the job it is "
        "given to, as a cluster deletes workers with their grace period to checkpoint; 0, the default, hands it "
        "over at once, as Sia's simulator and its published figures do.", min=0.0, max=MAX_HANDOVER_SECONDS)] = 0.0,
) -> None:
    """Elastic policies on Sia's workloads under the Pollux/Sia job model (throughput from profiled placements,
    statistical efficiency from the gradient noise scale, restart delays), compared with Sia's Table 3."""
    specs = parse_policies(policy)
    cluster_by_name(cluster)
    check_out_dir(out)
    inputs = elastic.load_inputs(workload, cluster=cluster, models=models)
    elastic.check_runnable(inputs, specs, max_hours)
    prepare_out_dir(out)
    total = len(specs) * len(inputs.workloads)
    with RunProgress("simulating", total, "runs", console=stderr_console(), announces_steps=True) as progress:
        run = elastic.run_elastic(inputs, specs, max_hours=max_hours, handover_seconds=handover_seconds,
                                  on_start=progress.start, on_step=progress.done)
    words = ["kubecell", "sim", "elastic", "--workload", str(workload), "--cluster", cluster,
             "--policy", ",".join(spec.name for spec in specs)]
    if models is not None:
        words += ["--models", str(models)]
    if max_hours != DEFAULT_MAX_HOURS:
        words += ["--max-hours", f"{max_hours:g}"]
    if handover_seconds:
        words += ["--handover-seconds", f"{handover_seconds:g}"]
    words += ["--out", str(out)]
    meta: dict[str, object] = {
        "command": shlex.join(words), "directory": os.getcwd(), "cluster": cluster,
        "handover_seconds": handover_seconds, "gpus": sum(node.gpus for node in inputs.nodes),
        "models": str(inputs.models),
        "policies": [spec.name for spec in specs],
        "workloads": [str(w.path) for w in inputs.workloads], "wall_seconds": round(run.wall_seconds, 2)}
    page = write_report(out, run, meta)
    console = stdout_console()
    console.print(families_table(run))
    jobs = sum(len(w.jobs) for w in inputs.workloads)
    console.print(f"{len(inputs.workloads)} workloads ({jobs} jobs), {len(specs)} policies on {cluster}; "
                  f"wall time {run.wall_seconds:.1f} s; report: {page}", soft_wrap=True, highlight=False, markup=False)
