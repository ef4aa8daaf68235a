"""``kubecell sim dynamic``: the multi-tenant simulation from the command line.

Two kinds of policy meet here and have one flag each: ``--tenancy`` picks the tenancy presets compared side
by side (quota, hived, kubecell: who is guaranteed what, who may borrow, who is preempted), ``--placement``
the placement policy every job member is placed with. Inputs are validated before the first simulation;
progress names the simulation that is running.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from kubecell.cli.examples import philly_example_paths
from kubecell.cli.output import check_out_dir, prepare_out_dir, stderr_console, stdout_console, warn
from kubecell.cli.progress import RunProgress
from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.registry import DEFAULT_POLICY, canonical_policy_name
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.sim.dynamic import runner as dynamic
from kubecell.sim.dynamic.metrics import PolicyMetrics


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def cluster_and_tenants(cluster: Path | None, tenants: Path | None) -> tuple[Path, Path]:
    """The cluster and tenant files a run uses.

    The bundled tenants guarantee cells of the bundled cluster (seven Philly VCs sized to its 64 nodes), so
    they are the default only with that cluster. With any other ``--cluster`` they would either not resolve
    (other GPU models) or silently guarantee a fraction of it (more nodes of the same model); and inventing
    guarantees for the user's cluster would make every figure of the report (sharing anomaly, borrowing,
    within-guarantee delays) a measure of guesses. So the run stops and says what to write, listing the
    cluster's cell types."""
    bundled_cluster, bundled_tenants = philly_example_paths()
    if tenants is not None:
        return cluster or bundled_cluster, tenants
    if cluster is None or _same_file(cluster, bundled_cluster):
        return cluster or bundled_cluster, bundled_tenants
    forest = CellForest(load_cluster(cluster))  # a broken cluster file is reported first
    kinds = sorted(forest.type_names(), key=lambda t: -forest.cells_of_type(t)[0].size)
    listed = ", ".join(f"{name} ({len(forest.cells_of_type(name))})" for name in kinds)
    example = next((name for name in kinds if name.endswith("/node")), kinds[-1] if kinds else "TYPE")
    raise InvalidInputError(
        f"--cluster {cluster} was given without --tenants, and the bundled tenants belong to the bundled Philly "
        "cluster, not to this one",
        field="tenants",
        accepted=f"--tenants FILE giving each VC of the workload cells of this cluster, e.g. "
        f"'virtualClusters: {{team-a: {{cells: {{{example}: 1}}}}}}'; its cell types (how many): {listed}; "
        "format in docs/dynamic.md")


