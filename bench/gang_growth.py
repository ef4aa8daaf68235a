"""What a gang's stated headcount costs a scheduling cycle: gangs that say they may grow to millions of members
(``kubecell.io/group-max``, up to ``MAX_GANG_MEMBERS``) but have one pod each, against gangs that say 2.

Anyone who may create a pod states its gang's headcount, and the engine tries to grow every running gang
below it at each cycle. Growth adds no more members than there are pods (``Job.spare``), so the cost of a
cycle must not grow with the headcount a pod states. Before this bench, growth listed every missing member
index each time (0.5 s per such gang and cycle at 4,194,304).

    python bench/gang_growth.py [--gangs 10] [--cycles 5] [--nodes 16]

Printed: the mean wall time of one engine cycle with ``--gangs`` running one-pod gangs, each stating the
largest headcount, then the same with a headcount of 2, and their ratio (measured in this process).
"""

from __future__ import annotations

import argparse
import statistics
import time

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.core.model import MILLI_PER_GPU, Request, make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest


def cluster_with_gangs(nodes: int, gangs: int, headcount: int) -> Engine:
    """An engine of ``nodes`` 8-GPU nodes whose VC runs ``gangs`` gangs of one member (one pod each, the
    driver's ``spare`` says no more) that state ``headcount`` members."""
    machines = [make_node(f"n{i}", cpu_milli=128_000, memory_mib=1 << 20, gpu_count=8, gpu_model="V100M32")
                for i in range(nodes)]
    forest = CellForest(machines)
    tenants = resolve_tenants({"virtualClusters": {"a": {"gpus": nodes * 8}}}, forest)
    engine = Engine(machines, tenants, PRESETS["kubecell"].with_(resize_min_interval_seconds=0), forest=forest)
    for index in range(gangs):
        name = f"gang-{index}"
        member = Request(name=name, gpu_count=1, gpu_milli=MILLI_PER_GPU)
        engine.submit(JobSpec(name=name, vc="a", member=member, members=headcount, min_members=1), 0.0)
        engine.limit_growth(name, (1,))
    engine.schedule(1.0)
    for index in range(gangs):
        engine.limit_growth(f"gang-{index}", (0,))  # its one pod is bound: no pod for another member
    return engine


def cycle_seconds(engine: Engine, cycles: int) -> float:
    times = []
    for cycle in range(cycles):
        began = time.perf_counter()
        engine.schedule(2.0 + cycle)
        times.append(time.perf_counter() - began)
    return statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gangs", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=16)
    args = parser.parse_args()
    for name, value in (("--gangs", args.gangs), ("--cycles", args.cycles), ("--nodes", args.nodes)):
        if not 1 <= value <= 10_000:
            parser.error(f"{name} {value}: give a whole number from 1 to 10000")
    stated = cycle_seconds(cluster_with_gangs(args.nodes, args.gangs, MAX_GANG_MEMBERS), args.cycles)
    small = cycle_seconds(cluster_with_gangs(args.nodes, args.gangs, 2), args.cycles)
    print(f"{args.gangs} running one-pod gangs on {args.nodes} nodes, mean of {args.cycles} cycles")
    print(f"  headcount {MAX_GANG_MEMBERS:>9,}: {1000 * stated:8.2f} ms per cycle")
    print(f"  headcount {2:>9,}: {1000 * small:8.2f} ms per cycle")
    print(f"  ratio: {stated / small:.2f}")


if __name__ == "__main__":
    main()
