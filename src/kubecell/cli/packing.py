"""``kubecell sim packing`` and ``kubecell simulate``: the FGD packing experiment from the command line.

Everything a user can get wrong (policy names, seeds, inflation, the report directory, the node and pod
lists, a pod list that cannot measure anything) is checked before the first run, so a grid that takes an
hour never dies at the end; the report records the exact command that reproduces it.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kubecell import __version__
from kubecell.cli.examples import example_paths
from kubecell.cli.output import check_out_dir, prepare_out_dir, stderr_console, stdout_console, warn
from kubecell.cli.progress import RunProgress
from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.registry import DEFAULT_POLICY, FGD_BASELINES, parse_policy_list
from kubecell.sim.packing.metrics import PolicySummary, RunCurves
from kubecell.sim.packing.report import HEADLINE, format_stat, write_curves, write_html, write_plots, write_summary
from kubecell.sim.packing.runner import (
    MAX_INFLATE,
    check_inflate,
    check_measurable,
    format_seeds,
    load_inputs,
    parse_seeds,
    run_grid,
)

ALL_PLACEMENTS = ",".join((*FGD_BASELINES, DEFAULT_POLICY))
DEFAULT_INFLATE = 1.3
"""The FGD protocol: arrivals up to 130 % of the cluster's GPU capacity."""


def removed_policy_flag(value: str | None) -> None:
    """``--policy`` named a placement policy here and a tenancy preset in ``sim dynamic``; it is gone, and
    whoever still types it is told which of the two new flags they mean."""
    if value is not None:
        raise InvalidInputError(
            "--policy was renamed --placement (placement policies); tenancy presets are --tenancy in "
            "'kubecell sim dynamic'", field="policy", accepted=f"--placement {value}")


def summary_table(summaries: list[PolicySummary], title: str) -> tuple[Table, list[str]]:
    """The headline figures per placement policy, and one line per distinct reason a figure is n/a."""
    seeds = max((len(s.runs) for s in summaries), default=0)
    spread = f"mean ± SD over {seeds} seeds" if seeds > 1 else "one seed, no SD"
    table = Table(title=title, caption=f"{spread}; lower is better in every column. unallocated GPU %: capacity "
                  "left unallocated once arrived GPU requests reach 100 / 130 % of it; frag ratio: idle GPU "
                  "capacity the typical pods cannot use, at 90 % arrived")
    for column in ("placement", "unallocated GPU % @100", "unallocated GPU % @130", "frag ratio % @90",
                   "failed pods", "seconds"):
        table.add_column(column, justify="left" if column == "placement" else "right", no_wrap=True)
    reasons: dict[str, None] = {}
    for summary in summaries:
        figures = []
        for metric, x in HEADLINE:
            figures.append(format_stat(summary.at(metric, x), len(summary.runs)))
            why = summary.why_undefined(metric, x)
            if why is not None:
                reasons[f"n/a: {why}"] = None
        failed = sum(run.failed for run in summary.runs) / max(len(summary.runs), 1)
        table.add_row(summary.policy, *figures, f"{failed:.0f}", f"{summary.seconds:.1f}")
    return table, list(reasons)


