"""The physical topology as a forest of cells, one chain per kind of machine (HiveD's cell model).

HiveD's insight is that tenants must be guaranteed *cells* (a GPU, an NVLink quad, a whole node, a
rack), not GPU counts, because eight free GPUs scattered over eight nodes do not run an eight-GPU job.
A *chain* groups machines of one GPU model and size (e.g. ``V100M32x8``: 8 x V100-32GB); its levels
are the GPU, power-of-two groups inside the node aligned with NVLink groups where known (``2gpu``,
``4gpu``), the node, and the rack when every node of the chain sits in equally sized racks. A cell
type is ``<chain>/<kind>``, e.g. ``V100M32x8/node``.

The same forest serves placement (keep a request inside one cell) and tenancy (guarantee cells).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node

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


def kind_name(size: int) -> str:
    return "gpu" if size == 1 else f"{size}gpu"


@dataclass(frozen=True, slots=True)
class CellChain:
    """One kind of machine. ``kinds``/``sizes`` go bottom-up: sizes are GPUs per cell of each level."""

    name: str
    model: str
    node_gpus: int
    kinds: tuple[str, ...]
    sizes: tuple[int, ...]
    rack_nodes: int = 0

    @property
    def node_level(self) -> int:
        return self.kinds.index("node")

    @property
    def top_level(self) -> int:
        return len(self.kinds) - 1

    def level_of(self, kind: str) -> int:
        return self.kinds.index(kind)

    def type_name(self, level: int) -> str:
        return f"{self.name}/{self.kinds[level]}"

    def fanout(self, level: int) -> int:
        """Children per cell at ``level`` (level >= 1)."""
        return self.sizes[level] // self.sizes[level - 1]


@dataclass(eq=False, slots=True)
class Cell:
    """A physical cell. ``gpus`` lists (node index, GPU index) pairs under it."""

    id: str
    chain: CellChain
    level: int
    gpus: tuple[tuple[int, int], ...]
    nodes: tuple[int, ...]
    parent: Cell | None = None
    children: list[Cell] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.chain.kinds[self.level]

    @property
    def type_name(self) -> str:
        return self.chain.type_name(self.level)

    @property
    def size(self) -> int:
        return len(self.gpus)

    def walk(self) -> Iterator[Cell]:
        yield self
        for child in self.children:
            yield from child.walk()

    def ancestors(self) -> Iterator[Cell]:
        cell = self.parent
        while cell is not None:
            yield cell
            cell = cell.parent

    def __repr__(self) -> str:
        return f"Cell({self.id}, {self.type_name})"


def _sub_node_sizes(node_gpus: int) -> list[int]:
    sizes = []
    size = node_gpus
    while size % 2 == 0 and size > 1:
        size //= 2
        sizes.append(size)
    if not sizes or sizes[-1] != 1:
        sizes.append(1)
    return sorted(set(sizes))


def _gpu_order(node: Node) -> list[int]:
    """GPU indices ordered so that each NVLink group is contiguous (sub-node cells follow it)."""
    if node.nvlink_groups:
        return [i for group in node.nvlink_groups for i in sorted(group)]
    return list(range(node.gpu_count))


class CellForest:
    """All physical cells of a cluster. Node indices follow the order of ``nodes`` (the book's order)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.chains: dict[str, CellChain] = {}
        self.roots: list[Cell] = []
        self.by_id: dict[str, Cell] = {}
        self.node_cell: list[Cell | None] = [None] * len(self.nodes)
        self.gpu_cell: dict[tuple[int, int], Cell] = {}
        self.notes: list[str] = []

        members: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            if node.gpu_count:
                members.setdefault(f"{node.gpu_model}x{node.gpu_count}", []).append(index)
        chains_of: dict[tuple[str, str], set[str]] = {}
        for chain_name, indices in members.items():
            for i in indices:
                chains_of.setdefault((self.nodes[i].zone, self.nodes[i].rack), set()).add(chain_name)
        self._shared_racks = {rack for rack, chains in chains_of.items() if rack[1] and len(chains) > 1}
        """Racks that hold machines of several chains: each chain's rack cell there is named ``rack/chain``."""
        for chain_name, indices in sorted(members.items()):
            self._build_chain(chain_name, indices)
        self._types: dict[str, list[Cell]] = {}
        for root in self.roots:
            for cell in root.walk():
                self._types.setdefault(cell.type_name, []).append(cell)

    def _build_chain(self, name: str, indices: list[int]) -> None:
        first = self.nodes[indices[0]]
        sub = _sub_node_sizes(first.gpu_count)
        racks: dict[tuple[str, str], list[int]] = {}
        for i in indices:
            racks.setdefault((self.nodes[i].zone, self.nodes[i].rack), []).append(i)
        rack_sizes = {len(v) for v in racks.values()}
        has_racks = all(rack for _, rack in racks) and len(rack_sizes) == 1
        if not has_racks and any(rack for _, rack in racks):
            self.notes.append(
                f"chain {name}: racks are missing on some nodes or differ in size "
                f"({sorted(rack_sizes)} nodes); no rack-level cells for this chain"
            )
        kinds = [kind_name(s) for s in sub] + ["node"]
        sizes = [*sub, first.gpu_count]
        rack_nodes = 0
        if has_racks:
            rack_nodes = rack_sizes.pop()
            kinds.append("rack")
            sizes.append(first.gpu_count * rack_nodes)
        chain = CellChain(name, first.gpu_model, first.gpu_count, tuple(kinds), tuple(sizes), rack_nodes)
        self.chains[name] = chain
        if has_racks:
            for (zone, rack), rack_members in sorted(racks.items()):
                rack_id = f"{zone}/{rack}" if zone else rack
                if (zone, rack) in self._shared_racks:  # (two cells of one name, refused, before)
                    rack_id = f"{rack_id}/{name}"
                node_cells = [self._build_node(chain, i) for i in rack_members]
                rack_cell = Cell(rack_id, chain, chain.top_level, tuple(g for c in node_cells for g in c.gpus),
                                 tuple(rack_members), None, node_cells)
                for child in node_cells:
                    child.parent = rack_cell
                self._register(rack_cell)
                self.roots.append(rack_cell)
        else:
            for i in indices:
                self.roots.append(self._build_node(chain, i))

    def _register(self, cell: Cell) -> None:
        if cell.id in self.by_id:
            raise InvalidInputError(f"two topology cells are both named {cell.id!r}", field="rack",
                                    accepted="rack names distinct from node names")
        self.by_id[cell.id] = cell

    def _build_node(self, chain: CellChain, index: int) -> Cell:
        node = self.nodes[index]
        order = _gpu_order(node)
        level = chain.node_level
        node_cell = Cell(node.name, chain, level, tuple((index, g) for g in order), (index,))
        self._register(node_cell)
        self.node_cell[index] = node_cell
        self._split(node_cell, level)
        return node_cell

    def _split(self, cell: Cell, level: int) -> None:
        """Children of a node or sub-node cell: consecutive blocks of the node's GPU order."""
        if level == 0:
            self.gpu_cell[cell.gpus[0]] = cell
            return
        node = self.nodes[cell.nodes[0]]
        node_order = self.node_cell[cell.nodes[0]]
        assert node_order is not None
        positions = {gpu: p for p, gpu in enumerate(node_order.gpus)}
        size = cell.chain.sizes[level - 1]
        for start in range(0, len(cell.gpus), size):
            gpus = cell.gpus[start:start + size]
            if level - 1 == 0:
                child_id = f"{node.name}/gpu{gpus[0][1]}"
            else:
                child_id = f"{node.name}/{cell.chain.kinds[level - 1]}{positions[gpus[0]] // size}"
            child = Cell(child_id, cell.chain, level - 1, gpus, cell.nodes, cell)
            self._register(child)
            cell.children.append(child)
            self._split(child, level - 1)

    # ------------------------------------------------------------------ queries
    def type_names(self) -> list[str]:
        return sorted(self._types)

    def cells_of_type(self, type_name: str) -> list[Cell]:
        return self._types.get(type_name, [])

    def cell(self, cell_id: str, *, location: str | None = None) -> Cell:
        try:
            return self.by_id[cell_id]
        except KeyError:
            raise InvalidInputError(f"unknown cell {cell_id!r}", location=location,
                                    accepted="a node name, a rack name, or <node>/<sub-cell> ids such as "
                                    + ", ".join(sorted(self.by_id)[:4]) + " ...") from None

    def parse_type(self, type_name: str, *, location: str | None = None) -> tuple[CellChain, int]:
        chain_name, _, kind = type_name.partition("/")
        chain = self.chains.get(chain_name)
        if chain is None or kind not in chain.kinds:
            raise InvalidInputError(f"unknown cell type {type_name!r}", location=location, field="cells",
                                    accepted=", ".join(self.type_names()) or "none: the cluster has no GPU nodes")
        return chain, chain.level_of(kind)
