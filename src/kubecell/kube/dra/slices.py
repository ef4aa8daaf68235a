"""ResourceSlices of driver ``gpu.kubecell.io`` read into the devices kubecell may allocate, or why not.

Each node's agent publishes one slice: ``spec.nodeName`` and ``spec.pool.name`` the node, owned by the
Node object, one device per whole GPU (``gpu-<index>``, shareable by capacity) or MIG instance
(``gpu-<index>-mig-<start>``, exclusive). The layout is not assumed: every attribute type (int, bool,
string, version, and the list forms), every capacity with or without a ``requestPolicy`` is read as the
API defines it, within its limits (128 devices a slice, 32 attributes and capacities a device, 48
attribute values, 64-character strings, names as the API allows).

What the stock allocator would not use is left out the same way (its ``GatherPools``): slices of older
generations of a pool, a pool whose newest generation is incomplete (fewer slices than
``resourceSliceCount``) or names one device twice (the whole pool is invalid), devices that consume
shared counters or carry binding conditions (neither can kubecell honour). Since the slices are written by
agents on the nodes, what one node could forge is refused too: a slice whose ``spec.nodeName`` differs from
its pool's name or is not its owner Node, a device without a UUID or kind, a UUID two devices publish, an
attribute or capacity named both with and without the driver's domain (the two are one name to a selector,
and which value it would see is a matter of order), and a pool of more slices than kubecell's agent ever
writes (``MAX_SLICES_PER_POOL``: the API server bounds a slice, not a pool, and every slice change reads all
of them again on the scheduler's loop). Every device or slice left out is said in ``problems`` (one line each,
for a log line or an Event).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubecell.kube.dra.capacity import DeviceCapacity, parse_capacity
from kubecell.kube.dra.cel import AttributeValue, CelDevice
from kubecell.kube.dra.cel_types import parse_semver
from kubecell.kube.dra_names import ATTR_TYPE, ATTR_UUID, DRIVER, TYPE_GPU, TYPE_MIG

MAX_DEVICES_PER_SLICE = 128
"""``ResourceSliceMaxDevices``."""
MAX_ATTRIBUTES_AND_CAPACITIES = 32
"""``ResourceSliceMaxAttributesAndCapacitiesPerDevice``."""
MAX_ATTRIBUTE_VALUES = 48
"""``ResourceSliceMaxAttributeValuesPerDevice``: values of all attributes of a device, lists counted whole."""
MAX_VALUE_LENGTH = 64
"""``DeviceAttributeMaxValueLength``: a string or version attribute."""
MAX_TAINTS = 16
MAX_SLICES_PER_POOL = 128
"""The most slices of one pool read: kubecell's agent writes ``ceil(devices / 128)``, and a node's inventory
holds at most 256 GPUs of at most 64 MIG instances each (16,384 devices, 128 slices). The API server bounds
neither the slices of a pool nor ``resourceSliceCount``: a node writing thousands would otherwise have every
one of its devices parsed on the scheduler's loop at each slice change anywhere in the cluster."""
INT64 = 2**63
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED = re.compile(r"(?:(?=[^/]{1,63}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z_][A-Za-z0-9_]{0,31}")
"""``QualifiedName``: a C identifier of at most 32 characters, optionally after a DNS domain of at most 63."""


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint (``key``, ``value``, ``effect``: None, NoSchedule or NoExecute)."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device a node publishes. ``attributes`` and ``capacity`` keep the names as published (``model``;
    a name without a domain is the driver's); attribute values are CEL-ready (int, bool, str, ``Semver``,
    or a tuple of one of them), capacities exact ``Decimal`` amounts with their request policies.
    ``shareable`` is ``allowMultipleAllocations``."""

    node: str
    pool: str
    name: str
    uuid: str
    kind: str
    attributes: tuple[tuple[str, AttributeValue], ...]
    capacity: tuple[tuple[str, DeviceCapacity], ...]
    shareable: bool = False
    taints: tuple[Taint, ...] = ()
    driver: str = DRIVER
    cel: CelDevice = field(init=False, compare=False, repr=False)
    """What its selectors see (built once)."""

    def __post_init__(self) -> None:
        view = CelDevice.of(self.driver, dict(self.attributes), {key: cap.value for key, cap in self.capacity},
                            allow_multiple_allocations=self.shareable)
        object.__setattr__(self, "cel", view)

    @staticmethod
    def make(node: str, pool: str, name: str, uuid: str, kind: str, attributes: Mapping[str, AttributeValue],
             capacity: Mapping[str, DeviceCapacity], *, shareable: bool = False,
             taints: Sequence[Taint] = ()) -> PublishedDevice:
        """A device from maps of attributes and capacities (kept sorted by name)."""
        return PublishedDevice(node, pool, name, uuid, kind, tuple(sorted(attributes.items())),
                               tuple(sorted(capacity.items())), shareable, tuple(taints))

    def attribute(self, name: str) -> AttributeValue | None:
        """An attribute by its published or its fully qualified name (``gpu.kubecell.io/model``)."""
        values = dict(self.attributes)
        if name in values:
            return values[name]
        domain, _, ident = name.rpartition("/")
        return values.get(ident) if domain == self.driver else None

    @property
    def capacities(self) -> dict[str, DeviceCapacity]:
        return dict(self.capacity)


def _attribute(raw: Any) -> tuple[AttributeValue, int]:
    """One ``DeviceAttribute`` (exactly one field set) and how many values it holds."""
    if not isinstance(raw, Mapping):
        raise ValueError("is not an object")
    fields = [key for key in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
              if raw.get(key) is not None]
    if len(fields) != 1:
        raise ValueError(f"sets {len(fields)} of int, bool, string, version and their lists; exactly one is allowed")
    kind = fields[0]
    value = raw[kind]
    items = value if kind.endswith("s") else [value]
    if kind.endswith("s") and (not isinstance(value, list) or not value):
        raise ValueError(f"{kind} is not a non-empty list")
    parsed: list[int | bool | str | Any] = []
    for item in items[:MAX_ATTRIBUTE_VALUES + 1]:
        if kind.startswith("int"):
            if not isinstance(item, int) or isinstance(item, bool) or not -INT64 <= item < INT64:
                raise ValueError(f"{kind} value {str(item)[:32]!r} is not a 64-bit integer")
        elif kind.startswith("bool"):
            if not isinstance(item, bool):
                raise ValueError(f"{kind} value {str(item)[:32]!r} is not a bool")
        elif not isinstance(item, str) or len(item) > MAX_VALUE_LENGTH:
            raise ValueError(f"{kind} value is not a string of at most {MAX_VALUE_LENGTH} characters")
        elif kind.startswith("version"):
            item = parse_semver(item)
        parsed.append(item)
    count = len(items)
    return (tuple(parsed) if kind.endswith("s") else parsed[0]), count


def _device(raw: Any, node: str, pool: str) -> PublishedDevice:
    """One device of a slice; raises ``ValueError`` with the reason it cannot be used."""
    if not isinstance(raw, Mapping):
        raise ValueError("is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise ValueError(f"device name {str(name)[:70]!r} is not a DNS label")
    attributes_raw, capacity_raw = raw.get("attributes") or {}, raw.get("capacity") or {}
    if not isinstance(attributes_raw, Mapping) or not isinstance(capacity_raw, Mapping):
        raise ValueError(f"device {name}: attributes and capacity must be maps")
    if len(attributes_raw) + len(capacity_raw) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ValueError(f"device {name}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities")
    for unusable in ("consumesCounters", "bindingConditions", "nodeName", "nodeSelector", "allNodes"):
        if raw.get(unusable):
            raise ValueError(f"device {name}: sets {unusable}, which kubecell cannot honour")
    for section, raw_names in (("attribute", attributes_raw), ("capacity", capacity_raw)):
        both = sorted(key for key in raw_names if isinstance(key, str) and "/" not in key
                      and f"{DRIVER}/{key}" in raw_names)
        if both:
            raise ValueError(f"device {name}: {section} {both[0][:32]!r} is named both with and without the domain "
                             f"{DRIVER}; a selector sees one of them")
    attributes: dict[str, AttributeValue] = {}
    values = 0
    for key, value in attributes_raw.items():
        if not isinstance(key, str) or not _QUALIFIED.fullmatch(key):
            raise ValueError(f"device {name}: attribute name {str(key)[:100]!r} is not a qualified name")
        try:
            attributes[key], count = _attribute(value)
        except ValueError as problem:
            raise ValueError(f"device {name}: attribute {key}: {problem}") from None
        values += count
    if values > MAX_ATTRIBUTE_VALUES:
        raise ValueError(f"device {name}: more than {MAX_ATTRIBUTE_VALUES} attribute values")
    capacity: dict[str, DeviceCapacity] = {}
    for key, value in capacity_raw.items():
        if not isinstance(key, str) or not _QUALIFIED.fullmatch(key):
            raise ValueError(f"device {name}: capacity name {str(key)[:100]!r} is not a qualified name")
        try:
            capacity[key] = parse_capacity(value)
        except ValueError as problem:
            raise ValueError(f"device {name}: capacity {key}: {problem}") from None
    shareable = raw.get("allowMultipleAllocations") is True
    if not shareable and any(cap.policy is not None for cap in capacity.values()):
        raise ValueError(f"device {name}: a requestPolicy needs allowMultipleAllocations")
    uuid = attributes.get(ATTR_UUID, attributes.get(f"{DRIVER}/{ATTR_UUID}"))
    kind = attributes.get(ATTR_TYPE, attributes.get(f"{DRIVER}/{ATTR_TYPE}"))
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"device {name}: no string attribute {ATTR_UUID!r}")
    if kind not in (TYPE_GPU, TYPE_MIG):
        raise ValueError(f"device {name}: attribute {ATTR_TYPE!r} is {kind!r}, not {TYPE_GPU!r} or {TYPE_MIG!r}")
    if kind == TYPE_MIG and shareable:
        raise ValueError(f"device {name}: a MIG instance is exclusive, but allowMultipleAllocations is set")
    return PublishedDevice.make(node, pool, name, uuid, str(kind), attributes, capacity, shareable=shareable,
                                taints=_taints(raw.get("taints"), name))


def _taints(raw: Any, name: str) -> list[Taint]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TAINTS:
        raise ValueError(f"device {name}: taints is not a list of at most {MAX_TAINTS}")
    taints = []
    for taint in raw:
        fields = [taint.get(key, "") if isinstance(taint, Mapping) else None for key in ("key", "value", "effect")]
        if not all(isinstance(item, str) and len(item) <= 316 for item in fields):
            raise ValueError(f"device {name}: a taint is not {{key, value, effect}} strings")
        taints.append(Taint(str(fields[0]), str(fields[1]), str(fields[2])))
    return taints


@dataclass(slots=True)
class _Slice:
    name: str
    node: str
    pool: str
    generation: int
    count: int
    devices: list[Any]
    version: tuple[str, str] | None = None
    """(uid, resourceVersion): what the API server changes whenever the slice changes (None: unknown)."""


def _slice(raw: Any) -> _Slice | str | None:
    """A slice of kubecell's driver checked for trust and shape; None for another driver's; the reason
    (a problem) for one that cannot be used."""
    if not isinstance(raw, Mapping):
        return "a ResourceSlice that is not an object: left out"
    spec, meta = raw.get("spec"), raw.get("metadata")
    if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
        return None
    name = str((meta or {}).get("name", "?"))[:253] if isinstance(meta, Mapping) else "?"
    where = f"ResourceSlice {name}"
    pool, node = spec.get("pool"), spec.get("nodeName")
    if not isinstance(node, str) or not _DNS_SUBDOMAIN.fullmatch(node):
        return f"{where}: not bound to one node by spec.nodeName (kubecell's agent publishes per node): left out"
    if not isinstance(pool, Mapping) or pool.get("name") != node:
        return (f"{where}: pool {str((pool or {}).get('name') if isinstance(pool, Mapping) else pool)[:253]!r} is "
                f"not its node {node!r}: left out")
    generation, count = pool.get("generation"), pool.get("resourceSliceCount")
    if not isinstance(generation, int) or not isinstance(count, int) or isinstance(generation, bool) or count < 1:
        return f"{where}: pool generation or resourceSliceCount is not a valid number: left out"
    owners = [ref for ref in (meta.get("ownerReferences") or [] if isinstance(meta, Mapping) else [])
              if isinstance(ref, Mapping) and ref.get("kind") == "Node" and ref.get("apiVersion") == "v1"]
    if len(owners) != 1 or owners[0].get("name") != node:
        return f"{where}: spec.nodeName {node!r} is not the Node that owns it: left out"
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES_PER_SLICE:
        return f"{where}: devices is not a list of at most {MAX_DEVICES_PER_SLICE}: left out"
    uid, version = (meta.get("uid"), meta.get("resourceVersion")) if isinstance(meta, Mapping) else (None, None)
    known = (uid, version) if isinstance(uid, str) and isinstance(version, str) and uid and version else None
    return _Slice(name, node, node, generation, count, devices, known)


SliceDevices = tuple[tuple["PublishedDevice", ...], tuple[str, ...]]
"""One slice's devices as read, and the problems of those left out."""


