"""Speed of the multi-tenant engine: large gangs on large clusters, and a 30-day Philly simulation.

1. A 1,000-member gang on 5,000 nodes x 8 GPUs (racks of 20): the time to submit it and run the
   scheduling cycle that places it (members of 1 and of 8 GPUs, with and without a rack constraint, on
   an empty and on a half-full cluster), and the time to reject a gang that can never fit. Submission
   includes what the placement policy learns from the arrivals.
2. The time to resolve the whole-cluster default tenancy on 5,000 nodes without racks: it pins every node,
   and the scheduler resolves it at every rebuild (a node added or lost), on its scheduling thread.
3. The wall time of simulating a 30-day multi-VC window of the Philly-derived trace on the bundled
   512-GPU cluster under each tenancy policy (skipped with a message when ../shared/data is absent).

    python bench/tenancy.py [--skip-philly] [--start-day 30] [--days 30] [--repeat 5]
    python bench/tenancy.py --baseline a1b5478      # the same measurements on that commit, side by side

With ``--baseline REV`` every measurement runs in a fresh process, alternately on a checkout of REV
(``git worktree``, removed afterwards) and on this tree, so both see the same machine at the same time;
each gang case reports the median of ``--repeat`` runs, and the last column is this tree / REV.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import Request, TopologyLevel, make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest

ROOT = Path(__file__).resolve().parent.parent
PCS = ROOT / ".." / "shared" / "data" / "philly" / "pcs_osdi24_per_vc_traces"
GANG_CASES = {
    "1gpu": ("1 GPU each, no constraint", 1000, 1, None),
    "8gpu": ("8 GPUs each, no constraint", 1000, 8, None),
    "rack": ("1 GPU each, one rack (160 GPUs) -> rejected", 1000, 1, TopologyLevel.RACK),
    "borrow": ("3,000 x 8 GPUs, beyond the VC's 20,000 -> borrows", 3000, 8, None),
}
POLICIES = ("quota", "hived", "kubecell")


def big_engine(nodes: int = 5000, rack: int = 20, policy: str = "kubecell") -> Engine:
    cluster = [make_node(f"n{i:05d}", cpu_milli=96_000, memory_mib=786_432, gpu_count=8, gpu_model="A100",
                         rack=f"r{i // rack:04d}") for i in range(nodes)]
    forest = CellForest(cluster)
    racks = nodes // rack
    tenants = resolve_tenants({"virtualClusters": {
        "big": {"cells": {"A100x8/rack": racks // 2}},
        "small": {"cells": {"A100x8/node": (racks - racks // 2) * rack}},
    }}, forest)
    return Engine(cluster, tenants, PRESETS[policy], forest=forest)


def gang(name: str, members: int, gpus: int, topology: TopologyLevel | None, vc: str = "big") -> JobSpec:
    member = Request(name, cpu_milli=4_000 * gpus, memory_mib=32_000 * gpus, gpu_count=gpus, gpu_milli=1000)
    return JobSpec(name=name, vc=vc, member=member, members=members, topology=topology)


def timed_cycle(engine: Engine, spec: JobSpec) -> tuple[float, str]:
    started = time.perf_counter()
    job = engine.submit(spec, 0.0)
    engine.schedule(0.0)
    elapsed = time.perf_counter() - started
    return elapsed, f"{job.phase.value} ({job.size}/{spec.members} members)"


def half_full(engine: Engine) -> None:
    rng = np.random.default_rng(1)
    for i in range(8000):
        engine.submit(gang(f"fill-{i}", 1, int(rng.choice([1, 2, 4, 8])), None, vc="small"), 0.0)
    engine.schedule(0.0)


def measure_gang(case: str, fill: bool, repeat: int) -> dict[str, Any]:
    _, members, gpus, topology = GANG_CASES[case]
    times: list[float] = []
    outcome = ""
    for _ in range(repeat):
        engine = big_engine()
        if fill:
            half_full(engine)
        elapsed, outcome = timed_cycle(engine, gang("g", members, gpus, topology))
        times.append(elapsed)
    return {"seconds": statistics.median(times), "outcome": outcome}


def measure_philly(policy: str, start_day: float, days: float) -> dict[str, Any]:
    from kubecell.cli.main import philly_example_paths
    from kubecell.sim.dynamic.runner import load_inputs
    from kubecell.sim.dynamic.simulator import DynamicSimulation

    cluster, tenants = philly_example_paths()
    inputs = load_inputs(cluster, tenants, [PCS], days=days, start_day=start_day)
    started = time.perf_counter()
    result = DynamicSimulation(inputs.nodes, inputs.tenants, PRESETS[policy], inputs.jobs).run()
    return {"seconds": time.perf_counter() - started, "outcome": f"{result.end / 86400:.0f} simulated days",
            "jobs": len(inputs.jobs)}


def measure_pins(nodes: int, repeat: int) -> dict[str, Any]:
    cluster = [make_node(f"n{i:05d}", cpu_milli=96_000, memory_mib=786_432, gpu_count=8, gpu_model="A100")
               for i in range(nodes)]
    forest = CellForest(cluster)
    pins = {"virtualClusters": {"default": {"pinnedCells": [root.id for root in forest.roots]}}}
    times: list[float] = []
    gpus = 0
    for _ in range(repeat):
        started = time.perf_counter()
        gpus = resolve_tenants(pins, forest).require("default").guaranteed_gpus
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times), "outcome": f"{gpus} GPUs pinned"}


def measure(what: str, args: argparse.Namespace) -> dict[str, Any]:
    kind, _, rest = what.partition(":")
    if kind == "pins":
        return measure_pins(int(rest), args.repeat)
    if kind == "gang":
        fill, _, case = rest.partition(":")
        return measure_gang(case, fill == "half", args.repeat)
    return measure_philly(rest, args.start_day, args.days)


def measurements(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(key, label) of every measurement, in the order they are printed."""
    out = [(f"gang:{fill}:{case}", f"{fill + '-full' if fill == 'half' else fill:9} {label}")
           for fill in ("empty", "half") for case, (label, *_) in GANG_CASES.items()]
    out.append(("pins:5000", "whole-cluster default, 5,000 nodes without racks, resolved"))
    if not args.skip_philly and PCS.is_dir():
        out += [(f"philly:{policy}", f"Philly days {args.start_day:g}-{args.start_day + args.days:g}: {policy}")
                for policy in POLICIES]
    return out


