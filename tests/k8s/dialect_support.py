"""Builders shared by the dialect tests (``test_dialects_*.py``): a Pod as the API server returns it, the
shape of the Request read from it, and the check that a refusal names the pod and says why."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.k8s.dialects import DemandError, pod_demand

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