def published_devices(slices: Sequence[Mapping[str, Any]], *, nodes: Collection[str] | None = None,
                      cache: MutableMapping[tuple[str, str], SliceDevices] | None = None,
                      ) -> tuple[list[PublishedDevice], list[str]]:
    """The devices of kubecell's driver that can be allocated, sorted by (node, name), and a line for every
    slice or device left out. ``nodes``: the only nodes whose slices are read (the others' are left out, with
    one line each, before any of their devices is parsed). ``cache``: each slice's devices by (uid,
    resourceVersion), kept by the caller between calls, so that a change of one slice does not parse every
    device of every node again (about 180 µs a device); it is left holding the slices of this call only."""
    problems: list[str] = []
    pools: dict[str, list[_Slice]] = {}
    for raw in slices:
        read = _slice(raw)
        if isinstance(read, str):
            problems.append(read)
        elif read is not None and nodes is not None and read.node not in nodes:
            problems.append(f"ResourceSlice {read.name}: node {read.node} is not one kubecell knows: left out")
        elif read is not None:
            pools.setdefault(read.pool, []).append(read)
    kept_reads: dict[tuple[str, str], SliceDevices] = {}
    devices: list[PublishedDevice] = []
    for pool, members in sorted(pools.items()):
        newest = max(member.generation for member in members)
        current = sorted((m for m in members if m.generation == newest), key=lambda m: m.name)
        counts = {member.count for member in current}
        if len(current) > MAX_SLICES_PER_POOL or max(counts) > MAX_SLICES_PER_POOL:
            problems.append(f"pool {pool} (generation {newest}) has {len(current)} slice(s) for resourceSliceCount "
                            f"{max(counts)}; kubecell's agent writes at most {MAX_SLICES_PER_POOL}: left out")
            continue
        if len(counts) != 1 or len(current) != counts.pop():
            problems.append(f"pool {pool} (generation {newest}) is incomplete or inconsistent: {len(current)} "
                            f"slice(s) for resourceSliceCount {sorted({m.count for m in current})}: left out")
            continue
        mine: list[PublishedDevice] = []
        for member in current:
            found = cache.get(member.version) if cache is not None and member.version is not None else None
            if found is None:
                found = _devices_of(member, pool)
            if member.version is not None:
                kept_reads[member.version] = found
            mine.extend(found[0])
            problems.extend(found[1])
        seen = Counter(device.name for device in mine)  # not list.count: quadratic in a pool's devices
        twice = sorted(name for name, times in seen.items() if times > 1)
        if twice:
            problems.append(f"pool {pool}: device(s) {', '.join(twice[:5])} published twice; the pool is invalid, "
                            "as the allocator treats it: left out")
            continue
        devices.extend(mine)
    by_uuid: dict[str, list[PublishedDevice]] = {}
    for device in devices:
        by_uuid.setdefault(device.uuid, []).append(device)
    forged = {uuid for uuid, holders in by_uuid.items() if len(holders) > 1}
    for uuid in sorted(forged):
        holders = ", ".join(f"{d.node}/{d.name}" for d in by_uuid[uuid][:5])
        problems.append(f"GPU {uuid[:64]} is published by several devices ({holders}): all left out")
    kept = [device for device in devices if device.uuid not in forged]
    if cache is not None:
        cache.clear()
        cache.update(kept_reads)
    return sorted(kept, key=lambda d: (d.node, d.name)), problems


def _devices_of(member: _Slice, pool: str) -> SliceDevices:
    devices, problems = [], []
    for raw in member.devices:
        try:
            devices.append(_device(raw, member.node, pool))
        except ValueError as problem:
            problems.append(f"ResourceSlice {member.name}: {problem}: left out")
    return tuple(devices), tuple(problems)

