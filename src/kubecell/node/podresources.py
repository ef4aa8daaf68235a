"""A client of the kubelet's PodResources API v1: which pod's containers hold which devices.

``Allocate`` tells a device plugin device IDs, never the pod; after the kubelet admitted a pod the agent
asks this API which devices each container really got and compares that with the scheduler's record,
so a mismatch is found and reported instead of trusted. The kubelet serves it on
``/var/lib/kubelet/pod-resources/kubelet.sock``; answers are returned as plain dataclasses so that the
rest of the agent never touches generated protobuf classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc  # type: ignore[import-untyped]

from kubecell.core.errors import KubecellError
from kubecell.node import protos

POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The kubelet's own PodResources clients allow 16 MiB answers; a node with many pods needs more than 4."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """One container's devices, by resource name (device IDs in the kubelet's order)."""

    name: str
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodDevices:
    namespace: str
    name: str
    containers: tuple[ContainerDevices, ...] = ()

    def devices(self, resource: str) -> tuple[str, ...]:
        """All device IDs of ``resource`` held by any container of the pod."""
        return tuple(i for container in self.containers for i in container.devices.get(resource, ()))


def _devices(messages: Any) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {}
    for message in messages:
        found.setdefault(str(message.resource_name), []).extend(str(i) for i in message.device_ids)
    return {resource: tuple(ids) for resource, ids in found.items()}


def pod_from_proto(message: Any) -> PodDevices:
    return PodDevices(str(message.namespace), str(message.name),
                      tuple(ContainerDevices(str(c.name), _devices(c.devices)) for c in message.containers))


class PodResourcesError(KubecellError):
    """The kubelet's PodResources API did not answer (socket missing, kubelet restarting, answer too large)."""


class PodResourcesClient:
    """``List``, ``Get`` and ``GetAllocatableResources`` with bounded deadlines; use as a context manager."""

    def __init__(self, socket: Path = POD_RESOURCES_SOCKET, *, timeout: float = 10.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout
        self._api = protos.podresources()
        self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._stub = self._api.grpc.PodResourcesListerStub(self._channel)

    def _failed(self, call: str, error: Any) -> PodResourcesError:
        """A gRPC failure as one line naming the call, the socket and the status (not grpc's debug dump)."""
        code = error.code() if callable(getattr(error, "code", None)) else None
        details = error.details() if callable(getattr(error, "details", None)) else str(error)
        return PodResourcesError(f"PodResources {call} on {self.socket}: {getattr(code, 'name', 'error')}: {details}")

    def list(self) -> list[PodDevices]:
        """Every pod the kubelet knows with the devices of its containers."""
        try:
            response = self._stub.List(self._api.pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as error:
            raise self._failed("List", error) from None
        return [pod_from_proto(pod) for pod in response.pod_resources]

    def get(self, namespace: str, name: str) -> PodDevices | None:
        """One pod's devices, or None when the kubelet does not know the pod."""
        request = self._api.pb2.GetPodResourcesRequest(pod_namespace=namespace, pod_name=name)
        try:
            response = self._stub.Get(request, timeout=self.timeout)
        except grpc.RpcError as error:
            # The kubelet answers an unknown pod with a plain Go error: code Unknown, "pod ... not found".
            if error.code() == grpc.StatusCode.NOT_FOUND or (
                    error.code() == grpc.StatusCode.UNKNOWN and "not found" in (error.details() or "")):
                return None
            raise self._failed(f"Get({namespace}/{name})", error) from None
        return pod_from_proto(response.pod_resources)

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        """The device IDs the kubelet can allocate, by resource name."""
        try:
            response = self._stub.GetAllocatableResources(self._api.pb2.AllocatableResourcesRequest(),
                                                          timeout=self.timeout)
        except grpc.RpcError as error:
            raise self._failed("GetAllocatableResources", error) from None
        return _devices(response.devices)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
