"""Builders shared by the dialect tests (``tests/kube/dialects/``, one module per dialect): a Pod as the API
server returns it, the shape of the Request read from it, the check that a refusal names the pod and says
why, and what one dialect's reader states about a pod on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.kube.dialects import DemandError, DialectOptions, PodGroups, pod_demand
from kubecell.kube.dialects.demand import PodMeta
from kubecell.kube.dialects.resources import pod_totals
from kubecell.kube.dialects.statement import Reading, Statement

HIVED = "hivedscheduler.microsoft.com/pod-scheduling-spec"
CPU = {"cpu": "2", "memory": "4Gi"}


def make_pod(gpu: dict[str, Any] | None = None, *, annotations: dict[str, str] | None = None,
             labels: dict[str, str] | None = None, namespace: str = "default", name: str = "p1",
             containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod as the API server returns it: one container with CPU/memory requests and ``gpu`` limits."""
    if containers is None:
        containers = [{"name": "main", "resources": {"requests": dict(CPU), "limits": dict(gpu or {})}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": "u-1",
                         "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"schedulerName": "kubecell", "containers": containers, **spec},
            "status": {"phase": "Pending"}}


def shape(request: Request) -> tuple[int, int, int]:
    return (request.gpu_count, request.gpu_milli, request.gpu_memory_mib)


def refused(pod: dict[str, Any], *fragments: str, **kwargs: Any) -> str:
    """The DemandError text for ``pod``; it must name the pod and contain every fragment."""
    with pytest.raises(DemandError) as caught:
        pod_demand(pod, **kwargs)
    text = str(caught.value)
    meta = pod["metadata"]
    assert text.startswith(f"pod {meta['namespace']}/{meta['name']}: "), text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    return text


def statement_of(read: Callable[[Reading], Statement], pod: dict[str, Any], *, pod_groups: PodGroups | None = None,
                 options: DialectOptions | None = None) -> Statement:
    """One dialect's reader on ``pod``, alone: what ``pod_demand`` would ask it."""
    meta = PodMeta.of(pod)
    return read(Reading(meta, pod_totals(meta), options or DialectOptions(), pod_groups or {}))


def states(read: Callable[[Reading], Statement], pod: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every aspect one dialect states about ``pod`` (those it leaves empty are left out): ``ask`` as
    (dialect, shape), ``models`` as the sets of its filters, ``groups`` as (source, name, size, minimum),
    ``vc`` and ``priority`` as their values, ``carried`` where the dialect is on the pod all the same."""
    statement = statement_of(read, pod, **kwargs)
    found: dict[str, Any] = {}
    ask = statement.ask()
    if ask is not None:
        found["ask"] = (ask.dialect, ask.shape)
    if models := statement.models():
        found["models"] = [stated.value for stated in models]
    if groups := statement.groups():
        found["groups"] = [(claim.source, claim.name, claim.size, claim.minimum) for claim in groups]
    vc = statement.vc()
    if vc is not None:
        found["vc"] = vc.value
    priority = statement.priority()
    if priority is not None:
        found["priority"] = priority.value
    if statement.carried():
        found["carried"] = True
    return found
