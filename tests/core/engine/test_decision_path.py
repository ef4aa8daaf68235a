"""One decision path: the engine places jobs exactly where the packing experiment places pods.

The packing experiment (``kubecell sim packing``) replays pods one at a time through the placement
policy. Run through the engine instead (one single-member job per pod, submitted and scheduled one at a
time, with the same policy, arrival order, node order and random stream, and no tenancy pressure), the
final allocations must be identical, pod for pod: same node, same GPUs. No tenancy pressure means either
the quota policy with one VC guaranteed the whole cluster, or the kubecell policy with one VC that pins
every node (guaranteed placement inside its cells is then the whole cluster).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kubecell.cli.main import example_paths
from kubecell.core.book import AllocationBook
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import Node
from kubecell.core.placement.registry import PolicyContext, make_policy
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.sim.packing.experiment import run_packing, typical_pods_of
from kubecell.sim.packing.workload import arrival_sequence
from kubecell.sim.traces.openb import TracePod, load_nodes, load_pods
from tests.sim.support import openb_file


def engine_replay(nodes: Sequence[Node], pods: Sequence[TracePod], policy: str, seed: int, tenancy: str,
                  inflate: float = 1.3) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The packing protocol, driven through the engine: the same RNG draws in the same order (shuffle
    and inflation, then the node tie-break rank), one job per pod, a pod that does not fit now is
    withdrawn (in the packing experiment it fails for good)."""
    rng = np.random.default_rng(seed)
    total_gpu_milli = AllocationBook(nodes).total_gpu_milli
    sequence = arrival_sequence(pods, total_gpu_milli, inflate, rng)
    tie_rank = rng.permutation(len(nodes)).astype(np.int64)
    forest = CellForest(nodes)
    vc: dict[str, Any]
    if tenancy == "quota":
        vc = {"cells": dict(Counter(cell.type_name for cell in forest.roots))}
    else:
        vc = {"pinnedCells": [cell.id for cell in forest.roots]}
    tenants = resolve_tenants({"virtualClusters": {"all": vc}}, forest)
    policy_object = make_policy(policy, PolicyContext(typical_pods_of(pods)))
    engine = Engine(nodes, tenants, PRESETS[tenancy], forest=forest, placement=policy_object, tie_rank=tie_rank,
                    rng=rng)
    for tick, pod in enumerate(sequence):
        engine.submit(JobSpec(name=pod.name, vc="all", member=pod.request()), float(tick))
        engine.schedule(float(tick))
        if engine.jobs[pod.name].phase == JobPhase.PENDING:
            engine.cancel(pod.name, float(tick))
    engine.check_invariants()
    return {name: (allocation.node, allocation.gpu_indices) for name, allocation in
            ((name.rsplit("/", 1)[0], allocation) for name, allocation in engine.book.allocations.items())}


def packing_replay(nodes: Sequence[Node], pods: Sequence[TracePod], policy: str, seed: int,
                   inflate: float = 1.3) -> dict[str, tuple[str, tuple[int, ...]]]:
    record = run_packing(nodes, pods, policy, seed, inflate=inflate, typical=typical_pods_of(pods),
                         record_placements=True)
    assert record.placements is not None
    return record.placements


@pytest.mark.parametrize("tenancy", ["quota", "kubecell"])
@pytest.mark.parametrize(("policy", "seed"), [("kubecell", 1), ("kubecell", 7), ("fgd", 3), ("bestfit", 5),
                                              ("gpupacking", 2), ("random", 4)])
def test_engine_places_every_pod_where_the_packing_experiment_does(policy: str, seed: int, tenancy: str) -> None:
    nodes_path, pods_path = example_paths()
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    expected = packing_replay(nodes, pods, policy, seed)
    actual = engine_replay(nodes, pods, policy, seed, tenancy)
    assert len(expected) > 300
    differing = sorted(name for name in expected.keys() | actual.keys() if expected.get(name) != actual.get(name))
    assert not differing, [(name, expected.get(name), actual.get(name)) for name in differing[:5]]


@pytest.mark.shared_data
def test_same_allocations_on_the_openb_default_trace() -> None:
    nodes = load_nodes(openb_file("csv", "openb_node_list_gpu_node.csv"))
    pods = load_pods(openb_file("csv", "openb_pod_list_default.csv"))
    expected = packing_replay(nodes, pods, "kubecell", 42)
    actual = engine_replay(nodes, pods, "kubecell", 42, "kubecell")
    assert len(expected) > 7000
    assert expected == actual
