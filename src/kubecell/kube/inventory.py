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
(``kubecell.kube.mig``).

Unhealthy GPUs stay in the inventory marked unhealthy (the allocation book then refuses them), and
cordoned or NotReady nodes are excluded with a reason, so ``why pending`` can say so.

An inventory never claims more GPUs than the node advertises: where the node advertises ``kubecell.io/gpu``
(kubecell's device plugin) or ``nvidia.com/gpu`` (NVIDIA's), the view keeps the GPUs of the lowest indices up
to that count and says what it dropped (``NodeView.inventory_note``). That rule lives in
``kubecell.kube.advertised``, the reading of GFD labels in ``kubecell.kube.gfd``, the annotation's schema and
parsing in ``kubecell.kube.inventory_schema``; this module keeps ``node_view``, which puts them together.

Everything here is written by a node agent, an operator or a device plugin, so every number is read with
its length and range checked first, and every failure is an ``InvalidInputError`` naming the node and the
field: the scheduler then leaves that node out with the reason instead of stopping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_CPU_MILLI, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB
from kubecell.core.model import Gpu, Node, TopologyLevel
from kubecell.core.topology import rack_and_zone_from_labels
from kubecell.kube.advertised import advertised_gpus, kept_gpus, node_value_error, status_map
from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.gfd import gfd_gpus
from kubecell.kube.inventory_schema import GpuRecord, NodeInventory, parse_inventory
from kubecell.kube.mig import mig_layout
from kubecell.kube.names import ANNOTATION_INVENTORY, GFD_PRODUCT


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
    see ``kubecell.kube.mig``); the node then takes CPU work only, and GPU pods are told why."""
    inventory_note: str = ""
    """What the view dropped because the inventory lists more GPUs than the node advertises, e.g.
    ``inventory lists 16 GPUs but the node advertises kubecell.io/gpu: 8; using 8``; empty when nothing was
    (the rule: ``kubecell.kube.advertised``)."""


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


def cpu_milli(quantity: object) -> int:
    """A CPU quantity (``"48"``, ``"500m"``) in milli-cores, rounded down (a node offers what it has).

    Raises ``QuantityError`` (a ``ValueError``) for what is not a Kubernetes quantity or is beyond int64."""
    return int(parse_quantity(quantity) * 1000)


def memory_mib(quantity: object) -> int:
    """A memory quantity (``"384Gi"``, ``"1000M"``, bytes) in whole MiB, rounded down.

    Raises ``QuantityError`` (a ``ValueError``) for what is not a Kubernetes quantity or is beyond int64."""
    return int(parse_quantity(quantity)) // 2**20


def _ready(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") or {}
    for condition in (status.get("conditions") if isinstance(status, Mapping) else None) or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _host_amount(name: str, where: str, raw: object, convert: Callable[[object], int], high: int,
                 unit: str) -> int:
    """The node's CPU or memory, in the core's unit, within what the allocation book holds."""
    try:
        value = convert(raw)
    except QuantityError as error:
        raise node_value_error(name, where, raw, error.reason, error.accepted) from None
    if value < 0:
        raise node_value_error(name, where, raw, "is negative", f"0..{high} {unit}")
    if value > high:
        raise node_value_error(name, where, raw, f"is {value} {unit}, more than a node may have", f"0..{high} {unit}")
    return value


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """Read a Node object (a dict as the API returns it) into the core's model.

    Raises ``InvalidInputError`` naming the node and the field for anything it cannot read (the scheduler
    then leaves the node out with that reason)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    if (obj.get("spec") or {}).get("unschedulable"):
        return NodeView(name, None, "cordoned (spec.unschedulable)")
    if not _ready(obj):
        return NodeView(name, None, "not Ready")
    table = "allocatable" if status_map(obj, "allocatable") else "capacity"
    amounts = status_map(obj, table)
    rack, zone = rack_and_zone_from_labels(labels)
    cpu = _host_amount(name, f"status.{table}.cpu", amounts.get("cpu", "0"), cpu_milli, MAX_CPU_MILLI, "milli-CPU")
    memory = _host_amount(name, f"status.{table}.memory", amounts.get("memory", "0"), memory_mib, MAX_MEMORY_MIB,
                          "MiB")
    try:
        host = Node(name, cpu, memory, rack=rack, zone=zone, labels=labels)
    except InvalidInputError as error:  # a Node object without a name: only a hand-built one
        raise InvalidInputError(error.message, location=f"node {name!r}", field=error.field,
                                accepted=error.accepted) from None
    text = annotations.get(ANNOTATION_INVENTORY)
    if text:
        return _inventory_view(obj, name, text, host)
    return _gfd_view(obj, name, labels, host)


