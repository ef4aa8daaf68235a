"""The GPUs kubecell may allocate through DRA: devices a ResourceSlice publishes AND the node's inventory confirms.

A slice is written by whoever may write slices; the inventory by the node's own agent. A device counts only where
both agree on its UUID, so a slice naming a GPU the node does not report, or published for another node, gives
nothing. Split from ``claims`` (which reads and writes pods' claims) so that ``foreign_claims`` (claims other
schedulers allocated) reads the same devices without importing the broker.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.kube.dra.allocation import MIB
from kubecell.kube.dra.slices import PublishedDevice, SliceDevices, published_devices
from kubecell.kube.dra_names import CAPACITY_MEMORY, DRIVER
from kubecell.kube.inventory import NodeView

__all__ = ["Devices", "confirmed_devices", "published_memory_mib"]


@dataclass(frozen=True, slots=True)
class Devices:
    """The devices kubecell may allocate: published in a slice and confirmed by the node's inventory."""

    by_uuid: dict[tuple[str, str], PublishedDevice]
    slot: dict[tuple[str, str], int]
    """(node, UUID) -> the GPU's index in the engine's node (for a MIG node: the instance's)."""
    problems: tuple[str, ...]
    listed: tuple[PublishedDevice, ...]


def confirmed_devices(slices: Sequence[Mapping[str, Any]], views: Mapping[str, NodeView],
                      cache: MutableMapping[tuple[str, str], SliceDevices] | None = None) -> Devices:
    """Published devices whose node's inventory lists the same UUID; the rest is a problem said once.
    ``cache``: see ``published_devices``."""
    devices, problems = published_devices(slices, nodes=views.keys(), cache=cache)
    found = list(problems)
    by_uuid: dict[tuple[str, str], PublishedDevice] = {}
    slot: dict[tuple[str, str], int] = {}
    listed = []
    for device in devices:
        view = views.get(device.node)
        if view is None or view.node is None or device.uuid not in view.uuids:
            found.append(f"ResourceSlice device {device.node}/{device.name} names GPU {device.uuid}, which node "
                         f"{device.node}'s inventory does not list: left out")
            continue
        by_uuid[device.node, device.uuid] = device
        slot[device.node, device.uuid] = view.uuids.index(device.uuid)
        listed.append(device)
    return Devices(by_uuid, slot, tuple(found), tuple(listed))


def published_memory_mib(device: PublishedDevice, default: int) -> int:
    """The GPU memory a device publishes, in MiB (``default`` where it publishes none)."""
    capacities = device.capacities
    found = capacities.get(CAPACITY_MEMORY) or capacities.get(f"{DRIVER}/{CAPACITY_MEMORY}")
    return default if found is None else int(found.value) // MIB