def run_packing(
    nodes: Path, pods: Path, placement: str, seeds: str, inflate: float, jobs: int, out: Path, *, title: str,
    allow_impossible: bool, command: list[str], inflate_option: bool,
) -> Path:
    """Validate everything, run the grid with progress, write the report and print the table.

    ``command`` is the command line without the options this function reconstructs (placement, seeds,
    inflation when the command has ``--inflate``, jobs, out), so the report shows every value the run used,
    defaults included."""
    policies = parse_policy_list(placement, field="placement")
    seed_list = parse_seeds(seeds)
    check_inflate(inflate)
    check_out_dir(out)
    inputs = load_inputs(str(nodes), str(pods), allow_impossible)
    check_measurable(inputs, str(pods))
    if inputs.impossible:
        pod, verdict = inputs.impossible[0]
        warn(f"{len(inputs.impossible)} pod(s) can never be placed on this cluster and will count as failed "
             f"(first: {pod.name}: {verdict.reason})")
    prepare_out_dir(out)
    started = time.perf_counter()
    with RunProgress("packing", len(policies) * len(seed_list), "runs", console=stderr_console()) as progress:

        def done(run: RunCurves) -> None:
            progress.done(f"{run.policy} seed {run.seed}")

        summaries = run_grid(nodes, pods, policies, seed_list, inflate=inflate, jobs=jobs,
                             allow_impossible=allow_impossible, on_done=done)
    wall = time.perf_counter() - started
    words = [*command, "--placement", ",".join(policies), "--seeds", format_seeds(seed_list)]
    if inflate_option:
        words += ["--inflate", f"{inflate:g}"]
    words += ["--jobs", str(jobs), "--out", str(out)]
    meta = {
        "command": shlex.join(words),  # shell-quoted: the report prints it to be pasted
        "directory": os.getcwd(),
        "kubecell": __version__,
        "nodes": str(nodes),
        "pods": str(pods),
        "placement": policies,
        "seeds": seed_list,
        "inflate": inflate,
        "jobs": jobs,
        "allow_impossible": allow_impossible,
        "impossible_pods": len(inputs.impossible),
        "wall_seconds": round(wall, 2),
    }
    write_summary(out, summaries, meta)
    write_curves(out, summaries)
    plots = write_plots(out, summaries, title=title)
    page = write_html(out, summaries, meta, plots)
    console = stdout_console()
    table, notes = summary_table(summaries, title)
    console.print(table)
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True, markup=False)
    console.print(f"wall time {wall:.1f} s; results in {out}/ (summary.json, curves.csv, *.png)", soft_wrap=True,
                  highlight=False, markup=False)
    return page


def sim_packing(
    nodes: Annotated[Path, typer.Option(help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    pods: Annotated[Path, typer.Option(help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]).")],
    out: Annotated[Path, typer.Option(help="Output directory (created; checked before anything runs).")],
    placement: Annotated[str, typer.Option(
        help="Comma-separated placement policies (case-insensitive; see 'kubecell policies').")] = ALL_PLACEMENTS,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51 or 1,2,3 (at most 1000).")] = "42-51",
    inflate: Annotated[float, typer.Option(
        help=f"Inflate the workload to this share of GPU capacity, in (0, {MAX_INFLATE:g}]; the figures stop at "
        "1.3.")] = DEFAULT_INFLATE,
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
    allow_impossible: Annotated[bool, typer.Option(
        "--allow-impossible", help="Replay pods no node could ever hold as failures (FGD protocol).")] = False,
    policy: Annotated[str | None, typer.Option("--policy", hidden=True)] = None,
) -> None:
    """The FGD paper's static packing experiment: seeded shuffle, inflation, online placement, no retries."""
    removed_policy_flag(policy)
    command = ["kubecell", "sim", "packing", "--nodes", str(nodes), "--pods", str(pods)]
    if allow_impossible:
        command.append("--allow-impossible")
    run_packing(nodes, pods, placement, seeds, inflate, jobs, out, title=f"{pods.stem} on {nodes.stem}",
                allow_impossible=allow_impossible, command=command, inflate_option=True)


def simulate(
    out: Annotated[Path, typer.Option(help="Report directory (created; checked before anything runs).")] = Path(
        "kubecell-report"),
    placement: Annotated[str, typer.Option(
        help="Comma-separated placement policies (see 'kubecell policies').")] = ALL_PLACEMENTS,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51 or 1,2,3 (at most 1000).")] = "42-51",
    jobs: Annotated[int, typer.Option(help="Parallel worker processes.", min=1)] = 1,
    policy: Annotated[str | None, typer.Option("--policy", hidden=True)] = None,
) -> None:
    """Run the bundled example (64 heterogeneous nodes, ~400 pods) through FGD's six placement policies and
    kubecell's own, and report."""
    removed_policy_flag(policy)
    nodes, pods = example_paths()
    page = run_packing(nodes, pods, placement, seeds, DEFAULT_INFLATE, jobs, out,
                       title="bundled example: 64 nodes, 286 GPUs", allow_impossible=False,
                       command=["kubecell", "simulate"], inflate_option=False)
    stdout_console().print(f"report: {page}", soft_wrap=True, highlight=False, markup=False)
