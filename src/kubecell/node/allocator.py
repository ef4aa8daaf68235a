"""``Allocate`` from the scheduler's allocation record: the device plugin never guesses the pod.

The kubelet's ``Allocate`` names device IDs, not the pod they are for. kubecell's scheduler binds GPU pods
to a node served by this agent one at a time (``kubecell.scheduler.gate``): a pod is bound only after
the agent acknowledged the one before it. So at any moment at most one pod bound here asks for the
plugin's resources and carries a record the agent has not acknowledged: that is the pod ``Allocate``
serves. The agent checks that its record is for this node, names GPUs this node has, and covers the
device IDs the kubelet chose; gives the container its GPUs and isolation (``kubecell.node.isolation``);
once every GPU container of the pod is served, checks that the kubelet gave it every GPU (and on a share,
every milli-GPU) the record names, and writes the acknowledgement (``kubecell.io/allocated`` = the
allocation id); and then checks with the kubelet's PodResources API that the kubelet recorded those devices
for that pod. Anything else (no such pod, two of them, a record for another node or GPU, a corrupt
record, devices the record does not name, a record naming more than the kubelet gave) is refused: an error
to the kubelet, which fails the pod's admission, and a Warning Event on the pod. No pod ever starts on a
GPU its record does not name, nor with a record granting it a GPU the kubelet did not give it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.kube import pods
from kubecell.kube.actions import Actions
from kubecell.kube.names import ANNOTATION_ACK, RESOURCE_GPU, RESOURCE_GPU_MILLI
from kubecell.kube.records import AllocationRecord, RecordError
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.deviceplugin import AllocationRefused, ContainerAllocation, gpu_of
from kubecell.node.isolation import NodeIsolation, container_allocation
from kubecell.node.podresources import PodDevices

log = logging.getLogger("kubecell.node")

PLUGIN_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU_MILLI)


def plugin_container_order(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's containers that ask for a device-plugin resource (one ``Allocate`` each), in the
    order the kubelet allocates them: init containers, then the others, each in spec order."""
    spec = pod.get("spec") or {}
    names = []
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = container.get("resources") or {}
        asked = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
        if any(name in asked for name in PLUGIN_RESOURCES):
            names.append(str(container.get("name", "")))
    return names


def plugin_container_names(pod: Mapping[str, Any]) -> set[str]:
    """The names of the pod's containers that ask for a device-plugin resource (one ``Allocate`` each)."""
    return set(plugin_container_order(pod))


def _hidden_from_pod_resources(pod: Mapping[str, Any]) -> set[str]:
    """The GPU init containers that are not sidecars (``restartPolicy: Always``): the kubelet's PodResources
    lists no such container (upstream ``podresources/server_v1.go``), so it cannot show their devices."""
    spec = pod.get("spec") or {}
    return {str(c.get("name", "")) for c in spec.get("initContainers") or () if c.get("restartPolicy") != "Always"}


def _started(pod: Mapping[str, Any], name: str) -> bool:
    """Whether the kubelet reports init container ``name`` running or ended: its ``Allocate`` came first."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or ():
        if isinstance(status, Mapping) and status.get("name") == name:
            state = status.get("state") or {}
            return bool(state.get("running") or state.get("terminated"))
    return False


def plugin_containers(pod: Mapping[str, Any]) -> int:
    """How many of the pod's containers ask for a device-plugin resource (one ``Allocate`` each)."""
    return len(plugin_container_names(pod))


@dataclass
class Served:
    """A pod whose containers are being served: how many Allocate calls it had, and its devices."""

    record: AllocationRecord
    pod: dict[str, Any]
    calls: int = 0
    devices: dict[str, set[str]] = field(default_factory=dict)


