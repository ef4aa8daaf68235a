"""The private-cluster baseline: each virtual cluster alone on a cluster made of exactly its guarantee.

HiveD's *sharing anomaly* is a tenant waiting longer in the shared cluster than it would have on a
private cluster of the resources it was promised. To measure it we need that private cluster: for one
VC, the nodes of its guaranteed cells and nothing else (node cells -> nodes of that machine's shape;
rack cells -> a full rack of such nodes; sub-node cells -> a node with that many GPUs and a
proportional share of the host's CPU and memory; pinned cells by their type). Node and sub-node cells
each get a rack of their own, because such a guarantee does not promise that they share a rack: a
rack-constrained gang fits the private cluster only if the VC was guaranteed a rack cell. The VC is
guaranteed every GPU of it and runs its own jobs alone with plain FIFO (no cells, no borrowing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import EngineOptions
from kubecell.core.model import Node, make_node
from kubecell.core.placement.registry import DEFAULT_POLICY
from kubecell.core.tenancy.config import Tenants, VirtualCluster, resolve_tenants
from kubecell.core.topology import CellChain, CellForest
from kubecell.sim.dynamic.simulator import DynamicSimulation, JobRecord, SimulationResult

PRIVATE_OPTIONS = EngineOptions("private", cells=False, borrowing=False, fair_share=False, lazy_preemption=False,
                                starvation_seconds=None)
"""One tenant alone: everything it runs is inside its guarantee, so no classes or preemption matter."""


@dataclass(slots=True)
class PrivateBaseline:
    """One VC's run on its private cluster."""

    vc: str
    nodes: list[Node]
    tenants: Tenants
    result: SimulationResult

    @property
    def records(self) -> dict[str, JobRecord]:
        return {record.name: record for record in self.result.records}

    @property
    def gpus(self) -> int:
        return sum(node.gpu_count for node in self.nodes)


def _template(forest: CellForest, chain: CellChain) -> Node:
    """A machine of the chain (they are identical in GPUs; host resources of the first one are used)."""
    cell = forest.cells_of_type(chain.type_name(chain.node_level))[0]
    return forest.nodes[cell.nodes[0]]


def _nvlink_groups(template: Node, gpus: int) -> list[list[int]]:
    """NVLink groups of a sub-node cell: sub-node cells follow the node's NVLink groups, so a cell no
    larger than a group is one group; a larger one keeps the template's group size."""
    groups = template.nvlink_groups
    if not groups or gpus <= min(len(g) for g in groups):
        return []
    size = len(groups[0])
    return [list(range(start, min(start + size, gpus))) for start in range(0, gpus, size)]


def private_nodes(forest: CellForest, vc: VirtualCluster, *, prefix: str | None = None) -> list[Node]:
    """The nodes of a private cluster equal to ``vc``'s guaranteed cells (preassigned and pinned)."""
    prefix = prefix if prefix is not None else f"private-{vc.name}-"
    wanted: Counter[tuple[str, int]] = Counter(vc.demand)
    for cell_id in vc.pinned:
        cell = forest.by_id[cell_id]
        wanted[(cell.chain.name, cell.level)] += 1
    nodes: list[Node] = []
    racks = 0

    def add(template: Node, gpus: int, rack: str | None) -> None:
        name = f"{prefix}{len(nodes):03d}"
        share = gpus / template.gpu_count
        nodes.append(make_node(
            name, cpu_milli=round(template.cpu_milli * share), memory_mib=round(template.memory_mib * share),
            gpu_count=gpus, gpu_model=template.gpu_model, gpu_memory_mib=template.gpus[0].memory_mib,
            nvlink_groups=template.nvlink_groups if gpus == template.gpu_count else _nvlink_groups(template, gpus),
            numa_groups=template.numa_groups if gpus == template.gpu_count else (),
            rack=rack if rack is not None else f"{name}-rack", zone=template.zone, labels=template.labels,
        ))

    for (chain_name, level), count in sorted(wanted.items()):
        chain = forest.chains[chain_name]
        template = _template(forest, chain)
        kind = chain.kinds[level]
        for _ in range(count):
            if kind == "rack":
                rack = f"{prefix}rack-{racks}"
                racks += 1
                for _ in range(chain.rack_nodes):
                    add(template, chain.node_gpus, rack)
            else:
                add(template, chain.sizes[level], None)
    return nodes


def private_tenants(vc_name: str, nodes: Sequence[Node], forest: CellForest | None = None) -> Tenants:
    """A single-VC configuration guaranteeing every GPU of ``nodes`` (all top-level cells)."""
    forest = forest or CellForest(nodes)
    cells = Counter(root.type_name for root in forest.roots)
    raw = {"virtualClusters": {vc_name: {"cells": dict(cells)}}}
    return resolve_tenants(raw, forest, source=f"private cluster of {vc_name}")


def run_private_baseline(
    forest: CellForest,
    tenants: Tenants,
    vc_name: str,
    jobs: Sequence[JobSpec],
    *,
    sample_seconds: float = 3600.0,
    checkpoint_seconds: float = 1800.0,
    horizon: float | None = None,
    placement: str = DEFAULT_POLICY,
) -> PrivateBaseline:
    """Run ``vc_name``'s jobs (the others are ignored) alone on its private cluster, placed with the same
    placement policy as the shared run."""
    vc = tenants.require(vc_name)
    nodes = private_nodes(forest, vc)
    own = CellForest(nodes)
    private = private_tenants(vc_name, nodes, own)
    mine = [job for job in jobs if job.vc == vc_name]
    result = DynamicSimulation(nodes, private, PRIVATE_OPTIONS, mine, sample_seconds=sample_seconds,
                               checkpoint_seconds=checkpoint_seconds, horizon=horizon, placement=placement).run()
    return PrivateBaseline(vc_name, nodes, private, result)
