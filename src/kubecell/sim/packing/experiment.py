"""One run of the packing experiment: one policy, one seed, one node list, one pod list.

The run is online and final: each pod is placed or fails for good, nothing leaves, nothing retries.
After every arrival it records the arrived GPU request (failed pods included), the allocated GPU
milli, the cluster's fragmentation against the typical pods of the *original* list, and the idle GPU
milli, which is all the paper's metrics need.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubecell.core.book import AllocationBook
from kubecell.core.model import Node
from kubecell.core.placement.frag import FragmentationMeasure, TypicalPod, typical_pods
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.registry import PolicyContext, make_policy
from kubecell.sim.packing.workload import arrival_sequence
from kubecell.sim.traces.openb import TracePod

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Per-arrival series of one run (all in milli-GPU) and its totals."""

    policy: str
    seed: int
    cluster_gpu_milli: int
    arrived: IntArray
    allocated: IntArray
    fragment: FloatArray
    idle: IntArray
    placed: int
    failed: int
    seconds: float
    placements: dict[str, tuple[str, tuple[int, ...]]] | None = None
    """Pod name -> (node name, GPU indices), when asked for (to compare decision paths)."""

    @property
    def decisions(self) -> int:
        return self.placed + self.failed


def typical_pods_of(pods: Sequence[TracePod]) -> list[TypicalPod]:
    """The FGD target workload: shapes covering 95 % of the original list, CPU-only pods included."""
    return typical_pods((pod.shape for pod in pods), coverage=0.95, include_cpu_pods=True)


def run_packing(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    *,
    inflate: float = 1.3,
    typical: Sequence[TypicalPod] | None = None,
    record_placements: bool = False,
) -> RunRecord:
    """Replay ``pods`` onto an empty cluster of ``nodes`` with ``policy``; one RNG per seed drives
    the shuffle, the inflation draws, the tie-break rank of nodes and any random choices.
    ``record_placements`` keeps where every placed pod went."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    typical = list(typical) if typical is not None else typical_pods_of(pods)
    book = AllocationBook(nodes)
    sequence = arrival_sequence(pods, book.total_gpu_milli, inflate, rng)
    # The FGD simulator renames nodes "<random index>-<name>" and breaks ties by the smallest name,
    # i.e. by a random node order fixed for the run.
    tie_rank = rng.permutation(book.size).astype(np.int64)
    placer = Placer(book, make_policy(policy, PolicyContext(typical)), rng=rng, tie_rank=tie_rank)
    measure = FragmentationMeasure(typical, book.model_names)
    node_fragment = measure.node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id)

    count = len(sequence)
    arrived = np.empty(count, np.int64)
    allocated = np.empty(count, np.int64)
    fragment = np.empty(count, np.float64)
    idle = np.empty(count, np.int64)
    arrived_milli = allocated_milli = 0
    idle_milli = int(book.total_avail.sum())
    fragment_total = float(node_fragment.sum())
    failed = 0
    placements: dict[str, tuple[str, tuple[int, ...]]] | None = {} if record_placements else None
    for i, pod in enumerate(sequence):
        request = pod.request()
        arrived_milli += pod.total_gpu_milli
        placement = placer.place(request)
        if placement is None:
            failed += 1
        else:
            book.allocate(request, placement.node, placement.gpus)
            if placements is not None:
                placements[pod.name] = (book.nodes[placement.node].name, placement.gpus)
            row = np.array([placement.node], np.int64)
            new = measure.node_fragmentation(book.cpu_free[row], book.gpu_avail[row], book.model_id[row])[0]
            fragment_total += new - node_fragment[placement.node]
            node_fragment[placement.node] = new
            allocated_milli += pod.total_gpu_milli
            idle_milli -= pod.total_gpu_milli
        arrived[i] = arrived_milli
        allocated[i] = allocated_milli
        fragment[i] = fragment_total
        idle[i] = idle_milli
    # Recompute the fragmentation sum exactly at the end to bound floating drift of the running sum.
    fragment[-1:] = float(node_fragment.sum()) if count else fragment[-1:]
    return RunRecord(
        policy=policy,
        seed=seed,
        cluster_gpu_milli=book.total_gpu_milli,
        arrived=arrived,
        allocated=allocated,
        fragment=fragment,
        idle=idle,
        placed=count - failed,
        failed=failed,
        seconds=time.perf_counter() - started,
        placements=placements,
    )
