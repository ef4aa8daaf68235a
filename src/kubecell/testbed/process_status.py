"""The status the process kubelet writes for a pod, as the kubelet writes it: the phase, the conditions with
their transition times, the container statuses and the pod's addresses. Plain functions of the pod's
containers, so the rules read in one place apart from the processes that drive them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubecell.kube.clock import rfc3339
from kubecell.testbed.process_runtime import Container

POD_IP = "127.0.0.1"
"""Every pod's IP: the processes share the host's network (there is no network namespace)."""
HOST_IP = "127.0.0.1"


def set_condition(conditions: dict[str, dict[str, str]], kind: str, status: bool, reason: str = "",
                  message: str = "") -> None:
    """Set one condition, keeping its ``lastTransitionTime`` while its status does not change."""
    value = "True" if status else "False"
    old = conditions.get(kind)
    stamp = old["lastTransitionTime"] if old is not None and old["status"] == value else rfc3339()
    condition = {"type": kind, "status": value, "lastTransitionTime": stamp}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    conditions[kind] = condition


def pod_phase(phase: str, initialized: bool, mains: Sequence[Container]) -> str:
    """Pending until the containers start (init containers included), Running from then on; the terminal
    phases are set where the pod ends and kept."""
    if phase in ("Succeeded", "Failed"):
        return phase
    return "Running" if initialized and any(c.attempts for c in mains) else "Pending"


def refresh_conditions(conditions: dict[str, dict[str, str]], phase: str, initialized: bool,
                       inits: Sequence[Container], mains: Sequence[Container]) -> None:
    """``PodReadyToStartContainers``, ``Initialized``, ``ContainersReady`` and ``Ready``, with the reasons
    and messages the kubelet gives."""
    terminal = phase in ("Succeeded", "Failed")
    set_condition(conditions, "PodReadyToStartContainers", not terminal)
    pending = [c.name for c in inits if not (c.done and c.exit_code == 0) and not (c.kind == "sidecar" and c.attempts)]
    done = initialized or not pending
    set_condition(conditions, "Initialized", done, "" if done else "ContainersNotInitialized",
                  "" if done else f"containers with incomplete status: [{' '.join(pending)}]")
    unready = [c.name for c in (*mains, *(c for c in inits if c.kind == "sidecar")) if not c.running]
    ready = not unready and not terminal
    reason = "PodCompleted" if terminal else ("" if ready else "ContainersNotReady")
    message = "" if ready or terminal else f"containers with unready status: [{' '.join(unready)}]"
    set_condition(conditions, "ContainersReady", ready, reason, message)
    set_condition(conditions, "Ready", ready, reason, message)


def status_body(phase: str, start_time: str, conditions: dict[str, dict[str, str]], inits: Sequence[Container],
                mains: Sequence[Container], *, reason: str = "", message: str = "") -> dict[str, Any]:
    """The ``status`` of a strategic-merge patch of the pod."""
    # ``$patch: replace``: the lists are merged by IP otherwise, and an address another kubelet wrote
    # (the fake kubelet, before it let go of the node) would stay beside ours, which the API refuses.
    status: dict[str, Any] = {
        "phase": phase, "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}, {"$patch": "replace"}],
        "podIP": POD_IP, "podIPs": [{"ip": POD_IP}, {"$patch": "replace"}], "startTime": start_time,
        "conditions": list(conditions.values()), "containerStatuses": [c.status() for c in mains]}
    if inits:
        status["initContainerStatuses"] = [c.status() for c in inits]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status
