"""The ``kubecell`` command line.

``kubecell simulate`` with no arguments is the project's main job on a laptop: it replays the bundled
example workload on the bundled example cluster with every placement policy and writes a report.
User errors (bad files, unknown names, impossible requests) print one line and exit with status 2.
"""

from __future__ import annotations

import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kubecell import __version__
from kubecell.core.errors import KubecellError
from kubecell.core.placement.registry import (
    DEFAULT_POLICY,
    FGD_BASELINES,
    canonical_policy_name,
    parse_policy_list,
    policy_summaries,
)
from kubecell.sim.dynamic import runner as dynamic
from kubecell.sim.dynamic.metrics import PolicyMetrics
from kubecell.sim.packing.metrics import PolicySummary, RunCurves
from kubecell.sim.packing.report import write_curves, write_html, write_plots, write_summary
from kubecell.sim.packing.runner import load_inputs, parse_seeds, run_grid

app = typer.Typer(
    help="kubecell: GPU-cluster scheduler and trace-driven simulator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
sim_app = typer.Typer(help="Trace-driven experiments on an embedded cluster.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")

console = Console()
errors = Console(stderr=True)


def example_paths() -> tuple[Path, Path]:
    """The bundled example node and pod lists (inside the installed package)."""
    base = resources.files("kubecell.sim.examples")
    return Path(str(base / "nodes.csv")), Path(str(base / "pods.csv"))


def philly_example_paths() -> tuple[Path, Path]:
    """The bundled Philly-like cluster and tenant configuration for the dynamic simulator."""
    base = resources.files("kubecell.sim.examples") / "philly"
    return Path(str(base / "cluster.yaml")), Path(str(base / "tenants.yaml"))


def _summary_table(summaries: list[PolicySummary], title: str) -> Table:
    table = Table(title=title)
    for column in ("policy", "unallocated GPU % @100", "unallocated GPU % @130", "frag ratio % @90",
                   "failed pods", "seconds"):
        table.add_column(column, justify="right" if column != "policy" else "left", no_wrap=column == "policy")
    for summary in summaries:
        u100 = summary.at("unallocated_pct", 100)
        u130 = summary.at("unallocated_pct", 130)
        fr90 = summary.at("frag_ratio_pct", 90)
        failed = sum(run.failed for run in summary.runs) / max(len(summary.runs), 1)
        table.add_row(
            summary.policy,
            f"{u100.mean:.2f} ± {u100.sd:.2f}",
            f"{u130.mean:.2f} ± {u130.sd:.2f}",
            f"{fr90.mean:.1f}",
            f"{failed:.0f}",
            f"{summary.seconds:.1f}",
        )
    return table


def _run_packing(
    nodes: Path, pods: Path, policies: list[str], seeds: list[int], inflate: float, jobs: int, out: Path,
    title: str, allow_impossible: bool = False,
) -> Path:
    started = time.perf_counter()
    inputs = load_inputs(str(nodes), str(pods), allow_impossible)
    if inputs.impossible:
        pod, verdict = inputs.impossible[0]
        errors.print(
            f"warning: {len(inputs.impossible)} pod(s) can never be placed on this cluster and will count as "
            f"failed (first: {pod.name}: {verdict.reason})", highlight=False, soft_wrap=True,
        )
    total = len(policies) * len(seeds)
    with Progress(
        TextColumn("[bold]packing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=errors, transient=True, disable=not errors.is_terminal,
    ) as progress:
        task = progress.add_task("", total=total)

        def done(run: RunCurves) -> None:
            progress.update(task, advance=1, description=f"{run.policy} seed {run.seed}")

        summaries = run_grid(nodes, pods, policies, seeds, inflate=inflate, jobs=jobs,
                             allow_impossible=allow_impossible, on_done=done)
    wall = time.perf_counter() - started
    meta = {
        "kubecell": __version__,
        "nodes": str(nodes),
        "pods": str(pods),
        "policies": policies,
        "seeds": seeds,
        "inflate": inflate,
        "jobs": jobs,
        "impossible_pods": len(inputs.impossible),
        "wall_seconds": round(wall, 2),
    }
    write_summary(out, summaries, meta)
    write_curves(out, summaries)
    plots = write_plots(out, summaries, title=title)
    page = write_html(out, summaries, meta, plots)
    console.print(_summary_table(summaries, title))
    console.print(f"wall time {wall:.1f} s; results in {out}/ (summary.json, curves.csv, *.png)", soft_wrap=True)
    return page


@sim_app.command("packing")
def sim_packing(
    nodes: Annotated[Path, typer.Option(help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    pods: Annotated[Path, typer.Option(help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]).")],
    out: Annotated[Path, typer.Option(help="Output directory.")],
    policy: Annotated[str, typer.Option(help="Comma-separated policies (case-insensitive).")] = ",".join(
        (*FGD_BASELINES, DEFAULT_POLICY)),
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51 or 1,2,3.")] = "42-51",
    inflate: Annotated[float, typer.Option(help="Inflate the workload to this share of GPU capacity.")] = 1.3,
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
    allow_impossible: Annotated[bool, typer.Option(
        "--allow-impossible", help="Replay pods no node could ever hold as failures (FGD protocol).")] = False,
) -> None:
    """The FGD paper's static packing experiment: seeded shuffle, inflation, online placement, no retries."""
    _run_packing(nodes, pods, parse_policy_list(policy), parse_seeds(seeds), inflate, jobs, out,
                 title=f"{pods.stem} on {nodes.stem}", allow_impossible=allow_impossible)


def _value(value: object, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _percent(value: object) -> str:
    return f"{value * 100:.1f}" if isinstance(value, float) else "n/a"


def _dynamic_tables(metrics: list[PolicyMetrics], private: dict[str, dict[str, object]]) -> tuple[Table, Table]:
    """Headline figures per policy, and the sharing anomaly per VC (all figures in summary.json)."""
    policies = Table(title="dynamic simulation: per policy", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1),
                     caption="GPU util over the whole run and until the last arrival (hourly samples); delays over "
                     "started jobs, JCT over finished jobs")
    for column in ("policy", "GPU\nutil %", "util %\nto last\narrival", "mean\nJCT h", "mean\ndelay\nmin",
                   "gangs\nbroken", "max\npre-\nempt", "rej-\nected", "unfi-\nnished"):
        policies.add_column(column, justify="left" if column == "policy" else "right", no_wrap=column == "policy")
    for m in metrics:
        o = m.overall
        policies.add_row(
            m.policy, f"{o['gpu_utilisation'] * 100:.1f}", _percent(o["gpu_utilisation_until_last_arrival"]),
            _value(o["jct_hours"]["mean"]), _value(o["queueing_delay_minutes"]["mean"]), str(o["gangs_broken"]),
            str(o["preemptions_per_job"]["max"]), str(o["rejected"]), str(o["unfinished"]),
        )
    vcs = Table(title="sharing anomaly (minutes) per VC", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1),
                caption="mean queueing delay of the VC's within-guarantee jobs under each policy minus the same "
                "jobs' delay on a private cluster of its guaranteed cells; negative = sharing helped")
    for column in ("VC", "guaranteed\nGPUs", "jobs", "private\ndelay min", *(m.policy for m in metrics)):
        vcs.add_column(column, justify="left" if column == "VC" else "right", no_wrap=column == "VC")
    for vc in metrics[0].per_vc if metrics else {}:
        first = metrics[0].per_vc[vc]
        base = private.get(vc)
        delay = base["queueing_delay_minutes"] if base else None
        private_delay = _value(delay["mean"]) if isinstance(delay, dict) else "n/a"
        vcs.add_row(vc, str(first["guaranteed_gpus"]), str(first["jobs"]), private_delay,
                    *(_value(m.per_vc[vc]["sharing_anomaly_minutes"]) for m in metrics))
    return policies, vcs


@sim_app.command("dynamic")
def sim_dynamic(
    workload: Annotated[list[Path], typer.Option(
        help="Trace CSV (Philly PCS per-VC list or Sia workload; format detected from the header) or a directory "
        "of them. Repeat the option for several: --workload a.csv --workload b.csv.")],
    cluster: Annotated[Path | None, typer.Option(
        help="Cluster description YAML (default: the bundled 64 x 8-P40 Philly-like cluster).")] = None,
    tenants: Annotated[Path | None, typer.Option(
        help="Tenant configuration YAML (default: the bundled Philly VCs).")] = None,
    policy: Annotated[str, typer.Option(help="Comma-separated tenancy policies.")] = ",".join(dynamic.DEFAULT_POLICIES),
    placement: Annotated[str, typer.Option(
        help="Placement policy every job member is placed with (see 'kubecell policies').")] = DEFAULT_POLICY,
    seed: Annotated[int, typer.Option(help="Seed of everything random (node-failure injection).", min=0)] = 0,
    days: Annotated[float | None, typer.Option(help="Keep jobs submitted in a window of N days.")] = None,
    start_day: Annotated[float, typer.Option(
        help="The window starts this many days after each trace's origin (the cluster starts empty).")] = 0.0,
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("kubecell-dynamic"),
    node_failures: Annotated[int, typer.Option(help="Random GPU-node failures to inject (seeded).", min=0)] = 0,
    repair_hours: Annotated[float, typer.Option(
        help="Hours until a failed node is back.")] = dynamic.DEFAULT_REPAIR_HOURS,
    horizon_days: Annotated[float | None, typer.Option(
        help="Stop the simulated clock after N days (unfinished jobs are counted).")] = None,
    skip_bad_rows: Annotated[bool, typer.Option(
        "--skip-bad-rows", help="Reject bad trace rows with a reason (counted) instead of stopping.")] = False,
) -> None:
    """Multi-tenant discrete-event simulation: each tenancy policy on the same trace, every VC also alone on a
    private cluster of its guaranteed cells (the sharing-anomaly baseline)."""
    default_cluster, default_tenants = philly_example_paths()
    cluster = cluster or default_cluster
    tenants = tenants or default_tenants
    policies = dynamic.parse_policies(policy)
    placement = canonical_policy_name(placement)
    dynamic.check_run_options(node_failures=node_failures, repair_hours=repair_hours, horizon_days=horizon_days)
    inputs = dynamic.load_inputs(cluster, tenants, workload, days=days, start_day=start_day,
                                 skip_bad_rows=skip_bad_rows)
    rejected = inputs.workload.rejected
    if rejected:
        errors.print(f"warning: skipped {len(rejected)} bad trace row(s) (first: {rejected[0]})",
                     highlight=False, soft_wrap=True)
    unknown = inputs.unknown_vcs
    if unknown:
        names = ", ".join(sorted(unknown))
        errors.print(f"warning: {sum(unknown.values())} job(s) of VC(s) not in {tenants} ({names}) will be rejected",
                     highlight=False, soft_wrap=True)
    if not inputs.jobs:
        errors.print("warning: no jobs in the workload (check --days)", highlight=False, soft_wrap=True)
    with Progress(
        TextColumn("[bold]simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=errors, transient=True, disable=not errors.is_terminal,
    ) as progress:
        task = progress.add_task(policies[0], total=dynamic.step_count(inputs, policies))

        def done(label: str) -> None:
            progress.update(task, advance=1, description=f"{label} done")

        run = dynamic.run_dynamic(inputs, policies, seed=seed, node_failures=node_failures, repair_hours=repair_hours,
                                  horizon_days=horizon_days, placement=placement, on_step=done)
    meta = dynamic.run_meta(run, policies, placement=placement, seed=seed, days=days, horizon_days=horizon_days,
                            repair_hours=repair_hours)
    page = dynamic.write_report(out, run, meta)
    policy_table, vc_table = _dynamic_tables(run.metrics, run.private)
    console.print(policy_table)
    console.print(vc_table)
    console.print(f"{len(inputs.jobs)} jobs, {len(inputs.nodes)} nodes, placement {placement}; "
                  f"wall time {run.wall_seconds:.1f} s; report: {page}", soft_wrap=True)


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("kubecell-report"),
    policy: Annotated[str, typer.Option(help="Comma-separated policies.")] = ",".join((*FGD_BASELINES, DEFAULT_POLICY)),
    seeds: Annotated[str, typer.Option(help="Seeds.")] = "42-51",
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
) -> None:
    """Run the bundled example (64 heterogeneous nodes, ~400 pods) through FGD's six policies and
    kubecell's own, and report."""
    nodes, pods = example_paths()
    page = _run_packing(nodes, pods, parse_policy_list(policy), parse_seeds(seeds), 1.3, jobs, out,
                        title="bundled example: 64 nodes, 286 GPUs")
    console.print(f"report: {page}", soft_wrap=True)


@app.command()
def policies() -> None:
    """List the placement policies."""
    table = Table(title="placement policies")
    table.add_column("name")
    table.add_column("what it does")
    for name, summary in policy_summaries().items():
        table.add_row(f"{name} (default)" if name == DEFAULT_POLICY else name, summary)
    console.print(table)


@app.command()
def version() -> None:
    """Print the version."""
    console.print(__version__)


def main() -> None:
    try:
        app()
    except KubecellError as error:
        errors.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        errors.print("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        os._exit(1)


if __name__ == "__main__":
    main()
