"""``kubecell node-agent``: one process per GPU node (a DaemonSet) that makes the scheduler's records true.

It discovers the GPUs (NVML, or a fake backend from YAML on machines without GPUs), publishes them as
the node's inventory annotation with a heartbeat and the node's capabilities (isolation modes; that
kubecell's device plugin serves the node, so the scheduler binds GPU pods here one at a time), and serves
the kubelet's device plugin API for ``kubecell.io/gpu`` (a device per GPU UUID) and
``kubecell.io/gpu-milli`` (1000 slots per GPU) with health following the inventory: a GPU hit by a
critical XID becomes Unhealthy in ``ListAndWatch`` and unhealthy in the annotation, so neither the
kubelet nor the scheduler hands it out. ``Allocate`` is answered from the allocation record
(``kubecell.node.allocator``), never by guessing. With ``dra`` it is also the DRA driver
``gpu.kubecell.io`` (``kubecell.node.dra``): the GPUs as a ResourceSlice, and the kubelet's DRA plugin.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from kubecell.core.errors import KubecellError
from kubecell.kube.inventory_schema import IsolationMode, NodeInventory
from kubecell.kube.names import RESOURCE_GPU, RESOURCE_GPU_MILLI
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import Kube
from kubecell.node.allocator import RecordAllocator
from kubecell.node.deviceplugin import DEVICE_PLUGIN_DIR, Device, DeviceFeed, DevicePlugin, milli_devices
from kubecell.node.dra.cdi import CDI_DIR
from kubecell.node.dra.plugin import PLUGIN_DIR, REGISTRY_DIR, DraDriver, PluginPaths
from kubecell.node.inventory import DEFAULT_INTERVAL, InventoryPublisher
from kubecell.node.isolation import MPS_ROOT, NodeIsolation
from kubecell.node.mps import MPS_CONTROL, MpsDaemons, mps_holders
from kubecell.node.nvml import GpuBackend
from kubecell.node.overuse import OveruseMonitor, api_pods
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
    proc_root: Path = Path("/proc")
    """Where the host's processes are seen (the DaemonSet mounts the host's /proc with hostPID)."""
    evict_after_seconds: float | None = None
    """Evict a pod that overuses its share for this long (None: report only)."""
    mps_binary: str = MPS_CONTROL
    metrics: tuple[str, int] | None = None
    """Where to serve Prometheus metrics (overuse, refusals), or None."""
    housekeeping_seconds: float = 5.0
    """How often MPS daemons are matched to the node's pods (a daemon nobody holds any more is stopped)."""
    settle_seconds: float = 30.0
    """How often pods admitted without an acknowledgement are looked for (at start, then this often: one
    LIST of the node's pods, rare PodResources reads)."""
    dra: bool = False
    """Also be the DRA driver ``gpu.kubecell.io``: publish ResourceSlices and serve the kubelet's DRA plugin."""
    dra_plugin_dir: Path = PLUGIN_DIR
    """Where the DRA socket and the prepared-claims checkpoint are (as this process sees the path)."""
    dra_registry_dir: Path = REGISTRY_DIR
    """The kubelet's plugin registration directory (as this process sees it)."""
    dra_advertised_dir: Path = PLUGIN_DIR
    """``dra_plugin_dir`` as the kubelet sees it (the endpoint given to the kubelet)."""
    cdi_dir: Path = CDI_DIR
    """Where prepared claims' CDI specs are written (the container runtime's CDI directory)."""


METRICS_CONNECTIONS = 32
"""The most connections the metrics port serves at once (one thread each); more are answered 503 and closed.
``prometheus_client.start_http_server`` bounded neither their number nor their time: 200 clients sending a byte a
second held 200 threads for as long as they liked, and under a 256-descriptor limit left no room for a scrape."""
METRICS_SOCKET_SECONDS = 10.0
"""The longest a metrics connection may wait for the client's next bytes (or for it to take the answer's)."""
METRICS_CONNECTION_SECONDS = 30.0
"""The longest a metrics connection may last, request and answer (one each: the server closes after it). The
socket timeout alone bounds each wait, so a client sending a byte every 9 s held its thread for as long as it
liked; a scrape takes milliseconds."""
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 25\r\n\r\n"
         b"too many open connections")