def run_in(tree: Path, what: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process that imports kubecell from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", what, "--repeat", str(args.repeat),
               "--start-day", str(args.start_day), "--days", str(args.days)]
    output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="kubecell-baseline-") as scratch:
        baseline = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(baseline),
                        args.baseline], check=True)
        try:
            commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                                    capture_output=True, text=True).stdout.strip()
            print(f"{'measurement':62} {args.baseline:>12} {commit + ' (this tree)':>20} {'ratio':>7}")
            if args.skip_philly or not PCS.is_dir():
                print(f"(Philly simulation skipped: {PCS} is absent)" if not args.skip_philly else "")
            for what, label in measurements(args):
                before = run_in(baseline, what, args)
                after = run_in(ROOT, what, args)
                ratio = after["seconds"] / before["seconds"] if before["seconds"] > 0 else float("nan")
                unit, scale = ("ms", 1000.0) if what.startswith(("gang", "pins")) else ("s", 1.0)
                print(f"{label:62} {before['seconds'] * scale:9.1f} {unit:2} {after['seconds'] * scale:17.1f} {unit:2} "
                      f"{ratio:6.2f}x   {after['outcome']}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument("--start-day", type=float, default=30.0)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each gang case (the median is reported)")
    parser.add_argument("--baseline", help="a git revision to measure side by side with this tree")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one measurement, as JSON (used by --baseline)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return 0
    if args.baseline:
        compare(args)
        return 0
    print("1,000-member gangs on 5,000 nodes x 8 GPUs (racks of 20 nodes), submit + one cycle:")
    if not args.skip_philly and not PCS.is_dir():
        print(f"(Philly simulation skipped: {PCS} is absent)")
    for what, label in measurements(args):
        result = measure(what, args)
        unit, scale = ("ms", 1000.0) if what.startswith(("gang", "pins")) else ("s wall", 1.0)
        print(f"  {label:62} {result['seconds'] * scale:8.1f} {unit}  {result['outcome']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