def _core_node(where: str, host: Node, gpus: tuple[Gpu, ...], *, nvlink_groups: tuple[tuple[int, ...], ...] = (),
               numa_groups: tuple[tuple[int, ...], ...] = ()) -> Node:
    """The core node of ``host`` with ``gpus``; what the core refuses (GPUs of several models, say) is told at
    ``where``, the annotation or label the GPUs came from."""
    try:
        return Node(host.name, host.cpu_milli, host.memory_mib, gpus, nvlink_groups=nvlink_groups,
                    numa_groups=numa_groups, rack=host.rack, zone=host.zone, labels=host.labels)
    except InvalidInputError as error:
        raise InvalidInputError(error.message, location=where, field=error.field, accepted=error.accepted) from None


def _inventory_view(obj: Mapping[str, Any], name: str, text: str, host: Node) -> NodeView:
    """The node agent's inventory (``host``: the node without GPUs), cut to what the node advertises."""
    where = f"node {name}: annotation {ANNOTATION_INVENTORY}"
    inventory = parse_inventory(text, node=name)
    records = sorted(inventory.gpus, key=lambda gpu: gpu.index)
    modes = tuple(mode for mode in inventory.isolation if mode != "mig")
    layout = mig_layout(records, agent_gives_mig="mig" in inventory.isolation)
    if layout is not None:  # MIG instances are the GPUs here (or, where they cannot be placed, none)
        kept, note = kept_gpus(layout.gpus, advertised_gpus(name, obj, mig=True) if layout.gpus else None,
                               "inventory", "MIG instance")
        layout = layout.first(kept)
        node = _core_node(where, host, layout.gpus, nvlink_groups=layout.nvlink_groups,
                          numa_groups=layout.numa_groups)
        return NodeView(name, node, uuids=layout.uuids, source="inventory",
                        isolation=("mig",) if layout.gpus else modes, serial_binds=inventory.device_plugin,
                        gpu_note=layout.note, inventory_note=note)
    listed = tuple(Gpu(g.index, g.model, g.memory_mib, g.healthy) for g in records)
    kept, note = kept_gpus(listed, advertised_gpus(name, obj, mig=False) if listed else None, "inventory", "GPU")
    records, gpus = records[:kept], listed[:kept]
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise InvalidInputError(f"gpus: lists {len(gpus)} GPUs, more than a node may have", location=where,
                                accepted=f"at most {MAX_GPUS_PER_NODE} GPUs")
    peers = {g.index: {p for p in g.nvlink_peers if 0 <= p < len(records)} for g in records}
    for index, linked in list(peers.items()):
        for peer in linked:
            peers[peer].add(index)
    numa: dict[int, set[int]] = {}
    for g in records:
        numa.setdefault(g.numa_node if g.numa_node is not None else -1, set()).add(g.index)
    node = _core_node(where, host, gpus, nvlink_groups=_groups(peers) if records else (),
                      numa_groups=tuple(tuple(sorted(members)) for _, members in sorted(numa.items())))
    return NodeView(name, node, uuids=tuple(g.uuid for g in records), source="inventory",
                    isolation=modes or ("accounting",), serial_binds=inventory.device_plugin, inventory_note=note)


def _gfd_view(obj: Mapping[str, Any], name: str, labels: Mapping[str, str], host: Node) -> NodeView:
    """GPUs from GPU Feature Discovery's labels (``kubecell.kube.gfd``), cut to what the node advertises."""
    gpus, note = gfd_gpus(obj, name, labels)
    if not gpus:
        return NodeView(name, host, inventory_note=note)
    return NodeView(name, _core_node(f"node {name}: label {GFD_PRODUCT}", host, gpus), source="gfd",
                    inventory_note=note)


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
