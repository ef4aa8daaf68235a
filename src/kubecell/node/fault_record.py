"""The agent's faulted GPUs, kept on its Node so that a restarted agent does not publish them healthy again.

The format and the operator's clear request are :mod:`kubecell.kube.gpu_faults`. This is the agent's side:
read the record back before the first publish (per node name), follow an operator's clear request while any GPU
is faulted, and give the publisher the annotations to write with each inventory.
"""

from __future__ import annotations

import logging
from typing import Any

from kubecell.kube.gpu_faults import GpuFaultsError, describe, faults_annotation, parse_clear, parse_faults
from kubecell.kube.names import ANNOTATION_GPU_FAULT_CLEAR, ANNOTATION_GPU_FAULTS
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.xid import HealthTracker

log = logging.getLogger("kubecell.node.fault_record")


class FaultRecord:
    """A :class:`~kubecell.node.xid.HealthTracker` kept on the Node's ``kubecell.io/gpu-faults``."""

    def __init__(self, kube: Kube, health: HealthTracker) -> None:
        self.kube = kube
        self.health = health
        self.restored_for: str | None = None
        """The node whose record was read back: nothing is published for a node before that."""
        self._refused: str | None = None

    def sync(self, node: str) -> None:
        """Read the Node where the record must be read back or a faulted GPU may have been cleared. Raises the
        API's errors (the publisher backs off and publishes nothing until the record has been read)."""
        if self.restored_for == node and not self.health.faults():
            return
        try:
            metadata = self.kube.get(f"/api/v1/nodes/{node}")["metadata"]
        except ApiError as error:
            if error.status != 404:
                raise
            self.restored_for = node  # no Node, no record: the publish that follows says what is wrong
            return
        annotations = metadata.get("annotations") or {}
        if self.restored_for != node:
            self._restore(node, annotations.get(ANNOTATION_GPU_FAULTS))
            self.restored_for = node
        if ANNOTATION_GPU_FAULT_CLEAR in annotations and self.health.faults():
            self._clear(node, annotations[ANNOTATION_GPU_FAULT_CLEAR], metadata.get("resourceVersion"))

    def annotations(self) -> dict[str, str | None]:
        """What each publish writes: the record (removed when no GPU is faulted), and, with no fault left, the
        removal of a clear request (it names nothing, and must not clear a fault still to come)."""
        text = faults_annotation(self.health.faults())
        return {ANNOTATION_GPU_FAULTS: text} if text else {ANNOTATION_GPU_FAULTS: None,
                                                           ANNOTATION_GPU_FAULT_CLEAR: None}

    def _restore(self, node: str, text: object) -> None:
        if text is None:
            return
        try:
            recorded, skipped = parse_faults(text)
        except GpuFaultsError as error:
            log.warning("node %s: annotation %s %s; no fault is taken back from it", node, ANNOTATION_GPU_FAULTS,
                        error)
            return
        for problem in skipped:
            log.warning("node %s: annotation %s: an entry left out: %s", node, ANNOTATION_GPU_FAULTS, problem)
        for uuid in self.health.restore(recorded):
            log.warning("node %s GPU %s: %s recorded before this agent started; out of service until an operator "
                        "clears it (annotation %s)", node, uuid, describe(recorded[uuid].xid),
                        ANNOTATION_GPU_FAULT_CLEAR)

    def _clear(self, node: str, text: object, resource_version: Any) -> None:
        try:
            named = parse_clear(text)
        except GpuFaultsError as error:
            if text != self._refused:
                log.warning("node %s: annotation %s %s; nothing cleared", node, ANNOTATION_GPU_FAULT_CLEAR, error)
                self._refused = text if isinstance(text, str) else None
            return
        faults = self.health.faults()
        cleared = set(faults) if named is None else named & set(faults)
        remaining = {uuid: fault for uuid, fault in faults.items() if uuid not in cleared}
        patch = {"metadata": {"resourceVersion": resource_version, "annotations": {
            ANNOTATION_GPU_FAULT_CLEAR: None, ANNOTATION_GPU_FAULTS: faults_annotation(remaining)}}}
        try:
            self.kube.patch(f"/api/v1/nodes/{node}", patch)
        except ApiError as error:
            if error.status == 409:  # the Node changed since it was read: read the request again next time
                log.info("node %s: the Node changed while clearing GPU faults; read again at the next pass", node)
                return
            raise
        for uuid in cleared:
            self.health.clear(uuid)
        unknown = sorted((named or set()) - cleared)
        log.info("node %s: the operator cleared %s%s", node, ", ".join(sorted(cleared)) or "no faulted GPU",
                 f" (not faulted: {', '.join(unknown)})" if unknown else "")
