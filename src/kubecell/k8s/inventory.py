"""A node's GPUs as the scheduler sees them: the node agent's inventory annotation, else GFD labels.

The node agent publishes what NVML reports (UUIDs, indices, models, memory, NUMA node, NVLink peers,
health, MIG mode) as one versioned JSON annotation, ``kubecell.io/gpu-inventory``:

.. code-block:: json

    {"schema": "kubecell.io/gpu-inventory/v1", "agent": "kubecell-node-agent/0.1.0",
     "heartbeat": "2026-11-23T12:00:00Z",
     "gpus": [{"index": 0, "uuid": "GPU-6f1c...", "model": "A100", "product": "NVIDIA A100-SXM4-40GB",
               "memoryMiB": 40536, "numaNode": 0, "nvlinkPeers": [1, 2, 3], "healthy": true,
               "migMode": "disabled"}]}

Where no agent runs yet (a cluster with NVIDIA's GPU Feature Discovery only), the GPUs are read from
the GFD labels ``nvidia.com/gpu.product`` / ``gpu.memory`` / ``gpu.count`` and the node's
``nvidia.com/gpu`` capacity: identical GPUs, no topology below the node, all assumed healthy.

On a node whose GPUs are in MIG mode, the MIG instances are the GPUs the scheduler places
(``kubecell.k8s.mig``).

Unhealthy GPUs stay in the inventory marked unhealthy (the allocation book then refuses them), and
cordoned or NotReady nodes are excluded with a reason, so ``why pending`` can say so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS, UNKNOWN_GPU_MEMORY_MIB, Gpu, Node, TopologyLevel
from kubecell.core.topology import rack_and_zone_from_labels
from kubecell.k8s.mig import mig_layout
from kubecell.k8s.names import ANNOTATION_INVENTORY, GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, NVIDIA_GPU

INVENTORY_SCHEMA = "kubecell.io/gpu-inventory/v1"


class MigInstanceRecord(BaseModel):
    """One MIG device of a GPU in MIG mode: profile, UUID, memory and placement (in memory slices)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    uuid: str = Field(min_length=1)
    profile: str = Field(min_length=1)
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    start: int = Field(ge=0)
    size: int = Field(ge=1)


