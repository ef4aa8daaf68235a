"""A made-up but realistic ``Snapshot`` of any size, for the dashboard's bench and its documentation screenshot.

Realistic means what the map must cope with: most GPUs taken, many of them by fractions of several pods,
a few VCs of unequal size, some unhealthy GPUs and cordoned nodes, a queue and a decision log. Seeded, so a
figure or a picture made from it can be made again.
"""

from __future__ import annotations

import random

from kubecell.scheduler.observe.snapshot import Decision, GpuCell, NodeCell, PendingJob, Snapshot, VcState

VCS = ("research", "production", "vision", "speech", "interns")
MODELS = (("A100-SXM4-80GB", 81920), ("V100-SXM2-32GB", 32768), ("T4", 15360))
REASONS = (("quota", "VC {vc} would exceed its guarantee and nothing is idle to borrow"),
           ("capacity", "0/{n} nodes fit: {n} lack free GPU share"),
           ("gang", "gang of 4 waits for 2 more members"),
           ("constraints", "0/{n} nodes match the node selector gpu=a100"))


def synthetic_snapshot(nodes: int = 5000, gpus_per_node: int = 8, *, fill: float = 0.85, seed: int = 1,
                       cycle: int = 1, taken_at: float = 1_800_000_000.0, pending: int = 300,
                       decisions: int = 100) -> Snapshot:
    """``nodes`` x ``gpus_per_node`` GPUs, about ``fill`` of them allocated (a third of those fractionally)."""
    rng = random.Random(seed)
    weights = [rng.uniform(0.5, 3.0) for _ in VCS]
    node_cells: list[NodeCell] = []
    gpus: list[GpuCell] = []
    pod_serial = 0
    held = dict.fromkeys(VCS, 0.0)
    for n in range(nodes):
        name = f"node-{n:05d}"
        model, memory = MODELS[0 if n % 3 else (1 if n % 2 else 2)]
        excluded = "cordoned" if rng.random() < 0.004 else ""
        node_cells.append(NodeCell(name, excluded, rack=f"rack-{n // 32:03d}"))
        for index in range(gpus_per_node):
            healthy = rng.random() > 0.003
            owners: tuple[str, ...] = ()
            pods: tuple[str, ...] = ()
            milli = 0
            if not excluded and rng.random() < fill:
                vc = rng.choices(VCS, weights)[0]
                if rng.random() < 0.33:
                    shares = rng.choice(((500, 500), (250, 250, 250), (300,), (500,), (100, 200)))
                    milli = sum(shares)
                    pods = tuple(f"{vc}/infer-{pod_serial + i}" for i in range(len(shares)))
                    pod_serial += len(shares)
                else:
                    milli = 1000
                    pods = (f"{vc}/train-{pod_serial // 8}-{index}",)
                    pod_serial += 1
                owners = (vc,)
                held[vc] += milli / 1000
            gpus.append(GpuCell(name, index, model, healthy, milli, 0, memory, owners, pods))
    total = nodes * gpus_per_node
    share = sum(weights)
    vcs = tuple(VcState(vc, round(total * 0.8 * w / share), min(held[vc], total * 0.8 * w / share),
                        max(0.0, held[vc] - total * 0.8 * w / share), 0.0, rng.randint(0, pending),
                        int(held[vc] / 2)) for vc, w in zip(VCS, weights, strict=True))
    pending_jobs = tuple(
        PendingJob(f"{vc}/job-{i}", vc, (f"{vc}/job-{i}-0",), rng.choice((0.5, 1.0, 4.0, 8.0)),
                   rng.uniform(1, 3600), reason.format(vc=vc, n=nodes), kind)
        for i in range(pending) for vc in [rng.choice(VCS)] for kind, reason in [rng.choice(REASONS)])
    decision_log = tuple(
        Decision(taken_at - (decisions - i), f"{vc}/job-{pending + i}", vc, "placed",
                 (f"node-{rng.randrange(nodes):05d}",), (f"node-{rng.randrange(nodes):05d}/{rng.randrange(8)}",),
                 round(rng.uniform(0, 1), 4)) for i in range(decisions) for vc in [rng.choice(VCS)])
    allocated = sum(g.milli_allocated for g in gpus) / 1000
    return Snapshot(taken_at, cycle, True, False, tuple(node_cells), tuple(gpus), vcs, pending_jobs, decision_log,
                    fragmentation=0.12, unallocated_gpus=total - allocated, running_jobs=pod_serial)
