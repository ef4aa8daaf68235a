"""``kubecell node-agent``: one process per GPU node (a DaemonSet) that makes the scheduler's records true.

It discovers the GPUs (NVML, or a fake backend from YAML on machines without GPUs), publishes them as
the node's inventory annotation with a heartbeat and the node's capabilities (isolation modes; that
kubecell's device plugin serves the node, so the scheduler binds GPU pods here one at a time), and serves
the kubelet's device plugin API for ``kubecell.io/gpu`` (a device per GPU UUID) and
``kubecell.io/gpu-milli`` (1000 slots per GPU) with health following the inventory: a GPU hit by a
critical XID becomes Unhealthy in ``ListAndWatch`` and unhealthy in the annotation, so neither the
kubelet nor the scheduler hands it out. ``Allocate`` is answered from the allocation record
(``kubecell.node.allocator``), never by guessing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from kubecell.k8s.inventory import IsolationMode, NodeInventory
from kubecell.k8s.names import RESOURCE_GPU, RESOURCE_GPU_MILLI
from kubecell.k8s.rest import Kube
from kubecell.node.allocator import RecordAllocator
from kubecell.node.deviceplugin import DEVICE_PLUGIN_DIR, Device, DeviceFeed, DevicePlugin, milli_devices
from kubecell.node.inventory import DEFAULT_INTERVAL, InventoryPublisher
from kubecell.node.isolation import MPS_ROOT, NodeIsolation
from kubecell.node.nvml import GpuBackend
from kubecell.node.podresources import POD_RESOURCES_SOCKET, PodResourcesClient

log = logging.getLogger("kubecell.node")


@dataclass(frozen=True, slots=True)
class AgentOptions:
    node: str
    isolation: tuple[IsolationMode, ...] = ("accounting",)
    device_plugin_dir: Path = DEVICE_PLUGIN_DIR
    pod_resources: Path = POD_RESOURCES_SOCKET
    mps_root: Path = MPS_ROOT
    interval: float = DEFAULT_INTERVAL
    milli_unit: int = 1


def devices_of(inventory: NodeInventory) -> list[Device]:
    """The device plugin's view of the inventory: one device per GPU UUID, with health and NUMA node."""
    return [Device(gpu.uuid, gpu.healthy, (gpu.numa_node,) if gpu.numa_node is not None else ())
            for gpu in sorted(inventory.gpus, key=lambda g: g.index)]


class NodeAgent:
    """The inventory publisher, the two device plugins and the record-reading allocator of one node."""

    def __init__(self, kube: Kube, backend: GpuBackend, options: AgentOptions) -> None:
        self.options = options
        self.whole = DeviceFeed()
        self.milli = DeviceFeed()
        self.memory: dict[str, int] = {}
        self.ready = threading.Event()
        """Set once the GPUs were discovered and both feeds carry them."""
        client = PodResourcesClient(options.pod_resources)
        self.allocator = RecordAllocator(kube, options.node, lambda: dict(self.memory),
                                         NodeIsolation(options.isolation, options.mps_root), verify=client.get)
        self.publisher = InventoryPublisher(kube, options.node, backend, interval=options.interval,
                                            isolation=options.isolation, device_plugin=True,
                                            on_change=self._follow)
        self.plugins = [DevicePlugin(RESOURCE_GPU, self.whole, self.allocator, directory=options.device_plugin_dir),
                        DevicePlugin(RESOURCE_GPU_MILLI, self.milli, self.allocator,
                                     directory=options.device_plugin_dir)]

    def _follow(self, inventory: NodeInventory) -> None:
        """A new inventory (discovery, a health change): the device plugins advertise it."""
        gpus = devices_of(inventory)
        self.memory = {gpu.uuid: gpu.memory_mib for gpu in inventory.gpus}
        self.whole.publish(gpus)
        self.milli.publish(milli_devices(gpus, self.options.milli_unit))
        unhealthy = [d.id for d in gpus if not d.healthy]
        log.info("node %s: %d GPU(s)%s", self.options.node, len(gpus),
                 f", unhealthy: {', '.join(unhealthy)}" if unhealthy else "")
        self.ready.set()

    def run(self, stop: threading.Event, *, ready_timeout: float = 60.0) -> None:
        """Publish, then serve the kubelet until ``stop``."""
        self.publisher.start()
        try:
            if not self.ready.wait(ready_timeout):
                log.warning("no GPU inventory after %.0f s (%s); serving an empty device list",
                            ready_timeout, self.publisher.last_error or "no error reported")
            for plugin in self.plugins:
                plugin.start()
            stop.wait()
        finally:
            for plugin in self.plugins:
                plugin.stop()
            self.publisher.stop()