def _value(value: object, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _percent(value: object) -> str:
    return f"{value * 100:.1f}" if isinstance(value, float) else "n/a"


def _names(vcs: list[str]) -> str:
    return ("VC " if len(vcs) == 1 else "VCs ") + ", ".join(vcs)


def dynamic_tables(metrics: list[PolicyMetrics], private: dict[str, dict[str, Any]]) -> tuple[Table, Table, list[str]]:
    """Headline figures per tenancy preset, the sharing anomaly per VC (all figures in summary.json), and one
    line per kind of n/a saying why that figure could not be measured."""
    presets = Table(title="dynamic simulation: per tenancy preset", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1),
                    caption="GPU util over the whole run and until the last arrival (hourly samples); delays over "
                    "started jobs, JCT over finished jobs")
    for column in ("tenancy", "GPU\nutil %", "util %\nto last\narrival", "mean\nJCT h", "mean\ndelay\nmin",
                   "gangs\nbroken", "max\npre-\nempt", "rej-\nected", "unfi-\nnished"):
        presets.add_column(column, justify="left" if column == "tenancy" else "right", no_wrap=True)
    notes: dict[str, None] = {}
    for m in metrics:
        o = m.overall
        if o["gpu_utilisation_until_last_arrival"] is None:
            notes["n/a (util % to last arrival): every job arrived at the same instant, so there is no time "
                  "before the last arrival to average over"] = None
        if o["jct_hours"]["mean"] is None:
            notes[f"n/a (mean JCT) under {m.policy}: no job finished (see unfinished and rejected)"] = None
        if o["queueing_delay_minutes"]["mean"] is None:
            notes[f"n/a (mean delay) under {m.policy}: no job started"] = None
        presets.add_row(
            m.policy, f"{o['gpu_utilisation'] * 100:.1f}", _percent(o["gpu_utilisation_until_last_arrival"]),
            _value(o["jct_hours"]["mean"]), _value(o["queueing_delay_minutes"]["mean"]), str(o["gangs_broken"]),
            str(o["preemptions_per_job"]["max"]), str(o["rejected"]), str(o["unfinished"]),
        )
    vcs = Table(title="sharing anomaly (minutes) per VC", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1),
                caption="mean queueing delay of the VC's within-guarantee jobs under each tenancy preset minus the "
                "same jobs' delay on a private cluster of its guaranteed cells; negative = sharing helped")
    for column in ("VC", "guaranteed\nGPUs", "jobs", "private\ndelay min", *(m.policy for m in metrics)):
        vcs.add_column(column, justify="left" if column == "VC" else "right", no_wrap=True)
    idle: list[str] = []
    never_private: list[str] = []
    never_both: list[str] = []
    for vc in metrics[0].per_vc if metrics else {}:
        first = metrics[0].per_vc[vc]
        base = private.get(vc)
        delay = base["queueing_delay_minutes"] if base else None
        private_delay = _value(delay["mean"]) if isinstance(delay, dict) else "n/a"
        anomalies = [_value(m.per_vc[vc]["sharing_anomaly_minutes"]) for m in metrics]
        if not first["jobs"]:
            idle.append(vc)
        elif private_delay == "n/a":
            never_private.append(vc)
        elif "n/a" in anomalies:
            never_both.append(vc)
        vcs.add_row(vc, str(first["guaranteed_gpus"]), str(first["jobs"]), private_delay, *anomalies)
    if idle:
        notes[f"n/a: {_names(idle)} had no jobs in the workload: no private run, no anomaly"] = None
    if never_private:
        notes[f"n/a: no job of {_names(never_private)} started on its private cluster"] = None
    if never_both:
        notes[f"n/a (anomaly): for {_names(never_both)}, no within-guarantee job started both under that preset "
              "and on the private cluster"] = None
    return presets, vcs, list(notes)


