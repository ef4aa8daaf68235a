"""The node's ResourceSlice of driver ``gpu.kubecell.io``: a pure function of the agent's inventory.

Layout (the scheduler side is written against it, so it is fixed here):

* one slice per node, ``metadata.name`` ``<node>-gpu.kubecell.io`` (a name too long for a DNS subdomain
  is cut and made unique with a hash of the node's name), owned by the Node (so it goes when the Node
  goes), ``spec.driver`` ``gpu.kubecell.io``, ``spec.nodeName`` the node, ``spec.pool`` named after the
  node with ``resourceSliceCount: 1`` and a ``generation`` the publisher raises on every change of the
  devices. (A node with more than 128 devices, the API's limit per slice, which no real GPU server
  reaches, gets ``-1``, ``-2``... slices of the same pool with the count raised accordingly.)
* a GPU not in MIG mode is device ``gpu-<index>``: attributes ``type: gpu``, ``uuid``, ``model`` (the
  inventory's catalog model), ``index``, ``numaNode`` and ``nvlinkGroup`` (the smallest GPU index of its
  NVLink island) where known, ``productName`` and ``memoryMiB``; capacities ``memory`` (``<MiB>Mi``) and
  ``compute`` (``1000``, milli-GPU), and ``allowMultipleAllocations: true``.
* a GPU in MIG mode is one device per MIG instance, ``gpu-<index>-mig-<start>``: ``type: mig``, ``uuid``
  (the instance's), ``profile``, ``model`` (``MIG-<profile>``, the name kubecell's scheduler places it by),
  ``index`` and ``parentIndex`` (the parent GPU's index), ``parentUUID``, ``numaNode``; capacity ``memory``
  only, and no multiple allocations: an instance is exclusive, its isolation is the hardware's.
* unhealthy GPUs, and the MIG instances of unhealthy GPUs, are left out.

**Why these request policies.** The stock kube-scheduler's allocator (``k8s.io/dynamic-resource-allocation``,
``structured/internal/*/consumable_capacity.go``) charges a claim, for *every* capacity of an
``allowMultipleAllocations`` device: the request's amount when the request names that capacity, rounded up
by the policy's ``validRange`` (to ``min``, then to ``min + k * step``); and ``requestPolicy.default`` when it
does not (the capacity's whole ``value`` when there is no default, but the API requires a ``default`` with
every ``validRange``). A device fits while each capacity's charges sum to at most its ``value``; a rounded
amount outside the range (above ``max``) skips the device. So:

* ``compute``: ``value 1000``, ``default 1000``, ``validRange {min 1, max 1000, step 1}``. A claim that asks
  for no compute is charged all of it: nothing fits beside it (every other claim is charged at least
  ``min``), which is what a whole GPU is. ``capacity.requests: {compute: "250"}`` is charged 250, so four
  such claims share one GPU and a fifth does not fit.
* ``memory``: ``value <MiB>Mi``, ``default 0``, ``validRange {min 0, max <MiB>Mi, step 1Mi}``. A claim that
  asks for no memory reserves none (as kubecell's own shares, whose memory is bookkeeping unless asked
  for); one that asks for ``10Gi`` is charged that, rounded up to whole MiB, and memory is then a second
  limit on how many share a GPU.

The consequence, stated rather than hidden: a claim must name ``compute`` to share a GPU. One asking for
memory alone is charged the default compute, 1000, and holds the GPU's compute to itself (the stock
allocator fills an unnamed capacity from its default, whatever else the claim names). A GPU whose memory
is unknown (0) gets no ``memory`` capacity, so a claim asking for memory never lands on it.

**Why MIG instances are plain devices, not partitionable ones.** DRA's partitionable devices (shared
counters consumed by overlapping placements) let a *scheduler* choose a GPU's MIG layout, with a driver
that repartitions the GPU when a claim is prepared. kubecell does not repartition GPUs: the layout is the
operator's (``nvidia-mig-parted``), read as the inventory reports it (:mod:`kubecell.kube.mig`). So each
existing instance is one exclusive device, and what the scheduler may allocate is exactly what exists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.kube import dra_names as names
from kubecell.kube.inventory_schema import GpuRecord, MigInstanceRecord, NodeInventory
from kubecell.kube.mig import mig_model

MAX_DEVICES_PER_SLICE = 128
"""``resource.k8s.io/v1`` ``ResourceSliceMaxDevices`` (none of our devices uses the "advanced" features
that would lower it to 64: no taints, counters or list attributes)."""
MAX_ATTRIBUTE_BYTES = 64
"""``DeviceAttributeMaxValueLength``: a string attribute of more UTF-8 bytes is refused by the API server (Go's
``len`` counts bytes), and with it the whole slice: every device of the node."""
MAX_NAME_CHARS = 253
MILLI_PER_GPU = 1000

COMPUTE_POLICY: dict[str, Any] = {"default": str(MILLI_PER_GPU),
                                  "validRange": {"min": "1", "max": str(MILLI_PER_GPU), "step": "1"}}
"""The ``compute`` capacity's request policy (see the module docstring for why)."""


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One device of the slice and what it stands for: a whole GPU, or one MIG instance of ``gpu``."""

    name: str
    gpu: GpuRecord
    instance: MigInstanceRecord | None = None

    @property
    def is_mig(self) -> bool:
        return self.instance is not None

    @property
    def uuid(self) -> str:
        return self.instance.uuid if self.instance is not None else self.gpu.uuid

    @property
    def memory_mib(self) -> int:
        return self.instance.memory_mib if self.instance is not None else self.gpu.memory_mib

    @property
    def healthy(self) -> bool:
        """An instance is as healthy as its GPU (a critical XID takes the whole GPU out)."""
        return self.gpu.healthy


def gpu_device_name(index: int) -> str:
    return f"gpu-{index}"


def mig_device_name(index: int, start: int) -> str:
    return f"gpu-{index}-mig-{start}"


def all_devices(inventory: NodeInventory) -> list[NodeDevice]:
    """Every device the inventory describes, healthy or not, in index (then placement) order."""
    devices: list[NodeDevice] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if gpu.mig_mode != "enabled":
            devices.append(NodeDevice(gpu_device_name(gpu.index), gpu))
            continue
        used: set[str] = set()
        for instance in sorted(gpu.mig_instances, key=lambda m: (m.start, m.uuid)):
            name = base = mig_device_name(gpu.index, instance.start)
            k = 1
            while name in used:  # two instances at one placement: impossible on hardware, kept unique anyway
                name, k = f"{base}-{k}", k + 1
            used.add(name)
            devices.append(NodeDevice(name, gpu, instance))
    return devices


def healthy_devices(inventory: NodeInventory) -> list[NodeDevice]:
    """The devices the slice carries: those of healthy GPUs."""
    return [device for device in all_devices(inventory) if device.healthy]


def nvlink_groups(gpus: Sequence[GpuRecord]) -> dict[int, int]:
    """GPU index -> the smallest index of its NVLink island, for GPUs with at least one NVLink peer."""
    peers: dict[int, set[int]] = {gpu.index: set() for gpu in gpus}
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer in peers and peer != gpu.index:
                peers[gpu.index].add(peer)
                peers[peer].add(gpu.index)
    groups: dict[int, int] = {}
    for start in sorted(peers):
        if start in groups or not peers[start]:
            continue
        island, todo = {start}, [start]
        while todo:
            for peer in peers[todo.pop()]:
                if peer not in island:
                    island.add(peer)
                    todo.append(peer)
        groups.update({member: min(island) for member in island})
    return groups


def _string(value: str) -> dict[str, str]:
    """A string attribute cut to what the API server accepts: 64 bytes of UTF-8, on a character boundary (a
    product name NVML gives with bytes it cannot decode holds U+FFFD, three bytes each)."""
    return {"string": value.encode("utf-8", "replace")[:MAX_ATTRIBUTE_BYTES].decode("utf-8", "ignore")}


def _int(value: int) -> dict[str, int]:
    return {"int": value}


def device_entry(device: NodeDevice, nvlink_group: int | None = None) -> dict[str, Any]:
    """The ``spec.devices[]`` entry of one device (exact ``resource.k8s.io/v1`` field names)."""
    gpu = device.gpu
    attributes: dict[str, Any] = {names.ATTR_UUID: _string(device.uuid), names.ATTR_INDEX: _int(gpu.index)}
    if gpu.numa_node is not None:
        attributes[names.ATTR_NUMA] = _int(gpu.numa_node)
    capacity: dict[str, Any] = {}
    if device.instance is not None:
        attributes.update({names.ATTR_TYPE: _string(names.TYPE_MIG),
                           names.ATTR_PROFILE: _string(device.instance.profile),
                           names.ATTR_MODEL: _string(mig_model(device.instance.profile)),
                           names.ATTR_PARENT_INDEX: _int(gpu.index),
                           names.ATTR_PARENT_UUID: _string(gpu.uuid)})
        if device.memory_mib > 0:
            attributes[names.ATTR_MEMORY_MIB] = _int(device.memory_mib)
            capacity[names.CAPACITY_MEMORY] = {"value": f"{device.memory_mib}Mi"}
        return {"name": device.name, "attributes": attributes, "capacity": capacity}
    attributes.update({names.ATTR_TYPE: _string(names.TYPE_GPU), names.ATTR_MODEL: _string(gpu.model)})
    if nvlink_group is not None:
        attributes[names.ATTR_NVLINK_GROUP] = _int(nvlink_group)
    if gpu.product:
        attributes[names.ATTR_PRODUCT] = _string(gpu.product)
    capacity[names.CAPACITY_COMPUTE] = {"value": str(MILLI_PER_GPU), "requestPolicy": COMPUTE_POLICY}
    if gpu.memory_mib > 0:
        attributes[names.ATTR_MEMORY_MIB] = _int(gpu.memory_mib)
        memory = f"{gpu.memory_mib}Mi"
        capacity[names.CAPACITY_MEMORY] = {"value": memory, "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": memory, "step": "1Mi"}}}
    return {"name": device.name, "attributes": attributes, "capacity": capacity, "allowMultipleAllocations": True}


def device_entries(inventory: NodeInventory) -> list[dict[str, Any]]:
    """The ``spec.devices`` of the node's pool, all slices together."""
    groups = nvlink_groups(inventory.gpus)
    return [device_entry(device, None if device.is_mig else groups.get(device.gpu.index))
            for device in healthy_devices(inventory)]


def slice_name(node: str, part: int = 0) -> str:
    """``<node>-gpu.kubecell.io`` (``-<part>`` for the further slices of a very large node), at most 253
    characters: a longer name keeps the node name's start and a hash of all of it, so it stays unique."""
    suffix = f"-{names.DRIVER}" + (f"-{part}" if part else "")
    name = node + suffix
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    head = node[:MAX_NAME_CHARS - len(suffix) - len(digest) - 1].rstrip(".-")
    return f"{head}-{digest}{suffix}"


def node_slices(inventory: NodeInventory, node: str, node_uid: str, generation: int) -> list[dict[str, Any]]:
    """The ResourceSlice objects of ``node`` (one, unless it has more than 128 devices) for ``inventory``.

    ``node_uid`` is the Node's UID (its owner reference); ``generation`` the pool generation to write."""
    entries = device_entries(inventory)
    chunks = [entries[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(entries), MAX_DEVICES_PER_SLICE)] or [[]]
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
    return [{
        "apiVersion": names.API_GROUP_VERSION, "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, part), "ownerReferences": [owner]},
        "spec": {"driver": names.DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                 **({"devices": chunk} if chunk else {})},
    } for part, chunk in enumerate(chunks)]