class _MetricsHandler(WSGIRequestHandler):
    """A request of the metrics port: silent, and never waiting on a client longer than the socket timeout."""

    timeout = METRICS_SOCKET_SECONDS  # applied to the connection by StreamRequestHandler.setup

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing (a scrape every few seconds)."""


class _MetricsServer(ThreadingWSGIServer):
    """prometheus_client's threading server with a thread per connection up to ``METRICS_CONNECTIONS``."""

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        self.slots = threading.BoundedSemaphore(METRICS_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self.slots.acquire(blocking=False):  # answered at once, in the accepting thread: never queued
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: nothing else gives the slot back
            self.slots.release()
            raise

    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone or too slow (the socket timeout) is routine on an open port: no traceback on stderr."""
        log.debug("metrics connection from %s ended", client_address, exc_info=True)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        deadline = threading.Timer(METRICS_CONNECTION_SECONDS, _cut, args=(request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.release()


def _cut(request: socket.socket) -> None:
    """End a connection past its time: the thread serving it sees its socket closed and ends."""
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve ``registry`` on ``host``:``port`` from a daemon thread, bounded (see ``METRICS_CONNECTIONS``);
    ``shutdown()`` stops it."""
    server_class = type("MetricsServer", (_MetricsServer,),
                        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server: WSGIServer = make_server(host, port, make_wsgi_app(registry), server_class,
                                     handler_class=_MetricsHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def devices_of(inventory: NodeInventory) -> list[Device]:
    """The device plugin's ``kubecell.io/gpu`` devices: one per GPU UUID, or for a GPU in MIG mode one per
    MIG instance UUID (what the scheduler places there), with the GPU's health and NUMA node."""
    devices = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        numa = (gpu.numa_node,) if gpu.numa_node is not None else ()
        if gpu.mig_mode == "enabled":
            devices += [Device(instance.uuid, gpu.healthy, numa)
                        for instance in sorted(gpu.mig_instances, key=lambda m: (m.start, m.uuid))]
        else:
            devices.append(Device(gpu.uuid, gpu.healthy, numa))
    return devices


def shareable_devices(inventory: NodeInventory) -> list[Device]:
    """The GPUs whose compute can be shared (``kubecell.io/gpu-milli`` slots): not those in MIG mode."""
    return [Device(gpu.uuid, gpu.healthy, (gpu.numa_node,) if gpu.numa_node is not None else ())
            for gpu in sorted(inventory.gpus, key=lambda g: g.index) if gpu.mig_mode != "enabled"]


def plugin_devices(client: PodResourcesClient) -> dict[tuple[str, str], list[str]]:
    """(namespace, pod) -> the device IDs of this agent's device plugins the kubelet gave it (one ``List``): what
    the overuse monitor holds a served pod's record to, since the pod's owner can rewrite the record."""
    return {(pod.namespace, pod.name): [*pod.devices(RESOURCE_GPU), *pod.devices(RESOURCE_GPU_MILLI)]
            for pod in client.list()}


def memory_of(inventory: NodeInventory) -> dict[str, int]:
    """MiB by the UUID a record may name: each GPU, and each MIG instance."""
    memory = {gpu.uuid: gpu.memory_mib for gpu in inventory.gpus}
    memory.update({m.uuid: m.memory_mib for gpu in inventory.gpus for m in gpu.mig_instances})
    return memory


class NodeAgent:
    """The inventory publisher, the two device plugins and the record-reading allocator of one node."""

    def __init__(self, kube: Kube, backend: GpuBackend, options: AgentOptions) -> None:
        self.kube = kube
        self.options = options
        self.whole = DeviceFeed()
        self.milli = DeviceFeed()
        self.memory: dict[str, int] = {}
        self.ready = threading.Event()
        """Set once the GPUs were discovered and both feeds carry them."""
        self.registry = CollectorRegistry()
        modes = options.isolation
        self.mps = MpsDaemons.for_backend(NodeIsolation(modes, options.mps_root), backend,
                                          binary=options.mps_binary, proc_root=options.proc_root)
        if "mps" in modes and not self.mps.available():  # never advertise a limit that would not hold
            log.warning("mps asked for, but this node cannot run MPS control daemons (%s): offering %s only",
                        "no real GPUs" if not self.mps.real_gpus else f"{options.mps_binary} not found",
                        ", ".join(m for m in modes if m != "mps"))
            modes = tuple(m for m in modes if m != "mps")
        client = PodResourcesClient(options.pod_resources)
        self.allocator = RecordAllocator(kube, options.node, lambda: dict(self.memory),
                                         NodeIsolation(modes, options.mps_root),
                                         verify=client.get, prepare=self._prepare)
        self.publisher = InventoryPublisher(kube, options.node, backend, interval=options.interval,
                                            isolation=modes, device_plugin=True, on_change=self._follow)
        self.overuse = OveruseMonitor(kube, options.node, backend, api_pods(kube, options.node), self.registry,
                                      proc_root=options.proc_root, evict_after_seconds=options.evict_after_seconds,
                                      handed=lambda: plugin_devices(client))
        Gauge("kubecell_node_allocation_mismatches", "Pods the kubelet's PodResources showed with other devices "
              "than the agent served", registry=self.registry).set_function(lambda: self.allocator.mismatches)
        self.modes = modes
        """The isolation modes this agent can give (``mps`` only where it holds)."""
        self.dra = DraDriver(kube, options.node, paths=PluginPaths(options.dra_plugin_dir, options.dra_registry_dir,
                                                                   options.dra_advertised_dir),
                             cdi_dir=options.cdi_dir, isolation=lambda: NodeIsolation(self.modes, options.mps_root),
                             acquire=self._prepare, release=self.mps.release,
                             interval=options.interval, faults=self.publisher.health.faults) if options.dra else None
        if self.dra is not None:  # what the plugin prepared bounds the records of the pods using claims
            self.overuse.claimed = self.dra.claim_holdings
        self.plugins = [DevicePlugin(RESOURCE_GPU, self.whole, self.allocator, directory=options.device_plugin_dir),
                        DevicePlugin(RESOURCE_GPU_MILLI, self.milli, self.allocator,
                                     directory=options.device_plugin_dir)]

    def _follow(self, inventory: NodeInventory) -> None:
        """A new inventory (discovery, a health change, MIG reconfigured): the device plugins advertise it, and
        the allocator gives the isolation modes it advertises."""
        gpus = devices_of(inventory)
        self.memory = memory_of(inventory)
        self.allocator.isolation = NodeIsolation(tuple(inventory.isolation), self.options.mps_root)
        self.whole.publish(gpus)
        self.milli.publish(milli_devices(shareable_devices(inventory), self.options.milli_unit))
        if self.dra is not None:
            self.dra.follow(inventory)
        unhealthy = [d.id for d in gpus if not d.healthy]
        log.info("node %s: %d GPU(s)%s", self.options.node, len(gpus),
                 f", unhealthy: {', '.join(unhealthy)}" if unhealthy else "")
        self.ready.set()

    def _prepare(self, record: AllocationRecord) -> None:
        """Before an mps container is answered, its GPU's MPS control daemon runs."""
        if record.isolation == "mps":
            for gpu in record.gpus:
                self.mps.acquire(gpu.uuid, record.allocation_id)

    def _housekeeping(self, stop: threading.Event) -> None:
        """Acknowledge pods admitted while the agent was away (``RecordAllocator.settle``, at start and then
        periodically) and release DRA claims the kubelet never unprepared (as often); stop the MPS daemons no
        running pod holds any more (and restart dead ones that one still does)."""
        next_settle = 0.0
        while True:
            if time.monotonic() >= next_settle:
                next_settle = time.monotonic() + self.options.settle_seconds
                try:
                    self.allocator.settle()
                except Exception as error:  # the API server or the kubelet's socket may be away: next round
                    log.warning("acknowledging admitted pods failed: %s", error)
                if self.dra is not None:
                    try:
                        self.dra.sweep()  # claims the kubelet never unprepared
                    except Exception:  # never the end of this thread: the MPS daemons depend on it
                        log.exception("sweeping prepared claims failed; next round")
            if "mps" in self.allocator.isolation.modes:
                try:
                    # once discovered, only the node's GPUs: before, a record naming a GPU may be a running pod's
                    known = set(self.memory) if self.ready.is_set() else None
                    token = self.mps.token()  # holds taken while the pods are read are kept
                    holders = mps_holders(api_pods(self.kube, self.options.node)(), self.options.node, known)
                    for uuid, held in (self.dra.mps_holders() if self.dra is not None else {}).items():
                        holders.setdefault(uuid, set()).update(held)  # claims prepared through DRA hold too
                    self.mps.reconcile(holders, since=token)
                except (KubecellError, OSError) as error:
                    log.warning("MPS housekeeping failed: %s", error)
            if stop.wait(self.options.housekeeping_seconds):
                return

    def run(self, stop: threading.Event, *, ready_timeout: float = 60.0) -> None:
        """Publish, then serve the kubelet until ``stop``."""
        server = None
        if self.options.metrics is not None:
            host, port = self.options.metrics
            server = serve_metrics(self.registry, host, port)
        self.publisher.start()
        workers = [threading.Thread(target=self.overuse.run, args=(stop,), daemon=True, name="overuse"),
                   threading.Thread(target=self._housekeeping, args=(stop,), daemon=True, name="mps")]
        try:
            if not self.ready.wait(ready_timeout):
                log.warning("no GPU inventory after %.0f s (%s); serving an empty device list",
                            ready_timeout, self.publisher.last_error or "no error reported")
            for plugin in self.plugins:
                plugin.start()
            if self.dra is not None:
                self.dra.start()
            for worker in workers:
                worker.start()
            stop.wait()
        finally:
            if self.dra is not None:
                self.dra.stop()
            for plugin in self.plugins:
                plugin.stop()
            self.publisher.stop()
            for worker in workers:
                if worker.is_alive():
                    worker.join(10)
            if server is not None:
                server.shutdown()