class RecordAllocator:
    """The device plugin's ``Allocator`` for this node (one instance serves every resource)."""

    def __init__(self, kube: Kube, node: str, gpus: Callable[[], Mapping[str, int]], isolation: NodeIsolation,
                 *, verify: Callable[[str, str], PodDevices | None] | None = None,
                 verify_after: float = 0.5, prepare: Callable[[AllocationRecord], None] | None = None) -> None:
        self.kube = kube
        self.node = node
        self.gpus = gpus
        """UUID -> memory (MiB) of every GPU this node has (from NVML, through the inventory)."""
        self.isolation = isolation
        self.verify = verify
        """PodResources ``Get(namespace, name)``, to check afterwards what the kubelet recorded."""
        self.verify_after = verify_after
        self.prepare = prepare
        """Called before a container is answered (the MPS daemon of its GPU must run before it starts);
        a ``KubecellError`` from it refuses the pod."""
        self.actions = Actions(kube, "kubecell-node-agent", host=node)
        self.lock = threading.Lock()  # the kubelet may call for two resources of one pod at once
        self.serving: dict[str, Served] = {}
        self.uncovered: set[str] = set()
        """Allocation ids ``settle`` found naming more than the kubelet gave (told once, never acknowledged)."""
        self.mismatches = 0
        """Allocations the kubelet's PodResources contradicted (exported as a metric)."""

    # ------------------------------------------------------------------ the Allocator protocol
    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        """The devices the record names (whole GPUs), or slots on the record's GPU (shares)."""
        try:
            served = self._pending()
        except AllocationRefused:
            return []  # Allocate will refuse with the reason
        wanted = {gpu.uuid for gpu in served.record.gpus}
        chosen = [d for d in must_include if gpu_of(d) in wanted]
        for device in available:
            if len(chosen) >= size:
                break
            if gpu_of(device) in wanted and device not in chosen:
                chosen.append(device)
        return chosen[:size]

    def allocate(self, resource: str, container_requests: list[list[str]]) -> list[ContainerAllocation]:
        with self.lock:
            served = self._pending()
            record = served.record
            fresh = served.calls == 0
            answers = []
            if self.prepare is not None:
                try:
                    self.prepare(record)
                except KubecellError as error:
                    raise self._refuse(served.pod, f"cannot prepare isolation {record.isolation}: {error}") from None
            for devices in container_requests:
                self._check_devices(served, resource, devices)
                try:
                    answers.append(container_allocation(record, self.isolation, self.gpus()))
                except RecordError as error:
                    raise self._refuse(served.pod, str(error)) from None
                served.devices.setdefault(resource, set()).update(devices)
                served.calls += 1
            needed = max(1, plugin_containers(served.pod))
            if fresh and served.calls < needed:
                self._recall(served)
            if served.calls >= needed:
                self._check_covered(served)
                self._acknowledge(served)
            return answers

    def settle(self) -> list[str]:
        """Acknowledge the pods the kubelet admitted while nobody acknowledged them, from PodResources; returns
        their allocation ids. An agent that restarted between the ``Allocate`` calls of a pod's containers
        served the later ones but never counted the earlier; without this the pod would run unacknowledged
        and hold its node's next GPU pod forever. A pod is acknowledged only when PodResources shows devices of
        kubecell's resources for every one of its GPU containers, all on GPUs its record names: the kubelet
        records them after each ``Allocate``, so no call of that pod is still to come."""
        if self.verify is None:
            return []
        settled = []
        listed = self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")["items"]
        for pod in listed:  # reads outside the lock: a kubelet's Allocate never waits for them
            if not self._waiting(pod):
                continue
            try:
                record = pods.record_of(pod)
            except RecordError:
                continue  # refused, loudly, when the kubelet asks for it
            if record is None or record.node != self.node:
                continue
            found = self.verify(pod["metadata"]["namespace"], pod["metadata"]["name"])
            if found is None:
                continue
            devices: dict[str, set[str]] = {}
            gpu_containers = plugin_container_names(pod)
            hidden = gpu_containers & _hidden_from_pod_resources(pod)
            wanted = gpu_containers - hidden
            if not gpu_containers or not all(_started(pod, name) for name in hidden):
                continue  # an init container PodResources cannot show counts once the kubelet started it
            served_names: set[str] = set()  # by name: a container listed twice, or one the pod lacks, is no proof
            for container in found.containers:
                ours = {r: set(ids) for r, ids in container.devices.items() if r in PLUGIN_RESOURCES and ids}
                if ours and container.name in wanted:
                    served_names.add(container.name)
                for resource, ids in ours.items():
                    devices.setdefault(resource, set()).update(ids)
            named = {gpu.uuid for gpu in record.gpus}
            if served_names != wanted or any(gpu_of(d) not in named for ids in devices.values() for d in ids):
                continue
            served = Served(record, pod, len(served_names) + len(hidden), devices)
            try:  # as Allocate checks it: a pod admitted across a restart is no exception
                self._check_covered(served, tell=record.allocation_id not in self.uncovered)
            except AllocationRefused:
                self.uncovered.add(record.allocation_id)  # told once; it runs, never acknowledged
                continue
            log.info("%s was admitted without an acknowledgement (the agent restarted meanwhile): "
                     "acknowledging from PodResources", pods.key(pod))
            with self.lock:  # the same id an Allocate of this pod would write: idempotent either way
                self._acknowledge(served)
            settled.append(record.allocation_id)
        return settled

    def _recall(self, served: Served) -> None:
        """Count the pod's containers the kubelet had devices for before this agent first served it. An agent that
        restarted between a pod's ``Allocate`` calls sees the later ones only: it took none of them for the last,
        answered it without checking the record is covered (``_check_covered``), and ``settle`` acknowledged the
        pod unchecked. PodResources shows the devices the kubelet recorded after each earlier call, and the
        kubelet allocates a pod's containers in order (``plugin_container_order``), so every GPU container up to
        the last one shown was served (a non-sidecar init container, which it never shows, too). Asked at a
        pod's first call in this process only; unanswered, the pod is left to ``settle``, which checks the same."""
        if self.verify is None:
            return
        meta = served.pod["metadata"]
        try:
            found = self.verify(meta["namespace"], meta["name"])
        except Exception as error:  # the kubelet's socket may be restarting: settle checks it later
            log.warning("PodResources of %s cannot be read (%s): its earlier containers are not counted",
                        pods.key(served.pod), error)
            return
        order = plugin_container_order(served.pod)
        shown = [container for container in found.containers if container.name in order and any(
            ids for resource, ids in container.devices.items() if resource in PLUGIN_RESOURCES)] if found else []
        earlier = max((order.index(container.name) + 1 for container in shown), default=0)
        if not earlier:
            return
        log.info("%s: %d of its GPU containers were served before this agent started", pods.key(served.pod), earlier)
        served.calls += earlier
        for container in shown:
            for resource, ids in container.devices.items():
                if resource in PLUGIN_RESOURCES:
                    served.devices.setdefault(resource, set()).update(ids)

    # ------------------------------------------------------------------ finding the pod
    def _pending(self) -> Served:
        """The one pod on this node waiting for its GPUs; refused when there is none or more than one."""
        listed = self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")["items"]
        waiting = [pod for pod in listed if self._waiting(pod)]
        if not waiting:
            raise AllocationRefused(f"no pod bound to node {self.node} waits for its GPUs (none carries an allocation "
                                    "record this agent has not acknowledged): kubecell serves the pods its "
                                    "scheduler placed, and will not guess")
        if len(waiting) > 1:
            names = ", ".join(sorted(pods.key(pod) for pod in waiting))
            for pod in waiting:
                self._event(pod, f"{len(waiting)} pods wait for their GPUs on {self.node} at once ({names}); "
                                 "the agent cannot tell which one the kubelet's Allocate serves and refuses all")
            raise AllocationRefused(f"{len(waiting)} pods wait for their GPUs on node {self.node} ({names}): "
                                    "kubecell's scheduler binds one at a time here, so another scheduler bound one; "
                                    "refusing rather than guessing")
        pod = waiting[0]
        uid = pods.uid(pod)
        try:
            record = pods.record_of(pod)
        except RecordError as error:
            raise self._refuse(pod, f"its allocation record cannot be trusted: {error}") from None
        assert record is not None
        if record.node != self.node:
            raise self._refuse(pod, f"its allocation record is for node {record.node}, not {self.node}")
        have = self.gpus()
        unknown = [gpu.uuid for gpu in record.gpus if gpu.uuid not in have]
        if unknown:
            raise self._refuse(pod, f"its allocation record names GPU(s) {', '.join(unknown)}, which node "
                                    f"{self.node} does not have")
        served = self.serving.get(uid)
        if served is None or served.record.allocation_id != record.allocation_id:
            served = self.serving[uid] = Served(record, pod)
        return served

    @staticmethod
    def _waiting(pod: Mapping[str, Any]) -> bool:
        annotations = pod["metadata"].get("annotations") or {}
        return (not pods.is_done(pod) and plugin_containers(pod) > 0 and "kubecell.io/allocation" in annotations
                and ANNOTATION_ACK not in annotations)

    # ------------------------------------------------------------------ checks and writes
    def _check_devices(self, served: Served, resource: str, devices: Sequence[str]) -> None:
        record = served.record
        named = {gpu.uuid for gpu in record.gpus}
        stray = sorted({gpu_of(d) for d in devices} - named)
        if stray:
            raise self._refuse(served.pod, f"the kubelet chose {resource} devices on GPU(s) {', '.join(stray)}, which "
                                           f"its record ({record.allocation_id}) does not name")
        if resource == RESOURCE_GPU_MILLI and len(devices) > record.gpu_milli * max(1, len(record.gpus)):
            raise self._refuse(served.pod, f"{len(devices)} milli-GPU asked, its record grants {record.gpu_milli}")

    def _check_covered(self, served: Served, *, tell: bool = True) -> None:
        """Once every GPU container is served: the kubelet gave the pod every GPU its record names, and on a share
        at least the record's milli-GPU in slots. The environment comes from the record, which a user binding
        a pod by hand writes as they like, while the kubelet reserves only what the pod's resources ask: a
        record naming more would give the pod a GPU (or a share) the kubelet may give another pod too, and make
        that use look accounted to the overuse monitor. Devices outside the record are refused call by call."""
        record = served.record
        given: dict[str, set[str]] = {}
        for ids in served.devices.values():
            for device in ids:
                given.setdefault(gpu_of(device), set()).add(device)
        missing = [gpu.uuid for gpu in record.gpus if gpu.uuid not in given]
        short = [f"{gpu.uuid} ({len(given[gpu.uuid])} of {gpu.milli})" for gpu in record.gpus
                 if gpu.uuid in given and gpu.uuid not in given[gpu.uuid] and len(given[gpu.uuid]) < gpu.milli]
        if missing:
            why = (f"its record ({record.allocation_id}) names GPU(s) {', '.join(missing)}, on which the kubelet gave "
                   "none of its containers a device")
        elif short:
            why = (f"its record ({record.allocation_id}) grants more milli-GPU than the kubelet gave its containers "
                   f"slots of: {', '.join(short)}")
        else:
            return
        if tell:
            raise self._refuse(served.pod, why)
        raise AllocationRefused(f"{pods.key(served.pod)}: {why}")

    def _acknowledge(self, served: Served) -> None:
        pod, record = served.pod, served.record
        path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        self.kube.patch(path, {"metadata": {"uid": pods.uid(pod),
                                            "annotations": {ANNOTATION_ACK: record.allocation_id}}})
        self.serving.pop(pods.uid(pod), None)
        log.info("served %s: %s", pods.key(pod), record.allocation_id)
        if self.verify is not None:
            threading.Thread(target=self._verify, args=(served,), daemon=True, name="verify").start()

    def _verify(self, served: Served) -> None:
        """After the kubelet recorded the devices: PodResources must show them for this very pod."""
        assert self.verify is not None
        meta = served.pod["metadata"]
        deadline = time.monotonic() + 10 * max(self.verify_after, 0.1)
        while time.monotonic() < deadline:
            time.sleep(self.verify_after)
            try:
                found = self.verify(meta["namespace"], meta["name"])
            except Exception as error:  # the kubelet's socket may be restarting: try again, bounded
                log.warning("PodResources check of %s failed: %s", pods.key(served.pod), error)
                continue
            if found is None:
                continue
            recorded: dict[str, set[str]] = {}
            for container in found.containers:
                for resource, ids in container.devices.items():
                    recorded.setdefault(resource, set()).update(ids)
            # every kubecell resource the kubelet recorded, not only those served: devices of a resource the
            # agent never answered for are a GPU the pod was never allocated
            checked = set(served.devices) | {r for r in recorded if r in PLUGIN_RESOURCES}
            wrong = {r for r in checked if recorded.get(r, set()) != served.devices.get(r, set())}
            if wrong:
                self.mismatches += 1
                self._event(served.pod, f"the kubelet recorded other devices for this pod than the agent served: "
                                        f"{ {r: sorted(recorded.get(r, set()))[:4] for r in wrong} }")
            return
        log.warning("PodResources never showed %s", pods.key(served.pod))

    def _refuse(self, pod: Mapping[str, Any], message: str) -> AllocationRefused:
        self._event(pod, message)
        return AllocationRefused(f"{pods.key(pod)}: {message}")

    def _event(self, pod: Mapping[str, Any], message: str) -> None:
        try:
            self.actions.event(pod, "Warning", "GPUAllocationRefused", message, counted=False)
        except ApiError as error:
            log.warning("could not report on %s: %s", pods.key(pod), error)
