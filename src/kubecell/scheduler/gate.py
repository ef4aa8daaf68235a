"""One GPU pod at a time per node where kubecell's device plugin serves: binds wait for the agent's ack.

The kubelet's ``Allocate`` call names device IDs, never the pod it serves. kubecell's node agent does not
guess (gpushare matched on amounts and ages, and gave the wrong GPU to pods that asked for the same): it
serves the one pod bound to its node whose allocation record it has not acknowledged yet. That is only
unambiguous if the scheduler never has two such pods on one node at once, so on nodes whose inventory
says ``devicePlugin: true`` a Binding for a pod that asks for a device-plugin resource waits until the
pod bound before it there carries the agent's acknowledgement (``kubecell.io/allocated`` = its allocation
id), has ended, or is gone. Bindings elsewhere, and pods that ask for no device-plugin resource, are never
held. The engine already counts a held pod as placed (its GPUs are taken), so nothing else can get them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from kubecell.kube import pods
from kubecell.kube.names import ANNOTATION_ACK, RESOURCE_GPU, RESOURCE_GPU_MILLI
from kubecell.kube.records import AllocationRecord, RecordError
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.tracking import Tracking

PLUGIN_RESOURCES = frozenset((RESOURCE_GPU, RESOURCE_GPU_MILLI))
"""What kubecell's device plugin serves (each ask for them is an ``Allocate`` call on the node)."""

BindItem = tuple[str, str, dict[str, Any], str, AllocationRecord | None]
"""(job name, pod uid, pod, node, the record its Binding carries or None)."""


def acknowledged(pod: Mapping[str, Any]) -> bool:
    """Whether the node agent acknowledged the pod's current allocation record."""
    ack = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ACK)
    if not ack:
        return False
    try:
        record = pods.record_of(pod)
    except RecordError:
        return False
    return record is not None and record.allocation_id == ack


class NodeGate:
    """Which Bindings may go out now; the rest wait in ``Tracking.deferred`` for their node."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def admit(self, state: Tracking, items: list[BindItem]) -> list[BindItem]:
        """The items that may be sent now (in order); the others are queued for their node."""
        ready = []
        for item in items:
            _, uid, pod, node, _ = item
            if not self._serial(state, node, pod):
                ready.append(item)
            elif not state.deferred.get(node) and self._free(state, node):
                state.inflight[node] = uid
                ready.append(item)
            else:
                state.deferred.setdefault(node, deque()).append(item)
        return ready

    def release(self, state: Tracking) -> list[BindItem]:
        """The next waiting Binding of every node whose previous pod the agent acknowledged (or that
        ended); they are marked in flight, and the caller sends them."""
        ready = []
        for node, queue in list(state.deferred.items()):
            while queue and queue[0][1] not in self.mirror.pods:  # deleted while waiting
                queue.popleft()
            if queue and self._free(state, node):
                item = queue.popleft()
                state.inflight[node] = item[1]
                ready.append(item)
            if not queue:
                del state.deferred[node]
        return ready

    def holding(self, state: Tracking, node: str, pod: Mapping[str, Any]) -> str | None:
        """Whether a Binding of ``pod`` to ``node`` would have to wait, and for which pod (namespace/name);
        None when it may go now. Changes nothing (the extender answers kube-scheduler with it)."""
        if not self._serial(state, node, pod) or (not state.deferred.get(node) and self._free(state, node)):
            return None
        return self.waiting_on(state, node) or "an earlier pod"

    def waiting_on(self, state: Tracking, node: str) -> str | None:
        """The pod (namespace/name) a node's waiting Bindings wait for, if any."""
        uid = state.inflight.get(node)
        pod = self.mirror.pods.get(uid) if uid else None
        return pods.key(pod) if pod is not None else None

    def forget(self, state: Tracking, uids: set[str]) -> None:
        """The pods' Bindings will not happen (refused, or their job went back to the queue): they hold no
        node and wait in no queue any more."""
        for node in [node for node, uid in state.inflight.items() if uid in uids]:
            del state.inflight[node]
        for node, queue in list(state.deferred.items()):
            kept = [item for item in queue if item[1] not in uids]
            if kept:
                state.deferred[node] = deque(kept)
            else:
                del state.deferred[node]

    def note_bound(self, state: Tracking, pod: Mapping[str, Any]) -> None:
        """A pod found bound and not acknowledged at a rebuild holds its node (the agent may be serving it)."""
        node = pods.node_of(pod)
        if self._serial(state, node, pod) and not acknowledged(pod) and not pods.is_done(pod):
            state.inflight[node] = pods.uid(pod)

    def _serial(self, state: Tracking, node: str, pod: Mapping[str, Any]) -> bool:
        view = state.views.get(node)
        return view is not None and view.serial_binds and pods.asks_for_any(pod, PLUGIN_RESOURCES)

    def _free(self, state: Tracking, node: str) -> bool:
        uid = state.inflight.get(node)
        if uid is None:
            return True
        pod = self.mirror.pods.get(uid)
        if pod is None or pods.is_done(pod) or acknowledged(pod):
            del state.inflight[node]
            return True
        return False
