"""The arrival sequence of the packing experiment: seeded shuffle, then inflation to a target load.

Steps (FGD simulator, ``SortClusterPods`` and ``TunePodsByNodeTotalResource``): sort pods by name and
shuffle them with the run's seed; while the total GPU request is below ``inflate`` x cluster capacity,
append a copy of a pod drawn uniformly (with replacement) from the original list, stopping at the first
draw that would exceed the target. The stop test adds the drawn pod's *per-GPU* share, not its total,
as the authors' code does, so multi-GPU copies can overshoot slightly. Above the target, random pods
are removed instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kubecell.sim.traces.openb import TracePod


def arrival_sequence(
    pods: Sequence[TracePod], cluster_gpu_milli: int, inflate: float, rng: np.random.Generator
) -> list[TracePod]:
    """The pods in arrival order for one seeded run (copies get unique names ``<name>-tuned-<i>``)."""
    ordered = sorted(pods, key=lambda pod: pod.name)
    sequence = [ordered[i] for i in rng.permutation(len(ordered))]
    if inflate <= 0 or not any(pod.gpu_milli for pod in ordered):
        return sequence  # nothing to tune, or a CPU-only list that can never reach a GPU target
    requested = sum(pod.total_gpu_milli for pod in ordered)
    target = inflate * cluster_gpu_milli
    if requested < target:
        copies = 0
        while True:
            drawn = ordered[int(rng.integers(len(ordered)))]
            if requested + drawn.gpu_milli > target:
                break
            sequence.append(replace(drawn, name=f"{drawn.name}-tuned-{copies}"))
            requested += drawn.total_gpu_milli
            copies += 1
    else:
        while requested > target and sequence:
            removed = sequence.pop(int(rng.integers(len(sequence))))
            requested -= removed.total_gpu_milli
    return sequence
