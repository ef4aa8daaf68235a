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

An inventory never claims more GPUs than the node advertises: where the node advertises ``kubecell.io/gpu``
(kubecell's device plugin) or ``nvidia.com/gpu`` (NVIDIA's), the view keeps the GPUs of the lowest indices up
to that count and says what it dropped (``NodeView.inventory_note``). That rule lives in
``kubecell.k8s.advertised``, and the reading of GFD labels in ``kubecell.k8s.gfd``; this module keeps the
inventory schema, its parsing, and ``node_view``, which puts them together.

Everything here is written by a node agent, an operator or a device plugin, so every number is read with
its length and range checked first, and every failure is an ``InvalidInputError`` naming the node and the
field: the scheduler then leaves that node out with the reason instead of stopping.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_CPU_MILLI, MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB
from kubecell.core.model import Gpu, Node, TopologyLevel
from kubecell.core.topology import rack_and_zone_from_labels
from kubecell.k8s.advertised import advertised_gpus, kept_gpus, node_value_error, status_map
from kubecell.k8s.dialects.demand import shown
from kubecell.k8s.dialects.resources import QuantityError, parse_quantity
from kubecell.k8s.gfd import catalog_model as catalog_model  # re-exported: the node agent maps NVML names
from kubecell.k8s.gfd import gfd_gpus
from kubecell.k8s.mig import mig_layout
from kubecell.k8s.names import ANNOTATION_INVENTORY, GFD_PRODUCT

INVENTORY_SCHEMA = "kubecell.io/gpu-inventory/v1"

MAX_INVENTORY_CHARS = 256 * 1024
"""The longest inventory annotation read: the API server's limit for all of an object's annotations together,
so no Node the API server accepted carries a longer one (an inventory of 64 GPUs with seven MIG instances each
is about 100 KiB)."""
MAX_UUID_CHARS = 128
"""A GPU or MIG instance UUID (NVML's are 40 characters: ``GPU-`` or ``MIG-`` and a UUID)."""
MAX_PRODUCT_CHARS = 128
"""A model or product name (NVML's device name buffer holds 96 bytes)."""
MAX_TEXT_CHARS = 253
"""Other text of an inventory (the agent's name and version, the heartbeat)."""
MAX_GPU_INDEX = 255
MAX_NUMA_NODE = 1023
"""Linux numbers NUMA nodes below 1024 (``CONFIG_NODES_SHIFT`` is at most 10)."""
MAX_MIG_SLICE = 255
"""A MIG instance's placement in memory slices (8 on an A100 or H100), bounded so a sort key stays small."""
MAX_JSON_DIGITS = 20
"""The most digits of a number in an annotation's JSON: int64 has 19; longer numbers are never converted."""


class MigInstanceRecord(BaseModel):
    """One MIG device of a GPU in MIG mode: profile, UUID, memory and placement (in memory slices)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    uuid: str = Field(min_length=1, max_length=MAX_UUID_CHARS)
    profile: str = Field(min_length=1, max_length=MAX_PRODUCT_CHARS)
    memory_mib: int = Field(ge=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    start: int = Field(ge=0, le=MAX_MIG_SLICE)
    size: int = Field(ge=1, le=MAX_MIG_SLICE)


class GpuRecord(BaseModel):
    """One GPU as the node agent reports it. ``migInstances`` is optional (absent before MIG support, and
    left out of the annotation when empty, so schedulers that predate it keep reading MIG-less nodes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index: int = Field(ge=0, le=MAX_GPU_INDEX)
    uuid: str = Field(min_length=1, max_length=MAX_UUID_CHARS)
    model: str = Field(min_length=1, max_length=MAX_PRODUCT_CHARS)
    product: str = Field(default="", max_length=MAX_PRODUCT_CHARS)
    memory_mib: int = Field(ge=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    numa_node: int | None = Field(default=None, ge=0, le=MAX_NUMA_NODE, alias="numaNode")
    nvlink_peers: list[Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]] = Field(
        default_factory=list, max_length=MAX_GPU_INDEX + 1, alias="nvlinkPeers")
    healthy: bool = True
    mig_mode: Literal["disabled", "enabled"] = Field(default="disabled", alias="migMode")
    mig_instances: list[MigInstanceRecord] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE,
                                                   alias="migInstances")


IsolationMode = Literal["accounting", "mps", "mig"]


def _accounting_only() -> list[IsolationMode]:
    return ["accounting"]