class GpuRecord(BaseModel):
    """One GPU as the node agent reports it. ``migInstances`` is optional (absent before MIG support, and
    left out of the annotation when empty, so schedulers that predate it keep reading MIG-less nodes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index: int = Field(ge=0, le=255)
    uuid: str = Field(min_length=1)
    model: str = Field(min_length=1)
    product: str = ""
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    numa_node: int | None = Field(default=None, ge=0, alias="numaNode")
    nvlink_peers: list[int] = Field(default_factory=list, alias="nvlinkPeers")
    healthy: bool = True
    mig_mode: Literal["disabled", "enabled"] = Field(default="disabled", alias="migMode")
    mig_instances: list[MigInstanceRecord] = Field(default_factory=list, alias="migInstances")


IsolationMode = Literal["accounting", "mps", "mig"]


def _accounting_only() -> list[IsolationMode]:
    return ["accounting"]


class NodeInventory(BaseModel):
    """The ``kubecell.io/gpu-inventory`` annotation (schema ``kubecell.io/gpu-inventory/v1``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["kubecell.io/gpu-inventory/v1"] = Field(default="kubecell.io/gpu-inventory/v1", alias="schema")
    agent: str = ""
    heartbeat: str = ""
    gpus: list[GpuRecord] = Field(default_factory=list)
    isolation: list[IsolationMode] = Field(default_factory=_accounting_only)
    """The isolation modes the node can give a share (``accounting`` always; ``mps`` where the agent manages
    MPS control daemons; ``mig`` where MIG is enabled): a pod asking for another mode is not placed here."""
    device_plugin: bool = Field(default=False, alias="devicePlugin")
    """kubecell's device plugin serves this node: its ``Allocate`` reads the allocation record of the one
    pod bound to the node and not yet acknowledged, so the scheduler binds GPU pods here one at a time,
    each after the agent acknowledged the previous (never making the agent guess)."""

    def to_annotation(self) -> str:
        data = self.model_dump(by_alias=True, exclude_defaults=False)
        for gpu in data["gpus"]:
            if not gpu["migInstances"]:
                del gpu["migInstances"]
        # Fields added after the first schedulers shipped are written only when they say something, so a
        # scheduler that predates them (extra="forbid") still reads every node that does not use them.
        if data["isolation"] == ["accounting"]:
            del data["isolation"]
        if not data["devicePlugin"]:
            del data["devicePlugin"]
        return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class NodeView:
    """A Kubernetes Node read for scheduling: the core node, or why it is excluded."""

    name: str
    node: Node | None
    excluded: str = ""
    uuids: tuple[str, ...] = ()
    source: Literal["inventory", "gfd", "none"] = "none"
    isolation: tuple[str, ...] = ("accounting",)
    """Isolation modes the node can give (its agent's inventory; accounting alone elsewhere)."""
    serial_binds: bool = False
    """GPU pods are bound here one at a time, each after the node agent acknowledged the previous."""
    gpu_note: str = ""
    """Why the node's GPUs cannot be placed although it has some (a MIG layout kubecell does not place,
    see ``kubecell.k8s.mig``); the node then takes CPU work only, and GPU pods are told why."""


def parse_inventory(text: str, *, node: str) -> NodeInventory:
    """Parse the annotation, with an error naming the node and the problem (never a pydantic dump)."""
    where = f"node {node}: annotation {ANNOTATION_INVENTORY}"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"not JSON ({error.msg} at char {error.pos})", location=where) from None
    if isinstance(raw, dict) and raw.get("schema") not in (None, INVENTORY_SCHEMA):
        raise InvalidInputError(f"unsupported schema {raw.get('schema')!r}", location=where,
                                accepted=INVENTORY_SCHEMA)
    try:
        inventory = NodeInventory.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise InvalidInputError(f"{path}: {first['msg']}", location=where) from None
    indices = [gpu.index for gpu in inventory.gpus]
    if sorted(indices) != list(range(len(indices))):
        raise InvalidInputError(f"GPU indices {sorted(indices)} are not 0..{len(indices) - 1}", location=where)
    return inventory


def _groups(members: Mapping[int, set[int]]) -> tuple[tuple[int, ...], ...]:
    """Connected components of a symmetric peer relation, as sorted index tuples."""
    seen: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for start in sorted(members):
        if start in seen:
            continue
        stack, component = [start], set()
        while stack:
            index = stack.pop()
            if index in component:
                continue
            component.add(index)
            stack.extend(members.get(index, ()))
        seen |= component
        groups.append(tuple(sorted(component)))
    return tuple(groups)


def catalog_model(product: str, memory_mib: int | None = None) -> str:
    """Map a vendor product name (NVML or GFD) to the catalog's model name, else keep the product."""
    key = re.sub(r"[^A-Z0-9]", "", product.upper().replace("NVIDIA", "").replace("TESLA", ""))
    if key in {re.sub(r"[^A-Z0-9]", "", name.upper()) for name in GPU_MODELS}:
        return next(name for name in GPU_MODELS if re.sub(r"[^A-Z0-9]", "", name.upper()) == key)
    for family, large, small in (("A100", "A100-80G", "A100"), ("V100", "V100M32", "V100M16")):
        if family in key:
            big = "80" in key if family == "A100" else "32" in key
            if memory_mib:
                big = memory_mib > GPU_MODELS[small].memory_mib * 1.2
            return large if big else small
    for name in sorted(GPU_MODELS, key=len, reverse=True):
        if len(name) > 2 and re.sub(r"[^A-Z0-9]", "", name.upper()) in key:
            return name
    return product


def _resources(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    status = obj.get("status") or {}
    value = status.get(key) or status.get("capacity") or {}
    return value if isinstance(value, Mapping) else {}


def cpu_milli(quantity: str) -> int:
    """A CPU quantity (``"48"``, ``"500m"``) in milli-cores."""
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def memory_mib(quantity: str) -> int:
    """A memory quantity (``"384Gi"``, ``"1000M"``, bytes) in whole MiB, rounded down."""
    text = str(quantity)
    for suffix, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor) // 2**20
    return int(float(text)) // 2**20


