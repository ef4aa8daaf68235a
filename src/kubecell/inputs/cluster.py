"""Cluster descriptions: a small YAML document expanded into ``list[Node]``.

Trace experiments need clusters of hundreds of identical machines in racks (Philly: 8-GPU P40
servers), which are tedious and error-prone to list node by node, so the format has *node groups*
(``count`` machines of one shape, named and racked automatically) and optional explicit nodes for the
odd machine out. The same format describes the dynamic simulator's cluster (a file of its own) and a
conformance scenario's (the ``cluster:`` section of the scenario file). Everything is validated before
anything runs: a typo in a key or an unknown GPU model must stop with the file, the line, the key path
and what is accepted, not surface as a strange result hours of simulated time later.

Example::

    nodeGroups:
      - count: 64
        namePrefix: philly-         # philly-000 ... philly-063
        gpu: {model: P40, count: 8}  # optional memoryMiB overrides the catalog
        cpuMilli: 48000
        memoryMiB: 393216
        nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]   # optional (also numaGroups)
        rackSize: 8                 # nodes per rack; racks philly-rack-0 ... philly-rack-7
        zone: z1                    # optional; labels: {key: value} optional
    nodes:                          # optional explicit nodes
      - {name: big-0, cpuMilli: 96000, memoryMiB: 786432, gpu: {model: A100, count: 8}, rack: r9}

Node names are ``namePrefix`` plus the node's number in the group, zero-padded to ``nameDigits``
digits (default 3, so names sort in numeric order; more when the count needs them): ``nameDigits: 1``
gives ``n0 ... n9``, the names of clusters whose nodes are numbered without padding. Racks are
``rackPrefix`` plus the rack's number (padded to the width of the largest), ``rackPrefix`` defaulting
to ``namePrefix`` + ``rack-``; groups given the same ``rackPrefix`` share rack names, so machines of
different shapes can stand in one rack (a rack holding several GPU kinds has a rack cell per kind, named
``rack/kind``, e.g. ``r0/A100x8``).

``count`` must be a multiple of ``rackSize``: the cell forest builds rack cells for a kind of machine
only when all its racks have the same size, so a partial last rack would silently remove rack-level
guarantees for every machine of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS, Node, make_node
from kubecell.core.shown import shown
from kubecell.core.topology import CellForest
from kubecell.core.validation import KeyPath, key_path
from kubecell.inputs.yaml_document import YamlDocument

ACCEPTED_GROUP_KEYS = "count, namePrefix, nameDigits, gpu {model, count, memoryMiB}, cpuMilli, memoryMiB, " \
    "nvlinkGroups, numaGroups, rackSize, rackPrefix, zone, labels"
ACCEPTED_NODE_KEYS = "name, cpuMilli, memoryMiB, gpu {model, count, memoryMiB}, nvlinkGroups, numaGroups, rack, " \
    "zone, labels"
ACCEPTED_GPU_KEYS = "model, count, memoryMiB"
ACCEPTED_TOP_KEYS = "nodeGroups: [{count, namePrefix, gpu, cpuMilli, memoryMiB, ...}] and/or " \
    "nodes: [{name, cpuMilli, memoryMiB, gpu, rack, ...}]"
MIN_NAME_DIGITS = 3


class GpuConfig(BaseModel):
    """The GPUs of one machine: all of one model (split heterogeneous machines into several nodes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: str = Field(min_length=1, strict=True)
    count: int = Field(ge=1, le=64, strict=True)
    memory_mib: int | None = Field(default=None, ge=1, strict=True, alias="memoryMiB")


MAX_CLUSTER_NODES = 100_000
"""The most nodes a cluster description expands to: twenty times the 5,000 Kubernetes is tested at, and more than
any public trace's cluster (Alibaba's 6,200). A count of a billion expanded into nodes until memory ran out."""
GpuIndex = Annotated[int, Field(ge=0, strict=True)]
"""A GPU index in ``nvlinkGroups``/``numaGroups``: a whole number, never ``true``, ``"2"`` or ``3.0``."""


class NodeGroupConfig(BaseModel):
    """``count`` identical machines, named ``namePrefix`` + number and racked ``rackSize`` to a rack."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    count: int = Field(ge=1, le=MAX_CLUSTER_NODES, strict=True)
    name_prefix: str = Field(min_length=1, alias="namePrefix")
    name_digits: int = Field(default=MIN_NAME_DIGITS, ge=1, le=12, strict=True, alias="nameDigits")
    gpu: GpuConfig | None = None
    cpu_milli: int = Field(ge=0, strict=True, alias="cpuMilli")
    memory_mib: int = Field(ge=0, strict=True, alias="memoryMiB")
    nvlink_groups: list[list[GpuIndex]] = Field(default_factory=list, alias="nvlinkGroups")
    numa_groups: list[list[GpuIndex]] = Field(default_factory=list, alias="numaGroups")
    rack_size: int | None = Field(default=None, ge=1, strict=True, alias="rackSize")
    rack_prefix: str | None = Field(default=None, min_length=1, alias="rackPrefix")
    zone: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class NodeConfig(BaseModel):
    """One explicitly named machine."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1)
    gpu: GpuConfig | None = None
    cpu_milli: int = Field(ge=0, strict=True, alias="cpuMilli")
    memory_mib: int = Field(ge=0, strict=True, alias="memoryMiB")
    nvlink_groups: list[list[GpuIndex]] = Field(default_factory=list, alias="nvlinkGroups")
    numa_groups: list[list[GpuIndex]] = Field(default_factory=list, alias="numaGroups")
    rack: str = ""
    zone: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    node_groups: list[NodeGroupConfig] = Field(default_factory=list, alias="nodeGroups")
    nodes: list[NodeConfig] = Field(default_factory=list)


_GPU_MODEL = "a GPU model name, e.g. " + ", ".join(sorted(GPU_MODELS)[:6]) + " ..."
_MACHINE_FIELDS = {
    "gpu": "{model: NAME, count: N} with optional memoryMiB",
    "gpu.model": _GPU_MODEL,
    "gpu.count": "a whole number of GPUs per node, 1..64",
    "gpu.memoryMiB": "a whole number of MiB >= 1 per GPU",
    "cpuMilli": "a whole number of milli-CPU >= 0 (1000 = one vCPU)",
    "memoryMiB": "a whole number of MiB of host memory >= 0",
    "nvlinkGroups": "lists of GPU indices that partition 0..count-1, e.g. [[0,1,2,3],[4,5,6,7]]",
    "nvlinkGroups.*": "a list of GPU indices, e.g. [0, 1, 2, 3]",
    "nvlinkGroups.*.*": "a GPU index (a whole number)",
    "numaGroups": "lists of GPU indices that partition 0..count-1",
    "numaGroups.*": "a list of GPU indices, e.g. [0, 1, 2, 3]",
    "numaGroups.*.*": "a GPU index (a whole number)",
    "zone": "text",
    "labels": "a mapping of text to text",
    "labels.*": "text",
}
FIELD_ACCEPTED = {
    "nodeGroups": "a list of node groups",
    "nodes": "a list of nodes",
    "nodeGroups.*": f"a node group: {ACCEPTED_GROUP_KEYS}",
    "nodes.*": f"a node: {ACCEPTED_NODE_KEYS}",
    **{f"nodeGroups.*.{key}": text for key, text in _MACHINE_FIELDS.items()},
    **{f"nodes.*.{key}": text for key, text in _MACHINE_FIELDS.items()},
    "nodeGroups.*.count": f"a whole number of nodes from 1 to {MAX_CLUSTER_NODES:,}",
    "nodeGroups.*.namePrefix": "non-empty text",
    "nodeGroups.*.nameDigits": "a whole number of digits, 1..12",
    "nodeGroups.*.rackSize": "a whole number of nodes per rack >= 1",
    "nodeGroups.*.rackPrefix": "non-empty text",
    "nodes.*.name": "non-empty text",
    "nodes.*.rack": "text",
}
"""What each field accepts, by key path (``*``: any list position or key)."""

# make_node's field names -> the key of this format that holds the value
_NODE_FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "nvlink_groups": ("nvlinkGroups",),
    "numa_groups": ("numaGroups",),
    "gpus": ("gpu",),
    "gpu": ("gpu", "count"),
    "model": ("gpu", "model"),
    "cpu_milli": ("cpuMilli",),
    "memory_mib": ("memoryMiB",),
    "gpu_memory_mib": ("gpu", "memoryMiB"),
}


