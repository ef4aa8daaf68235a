"""Reading a job's Pods: which are its workers, at which index, in which state; and what the controller keeps
of each Pod (the watch's transform).

Only Pods the job controls count (an ``ownerReference`` with ``controller: true`` and the job's UID): a Pod
left over from a deleted job of the same name, or one made by hand with the job's labels, is never taken for
a worker.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from kubecell.core.digits import decimal_digits
from kubecell.elastic.states import Worker
from kubecell.kube.elasticjobs import (
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TEMPLATE,
)
from kubecell.kube.names import ANNOTATION_GROUP_SIZE

CRASH_LOOP_REASON = "CrashLoopBackOff"
"""The kubelet's waiting reason for a container it keeps restarting (``restartPolicy: OnFailure``)."""
CANNOT_START_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                  "CreateContainerConfigError", "CreateContainerError"})
"""The kubelet's waiting reasons for a container it cannot start until someone changes something (the image,
its pull secret, a ConfigMap or Secret it names): the worker stays bound, Pending, holding its GPUs."""
EVICTED_REASON = "Evicted"
"""``status.reason`` of a Pod the kubelet evicted under node pressure (memory, disk, PIDs)."""
BY_KUBELET = "TerminationByKubelet"
"""The reason of the ``DisruptionTarget`` condition the kubelet adds when it ends a Pod itself."""


def labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    found = (pod.get("metadata") or {}).get("labels")
    return found if isinstance(found, Mapping) else {}


def job_key(pod: Mapping[str, Any]) -> str | None:
    """``<namespace>/<job>`` of a Pod carrying the job label, else None."""
    job = labels(pod).get(LABEL_JOB)
    if not isinstance(job, str) or not job:
        return None
    return f"{(pod.get('metadata') or {}).get('namespace', 'default')}/{job}"


def controlled_by(pod: Mapping[str, Any], uid: str) -> bool:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid") == uid:
            return True
    return False


def role(pod: Mapping[str, Any]) -> str:
    return str(labels(pod).get(LABEL_ROLE, ""))


def worker_run(pod: Mapping[str, Any]) -> int | None:
    """The rendezvous run the worker joins (its label), None when unreadable (never of the current run)."""
    text = labels(pod).get(LABEL_RUN)
    if not isinstance(text, str) or not decimal_digits(text) or len(text) > 10 \
            or text != str(int(text)):
        return None
    return int(text)


def worker_template(pod: Mapping[str, Any]) -> str | None:
    """The digest of the template the worker was made from (its label); None where it has none (made before
    workers carried it): such a worker is never judged outdated."""
    text = labels(pod).get(LABEL_TEMPLATE)
    return text if isinstance(text, str) and text else None


