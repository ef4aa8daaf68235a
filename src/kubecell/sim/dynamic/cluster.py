"""Cluster descriptions for the dynamic simulator: a small YAML file expanded into ``list[Node]``.

Trace experiments need clusters of hundreds of identical machines in racks (Philly: 8-GPU P40
servers), which are tedious and error-prone to list node by node, so the format has *node groups*
(``count`` machines of one shape, named and racked automatically) and optional explicit nodes for the
odd machine out. Everything is validated before the simulator starts: a typo in a key or an unknown GPU
model must stop the run with the file, the line, the key path and what is accepted, not surface as a
strange result hours of simulated time later.

Example::

    nodeGroups:
      - count: 64
        namePrefix: philly-         # philly-000 ... philly-063 (zero-padded, at least 3 digits)
        gpu: {model: P40, count: 8}  # optional memoryMiB overrides the catalog
        cpuMilli: 48000
        memoryMiB: 393216
        nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]   # optional
        rackSize: 8                 # nodes per rack; racks philly-rack-0 ... philly-rack-7
        zone: z1                    # optional
    nodes:                          # optional explicit nodes
      - {name: big-0, cpuMilli: 96000, memoryMiB: 786432, gpu: {model: A100, count: 8}, rack: r9}

``count`` must be a multiple of ``rackSize``: the cell forest builds rack cells for a kind of machine
only when all its racks have the same size, so a partial last rack would silently remove rack-level
guarantees for every machine of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS, Node, make_node
from kubecell.core.topology import CellForest

ACCEPTED_GROUP_KEYS = "count, namePrefix, gpu {model, count, memoryMiB}, cpuMilli, memoryMiB, nvlinkGroups, " \
    "numaGroups, rackSize, zone, labels"
ACCEPTED_NODE_KEYS = "name, cpuMilli, memoryMiB, gpu {model, count, memoryMiB}, nvlinkGroups, numaGroups, rack, " \
    "zone, labels"
MIN_NAME_DIGITS = 3


class GpuConfig(BaseModel):
    """The GPUs of one machine: all of one model (split heterogeneous machines into several nodes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: str = Field(min_length=1)
    count: int = Field(ge=1, le=64)
    memory_mib: int | None = Field(default=None, ge=1, alias="memoryMiB")


class NodeGroupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    count: int = Field(ge=1)
    name_prefix: str = Field(min_length=1, alias="namePrefix")
    gpu: GpuConfig | None = None
    cpu_milli: int = Field(ge=0, alias="cpuMilli")
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    nvlink_groups: list[list[int]] = Field(default_factory=list, alias="nvlinkGroups")
    numa_groups: list[list[int]] = Field(default_factory=list, alias="numaGroups")
    rack_size: int | None = Field(default=None, ge=1, alias="rackSize")
    zone: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class NodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1)
    gpu: GpuConfig | None = None
    cpu_milli: int = Field(ge=0, alias="cpuMilli")
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    nvlink_groups: list[list[int]] = Field(default_factory=list, alias="nvlinkGroups")
    numa_groups: list[list[int]] = Field(default_factory=list, alias="numaGroups")
    rack: str = ""
    zone: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    node_groups: list[NodeGroupConfig] = Field(default_factory=list, alias="nodeGroups")
    nodes: list[NodeConfig] = Field(default_factory=list)


# ---------------------------------------------------------------------- locating keys in the YAML text
def key_path(parts: Sequence[str | int]) -> str:
    """``("nodeGroups", 0, "gpu", "model")`` -> ``nodeGroups[0].gpu.model``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def yaml_line(root: yaml.Node | None, parts: Sequence[str | int]) -> int | None:
    """The 1-based line of the deepest node of ``parts`` present in a composed YAML tree."""
    node = root
    line = None if node is None else node.start_mark.line + 1
    for part in parts:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


class YamlDocument:
    """A parsed YAML file that can say where a key path sits (for error messages)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        try:
            self.data: Any = yaml.safe_load(text)
            self.root: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise InvalidInputError(f"not valid YAML: {problem}", location=where) from None

    @classmethod
    def read(cls, path: str | Path) -> YamlDocument:
        path = Path(path)
        if not path.is_file():
            raise InvalidInputError("file not found", location=str(path))
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise InvalidInputError(f"cannot read file: {error.strerror}", location=str(path)) from None
        except UnicodeDecodeError:
            raise InvalidInputError("not a UTF-8 text file", location=str(path)) from None
        return cls(path, text)

    def where(self, parts: Sequence[str | int]) -> str:
        """``file:line: key.path`` (the line of the deepest part of the path that exists)."""
        line = yaml_line(self.root, parts)
        head = f"{self.path}:{line}" if line is not None else str(self.path)
        return f"{head}: {key_path(parts)}" if parts else head


FIELD_ACCEPTED = {
    "count": "a whole number of nodes >= 1",
    "gpu.count": "a whole number of GPUs per node, 1..64",
    "namePrefix": "non-empty text",
    "name": "non-empty text",
    "model": "a GPU model name, e.g. " + ", ".join(sorted(GPU_MODELS)[:6]) + " ...",
    "memoryMiB": "a whole number of MiB (>= 0 for hosts, >= 1 for GPUs)",
    "cpuMilli": "a whole number of milli-CPU >= 0 (1000 = one vCPU)",
    "nvlinkGroups": "lists of GPU indices that partition 0..count-1, e.g. [[0,1,2,3],[4,5,6,7]]",
    "numaGroups": "lists of GPU indices that partition 0..count-1",
    "rackSize": "a whole number of nodes per rack >= 1",
    "rack": "text",
    "zone": "text",
    "labels": "a mapping of text to text",
    "gpu": "{model: NAME, count: N} with optional memoryMiB",
    "gpu.memoryMiB": "a whole number of MiB >= 1 per GPU",
}


