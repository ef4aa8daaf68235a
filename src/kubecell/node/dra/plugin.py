"""The kubelet side of ``gpu.kubecell.io``: plugin registration and the DRA gRPC service, over Unix sockets.

The kubelet finds DRA drivers the way it finds CSI drivers: its plugin watcher sees a socket appear in
``/var/lib/kubelet/plugins_registry``, calls ``pluginregistration.Registration/GetInfo`` on it and learns
the driver's name, the endpoint of its ``DRAPlugin`` service and the service versions it speaks (the
v1.37 kubelet accepts ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` and picks the first it knows), then tells
the result with ``NotifyRegistrationStatus``. From then on it dials the endpoint for
``NodePrepareResources``/``NodeUnprepareResources`` (:mod:`.prepared` does the work) of pods on its node.

The endpoint is a path *as the kubelet sees it*: the agent may see the kubelet's directories elsewhere (a
container mounting them under another path; the testbed's kubelet in a mount namespace where
``<root>/var-lib`` is ``/var/lib``), so :class:`PluginPaths` keeps where the sockets are created apart from
the directory advertised. Each socket has its own gRPC server; a socket that disappears (someone cleaned
the directory) is served again on a fresh one, which the kubelet's watcher registers again.

:class:`DraDriver` is what the node agent holds: the slice publisher, the claim preparer and these servers.
The same socket serves the optional resource-health service (:mod:`.health`): a GPU hit by a critical XID
leaves the slice, so nothing new is allocated on it, and the kubelet marks it ``Unhealthy`` in the status of
every container that holds it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from kubecell.kube import dra_names as names
from kubecell.kube.gpu_faults import RecordedFault
from kubecell.kube.inventory_schema import NodeInventory
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import Kube
from kubecell.node import protos
from kubecell.node.dra.cdi import CDI_DIR
from kubecell.node.dra.checkpoint import Checkpoint, ClaimRef
from kubecell.node.dra.health import HealthBoard, HealthService, device_health
from kubecell.node.dra.prepared import ClaimPreparer
from kubecell.node.dra.publisher import DEFAULT_INTERVAL, SlicePublisher
from kubecell.node.dra.sweep import ClaimSweeper
from kubecell.node.isolation import NodeIsolation

log = logging.getLogger("kubecell.node.dra")

REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
"""The kubelet's plugin registration directory (``<root-dir>/plugins_registry``)."""
PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / names.DRIVER
"""The driver's own directory under the kubelet's (its DRA socket and the checkpoint)."""
DRA_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{names.DRIVER}-reg.sock"
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1.DRAResourceHealth")
"""The services we serve, by the names the kubelet matches: ``validateSupportedServices`` the first
(``k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService``), ``pickHealthService`` the optional second
(``dra-health/v1.DRAResourceHealthService``; the kubelet then opens ``NodeWatchResources`` on the endpoint)."""


@dataclass(frozen=True, slots=True)
class PluginPaths:
    """Where the plugin listens, and how the kubelet names the same directory."""

    plugin_dir: Path = PLUGIN_DIR
    registry_dir: Path = REGISTRY_DIR
    advertised_dir: Path = PLUGIN_DIR

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / DRA_SOCKET

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / REGISTRATION_SOCKET

    @property
    def endpoint(self) -> str:
        """The DRA socket as the kubelet dials it (``GetInfo``'s ``endpoint``)."""
        return str(self.advertised_dir / DRA_SOCKET)

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"