def _accepted_keys(parts: KeyPath) -> str:
    """Which keys the mapping at ``parts`` accepts (for unknown- and missing-key errors)."""
    if parts and parts[-1] == "gpu":
        return ACCEPTED_GPU_KEYS
    if len(parts) == 2 and parts[0] == "nodeGroups":
        return ACCEPTED_GROUP_KEYS
    if len(parts) == 2 and parts[0] == "nodes":
        return ACCEPTED_NODE_KEYS
    return ACCEPTED_TOP_KEYS


# ---------------------------------------------------------------------- building nodes
def _node(doc: YamlDocument, parts: list[str | int], name: str, *, gpu: GpuConfig | None, cpu_milli: int,
          memory_mib: int, nvlink: list[list[int]], numa: list[list[int]], rack: str, zone: str,
          labels: Mapping[str, str]) -> Node:
    if gpu is not None and gpu.memory_mib is None and gpu.model not in GPU_MODELS:
        raise InvalidInputError(f"unknown GPU model {shown(gpu.model)}", location=doc.where([*parts, "gpu", "model"]),
                                accepted=", ".join(sorted(GPU_MODELS)) + " (or give gpu.memoryMiB explicitly)")
    try:
        return make_node(
            name, cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_count=gpu.count if gpu else 0,
            gpu_model=gpu.model if gpu else "", gpu_memory_mib=gpu.memory_mib if gpu else None,
            nvlink_groups=nvlink, numa_groups=numa, rack=rack, zone=zone, labels=labels,
        )  # located below, only on error (a group of thousands of nodes shares one location)
    except InvalidInputError as error:
        keys = _NODE_FIELD_KEYS.get(error.field or "", (error.field,) if error.field else ())
        raise InvalidInputError(error.message, location=doc.where([*parts, *keys]), accepted=error.accepted) from None