def _validation_error(doc: YamlDocument, error: ValidationError) -> InvalidInputError:
    item = error.errors()[0]
    parts = [p for p in item["loc"] if isinstance(p, str | int)]
    more = len(error.errors()) - 1
    suffix = f" ({more} more problem(s) in this file)" if more else ""
    section = next((p for p in parts if p in ("nodeGroups", "nodes")), None)
    keys = {"nodeGroups": ACCEPTED_GROUP_KEYS, "nodes": ACCEPTED_NODE_KEYS}.get(
        str(section), "nodeGroups: [...] and/or nodes: [...]")
    if item["type"] == "extra_forbidden":
        return InvalidInputError(f"unknown key {parts[-1]!r}{suffix}", location=doc.where(parts), accepted=keys)
    if item["type"] == "missing":
        return InvalidInputError(f"required key missing{suffix}", location=doc.where(parts), accepted=keys)
    names = [p for p in parts if isinstance(p, str)]
    pair = ".".join(names[-2:])
    name = pair if pair in FIELD_ACCEPTED else (names or [""])[-1]
    return InvalidInputError(f"{item['msg']}{suffix}", location=doc.where(parts),
                             accepted=FIELD_ACCEPTED.get(name, keys))


# ---------------------------------------------------------------------- building nodes
def _node(doc: YamlDocument, parts: list[str | int], name: str, *, gpu: GpuConfig | None, cpu_milli: int,
          memory_mib: int, nvlink: list[list[int]], numa: list[list[int]], rack: str, zone: str,
          labels: Mapping[str, str]) -> Node:
    if gpu is not None and gpu.memory_mib is None and gpu.model not in GPU_MODELS:
        raise InvalidInputError(f"unknown GPU model {gpu.model!r}", location=doc.where([*parts, "gpu", "model"]),
                                accepted=", ".join(sorted(GPU_MODELS)) + " (or give gpu.memoryMiB explicitly)")
    try:
        return make_node(
            name, cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_count=gpu.count if gpu else 0,
            gpu_model=gpu.model if gpu else "", gpu_memory_mib=gpu.memory_mib if gpu else None,
            nvlink_groups=nvlink, numa_groups=numa, rack=rack, zone=zone, labels=labels,
            location=doc.where(parts),
        )
    except InvalidInputError as error:
        field = error.field or ""
        key = {"nvlink_groups": "nvlinkGroups", "numa_groups": "numaGroups", "gpus": "gpu"}.get(field, field)
        where = doc.where([*parts, key] if key else parts)
        raise InvalidInputError(error.message, location=where, accepted=error.accepted) from None


def _group_nodes(doc: YamlDocument, index: int, group: NodeGroupConfig) -> list[Node]:
    parts: list[str | int] = ["nodeGroups", index]
    if group.rack_size is not None and group.count % group.rack_size:
        raise InvalidInputError(
            f"count {group.count} is not a multiple of rackSize {group.rack_size}",
            location=doc.where([*parts, "count"]),
            accepted="whole racks (rack cells exist only when every rack of a kind of machine has the same size); "
            "put the remaining machines in a group of their own",
        )
    digits = max(MIN_NAME_DIGITS, len(str(group.count - 1)))
    racks = group.count // group.rack_size if group.rack_size else 0
    rack_digits = len(str(max(racks - 1, 0)))
    nodes = []
    for i in range(group.count):
        rack = f"{group.name_prefix}rack-{i // group.rack_size:0{rack_digits}d}" if group.rack_size else ""
        nodes.append(_node(doc, parts, f"{group.name_prefix}{i:0{digits}d}", gpu=group.gpu, cpu_milli=group.cpu_milli,
                           memory_mib=group.memory_mib, nvlink=group.nvlink_groups, numa=group.numa_groups,
                           rack=rack, zone=group.zone, labels=group.labels))
    return nodes


def parse_cluster(doc: YamlDocument) -> list[Node]:
    """Validate a parsed cluster description and expand it into nodes (in file order)."""
    if not isinstance(doc.data, Mapping):
        raise InvalidInputError("expected a mapping with nodeGroups and/or nodes", location=str(doc.path),
                                accepted="nodeGroups: [{count, namePrefix, gpu, cpuMilli, memoryMiB, ...}], "
                                "nodes: [{name, cpuMilli, memoryMiB, gpu, rack, ...}]")
    try:
        config = ClusterFile.model_validate(doc.data)
    except ValidationError as error:
        raise _validation_error(doc, error) from None
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
        raise InvalidInputError("the cluster has no GPU nodes", location=str(doc.path),
                                accepted="at least one node group or node with gpu: {model, count}")
    racks = {(n.zone, n.rack) for n in nodes if n.rack}
    for zone, rack in sorted(racks):
        rack_id = f"{zone}/{rack}" if zone else rack
        if rack_id in origin:
            raise InvalidInputError(f"rack {rack_id!r} has the name of a node", location=str(doc.path),
                                    accepted="rack names distinct from node names")
    return nodes


def load_cluster(path: str | Path) -> list[Node]:
    """Read and validate a cluster description YAML file."""
    return parse_cluster(YamlDocument.read(path))


def cluster_notes(nodes: Sequence[Node]) -> list[str]:
    """What the cell forest could not build from these nodes (e.g. no rack cells), for warnings."""
    return list(CellForest(nodes).notes)