class NodeInventory(BaseModel):
    """The ``kubecell.io/gpu-inventory`` annotation (schema ``kubecell.io/gpu-inventory/v1``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["kubecell.io/gpu-inventory/v1"] = Field(default="kubecell.io/gpu-inventory/v1", alias="schema")
    agent: str = Field(default="", max_length=MAX_TEXT_CHARS)
    heartbeat: str = Field(default="", max_length=MAX_TEXT_CHARS)
    gpus: list[GpuRecord] = Field(default_factory=list, max_length=MAX_GPU_INDEX + 1)
    isolation: list[IsolationMode] = Field(default_factory=_accounting_only, max_length=16)
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
    inventory_note: str = ""
    """What the view dropped because the inventory lists more GPUs than the node advertises, e.g.
    ``inventory lists 16 GPUs but the node advertises kubecell.io/gpu: 8; using 8``; empty when nothing was
    (the rule: ``kubecell.k8s.advertised``)."""


class AnnotationJsonError(ValueError):
    """JSON an annotation's reader refuses before validating it: too long, nested beyond what the parser
    reads, or a number of more digits than any field holds (at ``path``, the keys and list positions)."""

    def __init__(self, message: str, path: tuple[str | int, ...] = (), accepted: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.accepted = accepted


class _LongNumber(str):
    """A JSON number of more than ``MAX_JSON_DIGITS`` digits, kept as its text (never converted)."""


def _json_int(text: str) -> int | _LongNumber:
    return _LongNumber(text) if len(text) > MAX_JSON_DIGITS else int(text)


def _long_number(raw: Any) -> tuple[tuple[str | int, ...], _LongNumber] | None:
    """The first ``_LongNumber`` in ``raw`` and its path; walked without recursion."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _LongNumber):
            return path, value
        if isinstance(value, dict):
            stack.extend(((*path, str(key)), item) for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in reversed(list(enumerate(value))))
    return None


def load_annotation_json(text: object, *, max_chars: int,
                         object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """An annotation's JSON, read with limits: at most ``max_chars`` characters, numbers of at most
    ``MAX_JSON_DIGITS`` digits (Python's ``int`` raises ``ValueError`` beyond 4,300, and no field holds
    more than int64), nesting only as deep as Python's parser goes.

    Raises ``json.JSONDecodeError`` for text that is not JSON (each caller words it), and
    ``AnnotationJsonError`` for the limits."""
    if not isinstance(text, str):
        raise AnnotationJsonError(f"is a {type(text).__name__}, not text")
    if len(text) > max_chars:
        raise AnnotationJsonError(f"is {len(text)} characters long", accepted=f"at most {max_chars} characters")
    try:
        raw = json.loads(text, parse_int=_json_int, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise AnnotationJsonError("nests deeper than any annotation of kubecell's") from None
    found = _long_number(raw)
    if found is not None:
        path, number = found
        raise AnnotationJsonError(f"the number {shown(str(number))} has {len(number.lstrip('-'))} digits", path,
                                  f"numbers of at most {MAX_JSON_DIGITS} digits (int64)")
    return raw


def _dotted(path: Sequence[str | int]) -> str:
    """A key path as pydantic writes it (``gpus.0.memoryMiB``), each key cut when long."""
    return ".".join(str(part) if len(str(part)) <= 60 else shown(str(part)) for part in path)


_RANGES = {
    "gpus.*.index": f"0..{MAX_GPU_INDEX}",
    "gpus.*.memoryMiB": f"0..{MAX_GPU_MEMORY_MIB}",
    "gpus.*.numaNode": f"0..{MAX_NUMA_NODE}",
    "gpus.*.nvlinkPeers.*": f"0..{MAX_GPU_INDEX}",
    "gpus.*.migInstances.*.memoryMiB": f"0..{MAX_GPU_MEMORY_MIB}",
    "gpus.*.migInstances.*.start": f"0..{MAX_MIG_SLICE}",
    "gpus.*.migInstances.*.size": f"1..{MAX_MIG_SLICE}",
}
"""Each number's range, for a number whose digits alone put it out of range (never converted)."""


def parse_inventory(text: str, *, node: str) -> NodeInventory:
    """Parse the annotation, with an error naming the node and the problem (never a pydantic dump)."""
    where = f"node {node}: annotation {ANNOTATION_INVENTORY}"
    try:
        raw = load_annotation_json(text, max_chars=MAX_INVENTORY_CHARS)
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"not JSON ({error.msg} at char {error.pos})", location=where) from None
    except AnnotationJsonError as error:
        message = f"{_dotted(error.path)}: {error.message}" if error.path else error.message
        pattern = ".".join("*" if isinstance(part, int) else part for part in error.path)
        raise InvalidInputError(message, location=where, accepted=_RANGES.get(pattern, error.accepted)) from None
    if isinstance(raw, dict) and raw.get("schema") not in (None, INVENTORY_SCHEMA):
        raise InvalidInputError(f"unsupported schema {shown(raw.get('schema'))}", location=where,
                                accepted=INVENTORY_SCHEMA)
    try:
        inventory = NodeInventory.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise InvalidInputError(f"{_dotted(first['loc'])}: {first['msg']}", location=where) from None
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
    """GPUs from GPU Feature Discovery's labels (``kubecell.k8s.gfd``), cut to what the node advertises."""
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
