"""Reading Pod objects: who schedules them, where they are in their life, and their record."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, parse_record

TERMINAL_PHASES = ("Succeeded", "Failed")


def key(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def uid(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_done(pod: Mapping[str, Any]) -> bool:
    """Terminal or being deleted: nothing new will be decided for it (a pending pod being deleted is
    withdrawn). Whether its resources are free is another question: see ``holds``."""
    return ended(pod) or terminating(pod)


def ended(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: its containers stopped for good, so it holds nothing any more."""
    return phase(pod) in TERMINAL_PHASES


def terminating(pod: Mapping[str, Any]) -> bool:
    """Being deleted (``metadata.deletionTimestamp``): its containers may still run for their grace period."""
    return bool(pod["metadata"].get("deletionTimestamp"))


def holds(pod: Mapping[str, Any], *, release_terminating: bool = False) -> bool:
    """Whether a bound pod still holds its node's resources: until it has ended or is gone, as kube-scheduler
    counts a terminating pod until its object is deleted (work that checkpoints on SIGTERM still runs on its
    GPUs). ``release_terminating`` frees them at the deletion instead (the scheduler's documented option)."""
    if not node_of(pod) or ended(pod):
        return False
    return not (release_terminating and terminating(pod))


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still has scheduling gates (``spec.schedulingGates``): like kube-scheduler's
    PreEnqueue, such a pod is not considered, holds nothing and is decided once its last gate is removed."""
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def ours(pod: Mapping[str, Any], names: str | frozenset[str]) -> bool:
    """Whether the pod's ``schedulerName`` is ``names`` (or one of them)."""
    name = (pod.get("spec") or {}).get("schedulerName")
    return name == names if isinstance(names, str) else name in names


def asks_for_any(pod: Mapping[str, Any], resources: frozenset[str]) -> bool:
    """Whether a container or init container requests or limits one of ``resources``: the pods
    kube-scheduler sends to an extender that manages them (its ``IsInterested``)."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        found = (container.get("resources") or {})
        if any(name in resources for part in ("requests", "limits") for name in (found.get(part) or {})):
            return True
    return False


def counted_by_kubernetes(pod: Mapping[str, Any]) -> bool:
    """Whether Kubernetes itself counts what the pod asks for: a container asking an extended resource
    (``kubecell.io/gpu-milli``: the kubelet hands the device plugin exactly as many slots as the limit, and the
    node agent refuses more slots than the record grants, so a smaller grant would fail the pod's admission; and
    the kubelet's count would keep the GPU fuller than the engine's), or a ResourceClaim (its allocation records
    the capacity the claim asked). Only a share asked by labels or annotations (KubeShare's) is counted by
    kubecell alone."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        if any("/" in str(name) for part in ("requests", "limits") for name in (resources.get(part) or {})):
            return True
    return False


def created(pod: Mapping[str, Any]) -> float:
    """The pod's creation time in epoch seconds: its age in the queue survives a scheduler restart."""
    stamp = pod["metadata"].get("creationTimestamp")
    if not stamp:
        return 0.0
    when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return when.timestamp()


def record_of(pod: Mapping[str, Any]) -> AllocationRecord | None:
    """The pod's allocation record, None when it has none; RecordError when it has a bad one."""
    text = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ALLOCATION)
    if not text:
        return None
    return parse_record(text, pod=key(pod), uid=uid(pod))


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_META_KEPT = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "labels")
_SPEC_KEPT = ("schedulerName", "nodeName", "priority", "nodeSelector", "tolerations", "overhead", "resources",
              "schedulingGates", "resourceClaims")


def trimmed(pod: dict[str, Any]) -> dict[str, Any]:
    """What the scheduler reads of a pod, and nothing else: who schedules it, where it runs, what it asks
    for (containers' resources, annotations and labels of every dialect, node constraints), its controller
    owner reference (an ElasticJob's workers are resized through it), its DRA ResourceClaims (and the names of
    those made from templates), its phase.

    Managed fields, container commands, environments, images, volumes and status details are most of a
    pod's size; a scheduler mirroring 50,000 pods keeps only this, as kube-scheduler's informers drop
    managed fields."""
    meta = pod.get("metadata") or {}
    kept_meta = {key: meta[key] for key in _META_KEPT if key in meta}
    annotations = meta.get("annotations")
    if annotations:
        kept_meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    owners = meta.get("ownerReferences")
    if isinstance(owners, list):  # the controller alone: an ElasticJob's workers are resized through it
        controller = [owner for owner in owners if isinstance(owner, dict) and owner.get("controller") is True]
        if controller:
            kept_meta["ownerReferences"] = controller[:1]
    spec = pod.get("spec") or {}
    kept_spec = {key: spec[key] for key in _SPEC_KEPT if key in spec}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        kept_spec["affinity"] = {"nodeAffinity": node_affinity}
    kept_spec["containers"] = [_container(c) for c in spec.get("containers") or []]
    if spec.get("initContainers"):
        kept_spec["initContainers"] = [_container(c) for c in spec["initContainers"]]
    status = pod.get("status") or {}
    kept_status = {key: status[key] for key in ("phase", "resourceClaimStatuses") if key in status}
    return {"metadata": kept_meta, "spec": kept_spec, "status": kept_status}


def _container(container: Mapping[str, Any]) -> dict[str, Any]:
    return {key: container[key] for key in ("name", "resources", "restartPolicy") if key in container}