def _group_nodes(doc: YamlDocument, index: int, group: NodeGroupConfig) -> list[Node]:
    parts: list[str | int] = ["nodeGroups", index]
    if group.rack_size is not None and group.count % group.rack_size:
        raise InvalidInputError(
            f"count {group.count} is not a multiple of rackSize {group.rack_size}",
            location=doc.where([*parts, "count"]),
            accepted="whole racks (rack cells exist only when every rack of a kind of machine has the same size); "
            "put the remaining machines in a group of their own",
        )
    digits = max(group.name_digits, len(str(group.count - 1)))
    racks = group.count // group.rack_size if group.rack_size else 0
    rack_digits = len(str(max(racks - 1, 0)))
    rack_prefix = group.rack_prefix if group.rack_prefix is not None else f"{group.name_prefix}rack-"
    nodes = []
    for i in range(group.count):
        rack = f"{rack_prefix}{i // group.rack_size:0{rack_digits}d}" if group.rack_size else ""
        nodes.append(_node(doc, parts, f"{group.name_prefix}{i:0{digits}d}", gpu=group.gpu, cpu_milli=group.cpu_milli,
                           memory_mib=group.memory_mib, nvlink=group.nvlink_groups, numa=group.numa_groups,
                           rack=rack, zone=group.zone, labels=group.labels))
    return nodes


def parse_cluster(doc: YamlDocument, at: KeyPath = ()) -> list[Node]:
    """Validate the cluster description at key path ``at`` of a document (the whole document by default)
    and expand it into nodes, in file order. Errors name the file, the line and the full key path."""
    doc = doc.section(*at)
    if not isinstance(doc.data, Mapping):
        raise InvalidInputError("expected a mapping with nodeGroups and/or nodes", location=doc.where(),
                                accepted=ACCEPTED_TOP_KEYS)
    try:
        config = ClusterFile.model_validate(doc.data)
    except ValidationError as error:
        raise doc.invalid(error, accepted=FIELD_ACCEPTED, keys=_accepted_keys) from None
    total = sum(group.count for group in config.node_groups) + len(config.nodes)
    if total > MAX_CLUSTER_NODES:
        raise InvalidInputError(f"the cluster has {total:,} nodes", location=doc.where(["nodeGroups"]),
                                accepted=f"at most {MAX_CLUSTER_NODES:,} nodes in all")
    nodes: list[Node] = []
    origin: dict[str, str] = {}

    def add(node: Node, parts: list[str | int]) -> None:
        if node.name in origin:
            raise InvalidInputError(f"duplicate node name {node.name!r} (also from {origin[node.name]})",
                                    location=doc.where(parts), accepted="unique node names")
        origin[node.name] = key_path(parts)
        nodes.append(node)

    for index, group in enumerate(config.node_groups):
        for node in _group_nodes(doc, index, group):
            add(node, ["nodeGroups", index, "namePrefix"])
    for index, explicit in enumerate(config.nodes):
        parts: list[str | int] = ["nodes", index]
        add(_node(doc, parts, explicit.name, gpu=explicit.gpu, cpu_milli=explicit.cpu_milli,
                  memory_mib=explicit.memory_mib, nvlink=explicit.nvlink_groups, numa=explicit.numa_groups,
                  rack=explicit.rack, zone=explicit.zone, labels=explicit.labels), [*parts, "name"])
    if not any(node.gpu_count for node in nodes):
        raise InvalidInputError("the cluster has no GPU nodes", location=doc.where(),
                                accepted="at least one node group or node with gpu: {model, count}")
    _check_racks(doc, nodes, origin)
    return nodes


def _check_racks(doc: YamlDocument, nodes: Sequence[Node], origin: Mapping[str, str]) -> None:
    """A rack's name is a topology cell's name: it must be no node's (racks shared by machines of several GPU
    kinds are named per kind by the cell forest)."""
    for zone, rack in sorted({(n.zone, n.rack) for n in nodes if n.rack}):
        rack_id = f"{zone}/{rack}" if zone else rack
        if rack_id in origin:
            raise InvalidInputError(f"rack {shown(rack_id)} has the name of a node", location=doc.where(),
                                    accepted="rack names distinct from node names")


def load_cluster(path: str | Path) -> list[Node]:
    """Read and validate a cluster description YAML file."""
    return parse_cluster(YamlDocument.read(path))


def cluster_notes(nodes: Sequence[Node]) -> list[str]:
    """What the cell forest could not build from these nodes (e.g. no rack cells), for warnings."""
    return list(CellForest(nodes).notes)
