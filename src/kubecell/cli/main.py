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
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kubecell import __version__
from kubecell.core.errors import KubecellError
from kubecell.core.placement.registry import FGD_BASELINES, parse_policy_list, policy_summaries
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
    policy: Annotated[str, typer.Option(help="Comma-separated policies (case-insensitive).")] = ",".join(FGD_BASELINES),
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51 or 1,2,3.")] = "42-51",
    inflate: Annotated[float, typer.Option(help="Inflate the workload to this share of GPU capacity.")] = 1.3,
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
    allow_impossible: Annotated[bool, typer.Option(
        "--allow-impossible", help="Replay pods no node could ever hold as failures (FGD protocol).")] = False,
) -> None:
    """The FGD paper's static packing experiment: seeded shuffle, inflation, online placement, no retries."""
    _run_packing(nodes, pods, parse_policy_list(policy), parse_seeds(seeds), inflate, jobs, out,
                 title=f"{pods.stem} on {nodes.stem}", allow_impossible=allow_impossible)


@app.command()
def simulate(
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("kubecell-report"),
    policy: Annotated[str, typer.Option(help="Comma-separated policies.")] = ",".join(FGD_BASELINES),
    seeds: Annotated[str, typer.Option(help="Seeds.")] = "42-51",
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
) -> None:
    """Run the bundled example (64 heterogeneous nodes, ~400 pods) through every policy and report."""
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
        table.add_row(name, summary)
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