class _Registration:
    """``pluginregistration.Registration``: who we are, and what the kubelet made of it."""

    def __init__(self, plugin: KubeletPlugin) -> None:
        self._plugin = plugin
        self._pb2 = protos.pluginregistration().pb2

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self._plugin.info_calls += 1
        return self._pb2.PluginInfo(type=PLUGIN_TYPE, name=names.DRIVER, endpoint=self._plugin.paths.endpoint,
                                    supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._plugin.registration_error = str(request.error)
        if request.plugin_registered:
            log.info("%s: the kubelet registered the plugin (endpoint %s)", names.DRIVER, self._plugin.paths.endpoint)
            self._plugin.registered.set()
        else:
            log.error("%s: the kubelet refused the plugin: %s", names.DRIVER, request.error)
            self._plugin.registered.clear()
        return self._pb2.RegistrationStatusResponse()


class _DraService:
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: a translation between protos and :class:`ClaimPreparer`."""

    def __init__(self, plugin: KubeletPlugin) -> None:
        self._plugin = plugin
        self._pb2 = protos.dra().pb2

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        self._plugin.prepare_calls += 1
        try:
            answers: dict[str, Any] = dict(self._plugin.preparer.prepare(refs))
        except Exception as error:  # a bug: each claim fails with it, the RPC itself answers
            log.exception("NodePrepareResources")
            answers = {ref.uid: f"internal error: {error}" for ref in refs}
        claims = {}
        for uid, answer in answers.items():
            if isinstance(answer, str):
                claims[uid] = self._pb2.NodePrepareResourceResponse(error=answer)
                continue
            devices = []
            for d in answer.devices:
                device = self._pb2.Device(request_names=list(d.request_names), pool_name=d.pool,
                                          device_name=d.device, cdi_device_ids=list(d.cdi_ids))
                if d.share_id is not None:
                    device.share_id = d.share_id
                devices.append(device)
            claims[uid] = self._pb2.NodePrepareResourceResponse(devices=devices)
        return self._pb2.NodePrepareResourcesResponse(claims=claims)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        self._plugin.unprepare_calls += 1
        try:
            answers = self._plugin.preparer.unprepare(refs)
        except Exception as error:
            log.exception("NodeUnprepareResources")
            answers = {ref.uid: f"internal error: {error}" for ref in refs}
        return self._pb2.NodeUnprepareResourcesResponse(
            claims={uid: self._pb2.NodeUnprepareResourceResponse(error=error) for uid, error in answers.items()})


class KubeletPlugin:
    """The registration and DRA servers of ``gpu.kubecell.io``; counters and ``registered`` are for tests."""

    def __init__(self, preparer: ClaimPreparer, paths: PluginPaths, *, poll_interval: float = 1.0,
                 health: HealthService | None = None) -> None:
        self.preparer = preparer
        self.paths = paths
        self.health = health or HealthService(HealthBoard())
        """The resource-health service (streams the board the driver publishes to)."""
        self.poll_interval = poll_interval
        self.registered = threading.Event()
        """Set once the kubelet said it registered the plugin (``NotifyRegistrationStatus``)."""
        self.registration_error = ""
        self.info_calls = 0
        self.prepare_calls = 0
        self.unprepare_calls = 0
        self._servers: dict[Path, Any] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._stop.clear()
        self.health.board.reopen()
        with self._lock:
            self._serve(self.paths.dra_socket)
            self._serve(self.paths.registration_socket)  # last: the kubelet may dial the endpoint at once
        self._watcher = threading.Thread(target=self._watch, name="dra-plugin-sockets", daemon=True)
        self._watcher.start()

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self.health.board.close()  # the streams end now, not when the server's grace runs out
        if self._watcher is not None:
            self._watcher.join(self.poll_interval + 5)
            self._watcher = None
        with self._lock:
            for socket in list(self._servers):
                self._halt(socket, grace)
                socket.unlink(missing_ok=True)  # the kubelet's watcher deregisters us when it goes

    def _serve(self, socket: Path) -> None:
        self._halt(socket, 0.5)
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        # a Prepare may wait the API client's whole timeout on a slow server (it reads the claim without the
        # preparer's lock): 16 threads, so that an Unprepare, which needs no API, does not queue behind four
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="dra-plugin"))
        if socket == self.paths.registration_socket:
            protos.pluginregistration().grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        else:
            protos.dra().grpc.add_DRAPluginServicer_to_server(_DraService(self), server)
            protos.dra_health().grpc.add_DRAResourceHealthServicer_to_server(self.health, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        self._servers[socket] = server

    def _halt(self, socket: Path, grace: float) -> None:
        server = self._servers.pop(socket, None)
        if server is not None:
            server.stop(grace).wait(grace + 1)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            with self._lock:
                for socket in (self.paths.dra_socket, self.paths.registration_socket):
                    if not socket.exists() and not self._stop.is_set():
                        log.warning("%s vanished; serving it again", socket)
                        try:
                            self._serve(socket)
                        except (OSError, RuntimeError) as error:
                            log.warning("cannot serve %s: %s", socket, error)


class DraDriver:
    """What ``kubecell node-agent --dra`` adds: slices that follow the inventory, and the kubelet plugin."""

    def __init__(self, kube: Kube, node: str, *, paths: PluginPaths, cdi_dir: Path = CDI_DIR,
                 isolation: Callable[[], NodeIsolation], acquire: Callable[[AllocationRecord], None] | None = None,
                 release: Callable[[str, str], None] | None = None, interval: float = DEFAULT_INTERVAL,
                 faults: Callable[[], Mapping[str, RecordedFault]] = dict) -> None:
        """``faults``: why each unhealthy GPU is (the agent's XID tracker), told to the kubelet with its health."""
        self._inventory: NodeInventory | None = None
        self._node = node
        self._faults = faults
        self.publisher = SlicePublisher(kube, node, interval=interval)
        self.preparer = ClaimPreparer(kube, node, cdi_dir=cdi_dir, checkpoint=Checkpoint.load(paths.checkpoint),
                                      inventory=lambda: self._inventory, isolation=isolation, acquire=acquire,
                                      release=release)
        self.health = HealthBoard()
        self.plugin = KubeletPlugin(self.preparer, paths, health=HealthService(self.health))
        self.sweeper = ClaimSweeper(kube, node, self.preparer)

    def follow(self, inventory: NodeInventory) -> None:
        """A new inventory: the slices follow it, claims are prepared against it, and the kubelet is told the health
        of every device (those that left the slice too)."""
        self._inventory = inventory
        self.publisher.update(inventory)
        self.health.publish(device_health(inventory, self._node, self._faults()))

    def mps_holders(self) -> dict[str, set[str]]:
        return self.preparer.mps_holders()

    def claim_holdings(self) -> dict[tuple[str, str], dict[str, tuple[int, int]] | None]:
        return self.preparer.claim_holdings()

    def sweep(self) -> None:
        """Release the claims the kubelet never unprepared (:mod:`.sweep`); called by the agent's housekeeping."""
        self.sweeper.sweep()

    def start(self) -> None:
        self.publisher.start()
        self.plugin.start()

    def stop(self) -> None:
        self.plugin.stop()
        self.publisher.stop()