def sim_dynamic(
    workload: Annotated[list[Path], typer.Option(
        help="Trace CSV (Philly PCS per-VC list or Sia workload; format detected from the header) or a directory "
        "of them. Repeat the option for several: --workload a.csv --workload b.csv.")],
    cluster: Annotated[Path | None, typer.Option(
        help="Cluster description YAML (default: the bundled 64 x 8-P40 Philly-like cluster; another cluster "
        "needs --tenants).")] = None,
    tenants: Annotated[Path | None, typer.Option(
        help="Tenant configuration YAML (default: the bundled Philly VCs, with the bundled cluster only).")] = None,
    tenancy: Annotated[str, typer.Option(
        help="Comma-separated tenancy presets compared side by side (see 'kubecell policies').")] = ",".join(
        dynamic.DEFAULT_POLICIES),
    placement: Annotated[str, typer.Option(
        help="Placement policy every job member is placed with (see 'kubecell policies').")] = DEFAULT_POLICY,
    seed: Annotated[int, typer.Option(help="Seed of everything random (node-failure injection).", min=0)] = 0,
    days: Annotated[float | None, typer.Option(help="Keep jobs submitted in a window of N days.")] = None,
    start_day: Annotated[float, typer.Option(
        help="The window starts this many days after each trace's origin (the cluster starts empty).")] = 0.0,
    out: Annotated[Path, typer.Option(help="Report directory (created; checked before anything runs).")] = Path(
        "kubecell-dynamic"),
    node_failures: Annotated[int, typer.Option(help="Random GPU-node failures to inject (seeded).", min=0)] = 0,
    repair_hours: Annotated[float, typer.Option(
        help="Hours until a failed node is back.")] = dynamic.DEFAULT_REPAIR_HOURS,
    horizon_days: Annotated[float | None, typer.Option(
        help="Stop the simulated clock after N days (unfinished jobs are counted).")] = None,
    skip_bad_rows: Annotated[bool, typer.Option(
        "--skip-bad-rows", help="Reject bad trace rows with a reason (counted) instead of stopping.")] = False,
    policy: Annotated[str | None, typer.Option("--policy", hidden=True)] = None,
) -> None:
    """Multi-tenant discrete-event simulation: each tenancy preset on the same trace, every VC also alone on a
    private cluster of its guaranteed cells (the sharing-anomaly baseline)."""
    if policy is not None:
        raise InvalidInputError("--policy was renamed --tenancy (tenancy presets); the placement policy is "
                                "--placement", field="policy", accepted=f"--tenancy {policy}")
    presets = dynamic.parse_tenancy(tenancy)
    placement = canonical_policy_name(placement, field="placement")
    dynamic.check_run_options(node_failures=node_failures, repair_hours=repair_hours, horizon_days=horizon_days)
    check_out_dir(out)
    cluster_path, tenants_path = cluster_and_tenants(cluster, tenants)
    inputs = dynamic.load_inputs(cluster_path, tenants_path, workload, days=days, start_day=start_day,
                                 skip_bad_rows=skip_bad_rows)
    rejected = inputs.workload.rejected
    if rejected:
        warn(f"skipped {len(rejected)} bad trace row(s) (first: {rejected[0]})")
    dynamic.check_has_jobs(inputs, days=days, start_day=start_day)
    unknown = inputs.unknown_vcs
    if unknown:
        warn(f"{sum(unknown.values())} job(s) of VC(s) not in {tenants_path} ({', '.join(sorted(unknown))}) "
             "will be rejected")
    prepare_out_dir(out)
    total = dynamic.step_count(inputs, presets)
    with RunProgress("simulating", total, "simulations", console=stderr_console(), announces_steps=True) as progress:
        run = dynamic.run_dynamic(inputs, presets, seed=seed, node_failures=node_failures, repair_hours=repair_hours,
                                  horizon_days=horizon_days, placement=placement, on_start=progress.start,
                                  on_step=progress.done)
    words = ["kubecell", "sim", "dynamic", *(w for path in workload for w in ("--workload", str(path)))]
    if cluster is not None:
        words += ["--cluster", str(cluster)]
    if tenants is not None:
        words += ["--tenants", str(tenants)]
    words += ["--tenancy", ",".join(presets), "--placement", placement, "--seed", str(seed)]
    if days is not None:
        words += ["--days", f"{days:g}"]
    if start_day:
        words += ["--start-day", f"{start_day:g}"]
    if node_failures:
        words += ["--node-failures", str(node_failures), "--repair-hours", f"{repair_hours:g}"]
    if horizon_days is not None:
        words += ["--horizon-days", f"{horizon_days:g}"]
    if skip_bad_rows:
        words.append("--skip-bad-rows")
    words += ["--out", str(out)]
    meta = {"command": shlex.join(words), "directory": os.getcwd(),
            **dynamic.run_meta(run, presets, placement=placement, seed=seed, days=days, horizon_days=horizon_days,
                               repair_hours=repair_hours)}
    page = dynamic.write_report(out, run, meta)
    preset_table, vc_table, notes = dynamic_tables(run.metrics, run.private)
    console = stdout_console()
    console.print(preset_table)
    console.print(vc_table)
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True, markup=False)
    console.print(f"{len(inputs.jobs)} jobs, {len(inputs.nodes)} nodes, placement {placement}; "
                  f"wall time {run.wall_seconds:.1f} s; report: {page}", soft_wrap=True, highlight=False, markup=False)
