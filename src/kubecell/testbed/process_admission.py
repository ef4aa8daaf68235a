"""Admission of a pod by the process kubelet, as kubecell's node agent answers the kubelet's ``Allocate``.

A pod with a container asking for ``kubecell.io/gpu`` or ``kubecell.io/gpu-milli`` is served only when it
carries an allocation record that can be trusted, is for this node, names GPUs the node's inventory lists and
an isolation mode the node offers: the agent refuses anything else rather than guess, and so does the process
kubelet (:mod:`kubecell.testbed.process_pod` then fails the pod with ``UnexpectedAdmissionError``). A pod
asking for no GPU is admitted as it is. Kept apart from the pod's life cycle because it is a pure function of
the pod and its node: the rules read in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubecell.kube import pods
from kubecell.kube.inventory import node_view
from kubecell.kube.records import AllocationRecord, RecordError, gpu_environment
from kubecell.testbed.process_env import asks_for_gpus


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer: ``refusal`` says why the pod may not run (None: it may), ``record`` is its trusted
    allocation record (None for a pod without GPUs) and ``gpu_memory`` the node's GPU sizes by UUID."""

    refusal: str | None = None
    record: AllocationRecord | None = None
    gpu_memory: dict[str, int] = field(default_factory=dict)


def admit(pod: Mapping[str, Any], node: Mapping[str, Any], containers: Iterable[Mapping[str, Any]]) -> Admission:
    """Whether the node agent would give ``pod`` (whose container specs, init containers included, are
    ``containers``) the GPUs it asks for on ``node``."""
    if not any(asks_for_gpus(c) for c in containers):
        return Admission()
    try:
        record = pods.record_of(pod)
    except RecordError as error:
        return Admission(f"its allocation record cannot be trusted: {error}")
    name = str(node["metadata"]["name"])
    if record is None:
        return Admission("it asks for kubecell.io/gpu or kubecell.io/gpu-milli but carries no allocation record "
                         "(kubecell.io/allocation): kubecell serves the pods its scheduler placed, and will not guess")
    if record.node != name:
        return Admission(f"its allocation record is for node {record.node}, not {name}")
    view = node_view(node)
    sizes = dict(zip(view.uuids, (gpu.memory_mib for gpu in view.node.gpus), strict=False)) if view.node else {}
    unknown = [gpu.uuid for gpu in record.gpus if gpu.uuid not in sizes]
    if unknown:
        return Admission(f"its allocation record names GPU(s) {', '.join(unknown)}, which node {name} does not have")
    if record.isolation not in view.isolation:
        return Admission(f"isolation {record.isolation} is not available on node {name} "
                         f"(it gives {', '.join(view.isolation)})")
    try:
        gpu_environment(record)
    except RecordError as error:
        return Admission(str(error))
    return Admission(None, record, sizes)
