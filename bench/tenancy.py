"""Speed of the multi-tenant engine: large gangs on large clusters, and a 30-day Philly simulation.

1. A 1,000-member gang on 5,000 nodes x 8 GPUs (racks of 20): the time of the scheduling cycle that
   places it (members of 1 and of 8 GPUs, with and without a rack constraint, on an empty and on a
   half-full cluster), and the time to reject a gang that can never fit.
2. The wall time of simulating a 30-day multi-VC window of the Philly-derived trace on the bundled
   512-GPU cluster under each tenancy policy (skipped with a message when ../shared/data is absent).

    python bench/tenancy.py [--skip-philly] [--start-day 30] [--days 30]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import Request, TopologyLevel, make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest

ROOT = Path(__file__).resolve().parent.parent
PCS = ROOT / ".." / "shared" / "data" / "philly" / "pcs_osdi24_per_vc_traces"


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


def gang_bench() -> None:
    print("1,000-member gangs on 5,000 nodes x 8 GPUs (racks of 20 nodes):")
    cases = [
        ("1 GPU each, no constraint", 1000, 1, None),
        ("8 GPUs each, no constraint", 1000, 8, None),
        ("1 GPU each, one rack (160 GPUs) -> rejected", 1000, 1, TopologyLevel.RACK),
        ("3,000 x 8 GPUs, beyond the VC's 20,000 -> borrows", 3000, 8, None),
    ]
    for fill in (False, True):
        for label, members, gpus, topology in cases:
            engine = big_engine()
            if fill:
                half_full(engine)
            elapsed, outcome = timed_cycle(engine, gang("g", members, gpus, topology))
            state = "half-full" if fill else "empty"
            print(f"  {state:9} {label:48} {elapsed * 1000:8.1f} ms  {outcome}")


def philly_bench(start_day: float, days: float) -> None:
    if not PCS.is_dir():
        print(f"Philly simulation skipped: {PCS} is absent")
        return
    from kubecell.cli.main import philly_example_paths
    from kubecell.sim.dynamic.runner import load_inputs
    from kubecell.sim.dynamic.simulator import DynamicSimulation

    cluster, tenants = philly_example_paths()
    inputs = load_inputs(cluster, tenants, [PCS], days=days, start_day=start_day)
    print(f"Philly-derived trace, days {start_day:g}-{start_day + days:g}: {len(inputs.jobs)} jobs on "
          f"{len(inputs.nodes)} nodes ({sum(n.gpu_count for n in inputs.nodes)} GPUs)")
    for policy in ("quota", "hived", "kubecell"):
        started = time.perf_counter()
        result = DynamicSimulation(inputs.nodes, inputs.tenants, PRESETS[policy], inputs.jobs).run()
        print(f"  {policy:9} {time.perf_counter() - started:7.1f} s wall  ({result.end / 86400:.0f} simulated days)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-philly", action="store_true")
    parser.add_argument("--start-day", type=float, default=30.0)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args()
    gang_bench()
    if not args.skip_philly:
        philly_bench(args.start_day, args.days)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
