"""Device health for the kubelet: ``v1.DRAResourceHealth`` (KEP-4680), so a pod sees that its GPU broke.

A GPU hit by a critical XID leaves the node's ResourceSlice, so nothing new is allocated on it; but the pods
already holding it would learn nothing. The kubelet (``ResourceHealthStatus``, beta and on in v1.37) streams
device health from a DRA plugin that offers this service and writes it into every container that uses the
device: ``status.containerStatuses[].allocatedResourcesStatus`` (``claim:<claim>``, the resource named by the
CDI device ``NodePrepareResources`` answered with, ``health: Unhealthy`` and the message), where a job
controller or an operator (``kubectl get pod -o yaml``) can act on it.

Each report is the whole pool, healthy devices included, because the kubelet forgets a device it has not
heard of within the timeout each report gives (``health_check_timeout_seconds``) and shows it ``Unknown``. So a
report goes out when the stream opens, at once on every change, and every ``REPORT_SECONDS`` otherwise.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.kube.gpu_faults import RecordedFault
from kubecell.kube.inventory_schema import NodeInventory
from kubecell.node import protos
from kubecell.node.dra.slices import all_devices

REPORT_SECONDS = 10.0
"""Seconds between reports when nothing changed."""
TIMEOUT_SECONDS = 3 * int(REPORT_SECONDS)
"""The timeout each report gives: the kubelet shows a device ``Unknown`` after three missed reports (a hung
agent), not after one late one."""
MAX_MESSAGE_CHARS = 1024
"""The kubelet cuts longer messages (``truncateHealthMessage``); ours are cut here, where the cut is chosen."""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device of the pool as the kubelet is told about it."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


def device_health(inventory: NodeInventory, pool: str, faults: Mapping[str, RecordedFault]) -> tuple[DeviceHealth, ...]:
    """Every device the inventory describes, by the names the slice gives them (``slices.all_devices``), with its
    health. Devices of unhealthy GPUs are left out of the slice but reported here: they are the ones pods hold."""
    reports = []
    for device in all_devices(inventory):
        if device.healthy:
            reports.append(DeviceHealth(pool, device.name, True))
            continue
        fault = faults.get(device.gpu.uuid)
        why = "reported unhealthy by the node agent" if fault is None else str(fault)
        whose = f"its GPU {device.gpu.index} ({device.gpu.uuid})" if device.is_mig \
            else f"GPU {device.gpu.index} ({device.gpu.uuid})"
        message = (f"{whose}: {why}; it left the node's ResourceSlice and takes no new claims until an "
                   "operator clears it")
        reports.append(DeviceHealth(pool, device.name, False, message[:MAX_MESSAGE_CHARS]))
    return tuple(reports)


class HealthBoard:
    """The pool's health as last published, and a way for streams to wait for the next change.

    Thread-safe: the agent's inventory thread publishes, every open stream (one per kubelet connection, each
    on a gRPC worker thread) waits."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._reports: tuple[DeviceHealth, ...] = ()
        self._version = 0
        """Raised on every change; 0 until the first inventory (nothing is reported before it)."""
        self._closed = False

    def publish(self, reports: tuple[DeviceHealth, ...]) -> bool:
        """Take a new report; True (and the streams woken) when it differs from the last one."""
        with self._changed:
            if reports == self._reports and self._version > 0:
                return False
            self._reports = reports
            self._version += 1
            self._changed.notify_all()
            return True

    def close(self) -> None:
        """End every stream (the plugin stops); the kubelet reconnects to the next agent."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def reopen(self) -> None:
        with self._changed:
            self._closed = False

    def wake(self) -> None:
        """Wake every waiting stream to ask again whether it is still wanted (a stream was cancelled or a newer
        one opened)."""
        with self._changed:
            self._changed.notify_all()

    def next(self, seen: int, timeout: float,
             wanted: Callable[[], bool] = lambda: True) -> tuple[int, tuple[DeviceHealth, ...]] | None:
        """The reports once they differ from version ``seen``, or after ``timeout`` seconds unchanged (then the
        same again, which keeps the kubelet's entries fresh; version 0 while nothing was ever published). None
        once closed, or once ``wanted`` says no (asked at every wake)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._closed and self._version == seen and wanted():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return None if self._closed or not wanted() else (self._version, self._reports)


def response(reports: tuple[DeviceHealth, ...], now: float) -> Any:
    """``NodeWatchResourcesResponse`` of ``reports``."""
    pb2 = protos.dra_health().pb2
    return pb2.NodeWatchResourcesResponse(devices=[
        pb2.DeviceHealth(device=pb2.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                         health=pb2.HEALTHY if r.healthy else pb2.UNHEALTHY, last_updated_time=int(now),
                         health_check_timeout_seconds=TIMEOUT_SECONDS, message=r.message)
        for r in reports])


class HealthService:
    """``v1.DRAResourceHealth``: one long-lived stream, fed by a :class:`HealthBoard`.

    A stream holds one of the server's worker threads for as long as it is open, and those threads also answer
    ``NodePrepareResources``. The kubelet keeps one stream per plugin and opens a new one after an error, so a
    new stream ends the older ones, and a cancelled stream ends at once (not at its next report): however
    often the kubelet reconnects, one thread streams, and claims are never left waiting for a thread."""

    def __init__(self, board: HealthBoard, report_seconds: float = REPORT_SECONDS) -> None:
        self.board = board
        self._report_seconds = report_seconds
        self._lock = threading.Lock()
        self.streams = 0
        """Streams opened (the newest is the one served)."""
        self.open = 0
        """Streams holding a thread now."""

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802 - gRPC method name
        with self._lock:
            self.streams += 1
            mine = self.streams
        self.board.wake()  # the older streams end
        context.add_callback(self.board.wake)  # cancelled or done: this stream's wait ends now

        def wanted() -> bool:
            return self.streams == mine and bool(context.is_active())

        with self._lock:
            self.open += 1
        try:
            seen = 0
            while wanted():
                update = self.board.next(seen, self._report_seconds, wanted)
                if update is None:
                    return
                seen, reports = update
                if seen > 0:  # nothing said before the first inventory: the kubelet would mark every device gone
                    yield response(reports, time.time())
        finally:
            with self._lock:
                self.open -= 1
