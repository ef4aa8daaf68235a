"""The physical topology as a tree of cells: cluster > zone > rack > node > NUMA > NVLink group > GPU.

HiveD's insight is that tenants must be guaranteed *cells* (a GPU, an NVLink pair, a whole node, a rack),
not GPU counts, because eight free GPUs scattered over eight nodes do not run an eight-GPU job. The same
tree serves placement (keep a request inside one cell of a level) and tenancy (guarantee cells).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kubecell.core.model import Node, TopologyLevel

RACK_LABELS = ("kubecell.io/rack", "topology.kubecell.io/rack", "cloud.google.com/gke-placement-group")
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")


def rack_and_zone_from_labels(
    labels: Mapping[str, str],
    rack_keys: Sequence[str] = RACK_LABELS,
    zone_keys: Sequence[str] = ZONE_LABELS,
) -> tuple[str, str]:
    """Read a node's rack and zone from the first label key present (empty when none is)."""
    rack = next((labels[k] for k in rack_keys if labels.get(k)), "")
    zone = next((labels[k] for k in zone_keys if labels.get(k)), "")
    return rack, zone


@dataclass(slots=True)
class Cell:
    """One cell of the tree. Leaves are GPU cells; ``gpus`` lists (node, GPU index) under the cell."""

    level: TopologyLevel
    name: str
    children: list[Cell] = field(default_factory=list)
    gpus: list[tuple[str, int]] = field(default_factory=list)
    gpu_model: str = ""

    def walk(self) -> Iterator[Cell]:
        yield self
        for child in self.children:
            yield from child.walk()

    def at_level(self, level: TopologyLevel) -> list[Cell]:
        return [cell for cell in self.walk() if cell.level == level]

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


def _node_cell(node: Node) -> Cell:
    cell = Cell(TopologyLevel.NODE, node.name, gpu_model=node.gpu_model)
    numa_groups = node.groups_at(TopologyLevel.NUMA)
    nvlink_groups = node.groups_at(TopologyLevel.NVLINK)
    for numa_index, numa in enumerate(numa_groups):
        numa_cell = Cell(TopologyLevel.NUMA, f"{node.name}/numa{numa_index}", gpu_model=node.gpu_model)
        members = set(numa)
        for link_index, group in enumerate(nvlink_groups):
            # An NVLink domain spanning NUMA nodes belongs to the NUMA node of its first GPU.
            if not members.issuperset(group) and group[0] not in members:
                continue
            link_cell = Cell(
                TopologyLevel.NVLINK, f"{node.name}/nvlink{link_index}", gpu_model=node.gpu_model
            )
            for index in group:
                gpu_cell = Cell(TopologyLevel.GPU, f"{node.name}/gpu{index}", gpu_model=node.gpu_model)
                gpu_cell.gpus.append((node.name, index))
                link_cell.children.append(gpu_cell)
                link_cell.gpus.append((node.name, index))
            numa_cell.children.append(link_cell)
            numa_cell.gpus.extend(link_cell.gpus)
        cell.children.append(numa_cell)
        cell.gpus.extend(numa_cell.gpus)
    return cell


def build_cell_tree(nodes: Iterable[Node]) -> Cell:
    """Arrange nodes into cluster > zone > rack > node cells (zone/rack '' form one default cell)."""
    root = Cell(TopologyLevel.CLUSTER, "cluster")
    zones: dict[str, Cell] = {}
    racks: dict[tuple[str, str], Cell] = {}
    for node in nodes:
        zone = zones.get(node.zone)
        if zone is None:
            zone = zones[node.zone] = Cell(TopologyLevel.ZONE, node.zone or "default-zone")
            root.children.append(zone)
        rack = racks.get((node.zone, node.rack))
        if rack is None:
            rack = racks[(node.zone, node.rack)] = Cell(TopologyLevel.RACK, node.rack or f"{zone.name}/rack")
            zone.children.append(rack)
        node_cell = _node_cell(node)
        rack.children.append(node_cell)
        for cell in (rack, zone, root):
            cell.gpus.extend(node_cell.gpus)
    return root