def _ready(obj: Mapping[str, Any]) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """Read a Node object (a dict as the API returns it) into the core's model."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    if (obj.get("spec") or {}).get("unschedulable"):
        return NodeView(name, None, "cordoned (spec.unschedulable)")
    if not _ready(obj):
        return NodeView(name, None, "not Ready")
    allocatable = _resources(obj, "allocatable")
    rack, zone = rack_and_zone_from_labels(labels)
    cpu = cpu_milli(allocatable.get("cpu", "0"))
    memory = memory_mib(allocatable.get("memory", "0"))
    text = annotations.get(ANNOTATION_INVENTORY)
    if text:
        inventory = parse_inventory(text, node=name)
        records = sorted(inventory.gpus, key=lambda gpu: gpu.index)
        modes = tuple(mode for mode in inventory.isolation if mode != "mig")
        layout = mig_layout(records, agent_gives_mig="mig" in inventory.isolation)
        if layout is not None:  # MIG instances are the GPUs here (or, where they cannot be placed, none)
            node = Node(name, cpu, memory, layout.gpus, nvlink_groups=layout.nvlink_groups,
                        numa_groups=layout.numa_groups, rack=rack, zone=zone, labels=labels)
            return NodeView(name, node, uuids=layout.uuids, source="inventory",
                            isolation=("mig",) if layout.gpus else modes, serial_binds=inventory.device_plugin,
                            gpu_note=layout.note)
        gpus = tuple(Gpu(g.index, g.model, g.memory_mib, g.healthy) for g in records)
        peers = {g.index: {p for p in g.nvlink_peers if 0 <= p < len(records)} for g in records}
        for index, linked in list(peers.items()):
            for peer in linked:
                peers[peer].add(index)
        numa: dict[int, set[int]] = {}
        for g in records:
            numa.setdefault(g.numa_node if g.numa_node is not None else -1, set()).add(g.index)
        node = Node(name, cpu, memory, gpus, nvlink_groups=_groups(peers) if records else (),
                    numa_groups=tuple(tuple(sorted(members)) for _, members in sorted(numa.items())),
                    rack=rack, zone=zone, labels=labels)
        return NodeView(name, node, uuids=tuple(g.uuid for g in records), source="inventory",
                        isolation=modes or ("accounting",), serial_binds=inventory.device_plugin)
    count = int(labels.get(GFD_COUNT) or _resources(obj, "allocatable").get(NVIDIA_GPU, 0) or 0)
    if count:
        product = labels.get(GFD_PRODUCT, "")
        label_memory = int(labels[GFD_MEMORY]) if labels.get(GFD_MEMORY, "").isdigit() else None
        model = catalog_model(product, label_memory) if product else "unknown"
        spec = GPU_MODELS.get(model)
        gpu_memory = label_memory if label_memory is not None else (spec.memory_mib if spec else UNKNOWN_GPU_MEMORY_MIB)
        gpus = tuple(Gpu(i, model, gpu_memory) for i in range(count))
        return NodeView(name, Node(name, cpu, memory, gpus, rack=rack, zone=zone, labels=labels), source="gfd")
    return NodeView(name, Node(name, cpu, memory, (), rack=rack, zone=zone, labels=labels))


def inventory_of(node: Node, uuids: Sequence[str] | None = None, *, agent: str = "") -> NodeInventory:
    """The inventory a node agent would publish for a core node (used by the testbed and the agent).

    A core node without NVLink or NUMA groups means "one group holding every GPU" (see
    ``Node.groups_at``), so that is what is published: reading it back gives an equivalent node."""
    numa_of = {i: number for number, group in enumerate(node.groups_at(TopologyLevel.NUMA)) for i in group}
    peers_of = {i: [p for p in group if p != i] for group in node.groups_at(TopologyLevel.NVLINK) for i in group}
    return NodeInventory(agent=agent, gpus=[
        GpuRecord(index=gpu.index, uuid=uuids[gpu.index] if uuids else f"GPU-{node.name}-{gpu.index}",
                  model=gpu.model, memory_mib=gpu.memory_mib, numa_node=numa_of.get(gpu.index),
                  nvlink_peers=peers_of.get(gpu.index, []), healthy=gpu.healthy)
        for gpu in node.gpus
    ])