def _condition_of(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The pod's condition of type ``kind`` (empty where it has none)."""
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(entry, Mapping) and entry.get("type") == kind:
            return entry
    return {}


def _condition(pod: Mapping[str, Any], kind: str) -> bool:
    return _condition_of(pod, kind).get("status") == "True"


def worker_state(pod: Mapping[str, Any]) -> Worker:
    """One worker Pod's state, from what its kubelet and the API server wrote."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if meta.get("deletionTimestamp"):
        return Worker.TERMINATING
    if phase == "Succeeded":
        return Worker.SUCCEEDED
    if phase == "Failed":
        # taken by the cluster (preempted, drained, its node lost): replaced, not counted; but a kubelet's
        # node-pressure eviction (status.reason Evicted) takes first the pods using most above their requests, so
        # a worker whose script leaks memory is counted, or it would be evicted and replaced forever
        taken = _condition_of(pod, "DisruptionTarget")
        pressure = status.get("reason") == EVICTED_REASON and taken.get("reason") == BY_KUBELET
        return Worker.DISRUPTED if taken.get("status") == "True" and not pressure else Worker.FAILED
    # an init container that crash-loops keeps the Pod Pending on its node for ever (its GPUs held); once the Pod
    # runs, only a native sidecar restarts there, and its readiness speaks for it
    looping = [*(status.get("containerStatuses") or []),
               *((status.get("initContainerStatuses") or []) if phase == "Pending" else [])]
    if CRASH_LOOP_REASON in waiting_reasons(looping):
        return Worker.CRASH_LOOP
    if not (pod.get("spec") or {}).get("nodeName"):
        return Worker.UNSCHEDULED
    if phase == "Running":
        return Worker.READY if _condition(pod, "Ready") else Worker.RUNNING
    return Worker.SCHEDULED


def cannot_start(pod: Mapping[str, Any]) -> str | None:
    """Why a worker bound to a node cannot start (``CANNOT_START_REASONS``: its container's, or while Pending its
    init container's, waiting reason), or None."""
    status = pod.get("status") or {}
    if not (pod.get("spec") or {}).get("nodeName") or (status.get("phase") or "Pending") != "Pending":
        return None
    return next((reason for reason in waiting_reasons([*(status.get("initContainerStatuses") or []),
                                                       *(status.get("containerStatuses") or [])])
                 if reason in CANNOT_START_REASONS), None)


def waiting_reasons(containers: Iterable[Any]) -> list[str]:
    """The ``state.waiting.reason`` of each container status that has one, in order (a kubelet's status, read
    without trusting its shape)."""
    reasons = []
    for container in containers:
        reason = (((container if isinstance(container, Mapping) else {}).get("state") or {}).get("waiting")
                  or {}).get("reason")
        if reason:
            reasons.append(str(reason))
    return reasons


def cannot_start_message(pods_by_index: Mapping[int, Mapping[str, Any]], workers: Mapping[int, Worker]) -> str | None:
    """What to say of the workers bound to a node that the kubelet cannot start (``cannot_start``: an image it
    cannot pull, a Secret that is not there), or None. They wait, as a Deployment's pods do, holding their GPUs:
    no restart starts them. Before, the job said only "waiting for the scheduler"."""
    stuck = sorted((str(pod["metadata"]["name"]), reason) for index, pod in pods_by_index.items()
                   if workers.get(index) is Worker.SCHEDULED and (reason := cannot_start(pod)))
    if not stuck:
        return None
    shown = ", ".join(f"{name} ({reason})" for name, reason in stuck[:5]) + \
        (f" and {len(stuck) - 5} more" if len(stuck) > 5 else "")
    return f"bound but not started by the kubelet: {shown}; each holds its GPUs until its pod or the job is fixed"


def held_message(held: list[tuple[str, tuple[str, ...]]]) -> str:
    """What to say of the job's Pods (name, finalizers) that only their finalizers keep (``held_by``)."""
    names = sorted(name for name, _ in held)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    finalizers = ", ".join(sorted({f for _, found in held for f in found})[:MAX_FINALIZERS_TOLD])
    return (f"pod{'s' if len(names) > 1 else ''} {shown} deleted at once but kept by finalizers ({finalizers}): "
            "whoever set them must remove them before the job can replace them")


def ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def overdue(pod: Mapping[str, Any], now: float, margin: float) -> bool:
    """Whether ``pod`` is still Terminating ``margin`` seconds after its grace period ended (its
    ``deletionTimestamp``): its kubelet is not there to end it (a node lost or partitioned), and it would hold its
    name, and the job's place in it, for ever."""
    deleting = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return deleting is not None and now - deleting > margin


MAX_FINALIZERS_KEPT = 8
"""Finalizers a trimmed Pod keeps (to name them in an Event; their number is the tenant's)."""
MAX_FINALIZERS_TOLD = 8
"""Finalizers named in one PodHeldByFinalizers Warning."""


def held_by(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The finalizers of a Pod already deleted at once (``deletionGracePeriodSeconds`` 0), which alone keep it:
    another delete cannot end it, only whoever set them. None for any other Pod."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionGracePeriodSeconds") != 0 or not meta.get("deletionTimestamp"):
        return None
    found = meta.get("finalizers")
    if not isinstance(found, list) or not found:
        return None  # going: the API server removes a Pod deleted at once that nothing holds
    return tuple(str(f)[:316] for f in found[:MAX_FINALIZERS_KEPT])


def group_size(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_GROUP_SIZE) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


_META_KEPT = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
              "deletionGracePeriodSeconds", "labels", "ownerReferences")


def trimmed(pod: dict[str, Any]) -> dict[str, Any]:
    """What the controller keeps of a Pod: who owns it, its index, where it runs, its phase, conditions and
    container states. Commands, environments and managed fields are most of a worker's size."""
    meta = pod.get("metadata") or {}
    kept: dict[str, Any] = {key: meta[key] for key in _META_KEPT if key in meta}
    size = group_size(pod)
    if size is not None:
        kept["annotations"] = {ANNOTATION_GROUP_SIZE: size}
    finalizers = meta.get("finalizers")
    if isinstance(finalizers, list) and finalizers:
        kept["finalizers"] = [str(f)[:316] for f in finalizers[:MAX_FINALIZERS_KEPT]]
    status = pod.get("status") or {}
    conditions = [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason")}
                  for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    return {"metadata": kept, "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
            "status": {"phase": status.get("phase"), "reason": status.get("reason"), "conditions": conditions,
                       "containerStatuses": _container_states(status.get("containerStatuses")),
                       "initContainerStatuses": _container_states(status.get("initContainerStatuses"))}}


def _container_states(listed: Any) -> list[dict[str, Any]]:
    """Of each container's status, what ``worker_state`` reads: its name, restarts, state and reason."""
    containers = []
    for container in listed if isinstance(listed, list) else []:
        if not isinstance(container, Mapping):  # (the API server's schema makes each an object; read defensively)
            continue
        state = container.get("state")
        state = state if isinstance(state, Mapping) else {}
        containers.append({"name": container.get("name"), "restartCount": container.get("restartCount", 0),
                           "state": {key: {"reason": value.get("reason"), "exitCode": value.get("exitCode")}
                                     if isinstance(value, Mapping) else {"reason": None, "exitCode": None}
                                     for key, value in state.items()}})
    return containers


def parse_time(text: Any) -> float | None:
    """An API time (RFC 3339) in epoch seconds; None for anything else."""
    if not isinstance(text, str) or not 0 < len(text) <= 64:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
