"""Helpers of the DRA tests on the session's testbed (the node agent's on the real kubelet, the scheduler's on
the bundled nodes): kubecell's DeviceClasses, ResourceSlices for some nodes (as the node agent publishes
them, from their inventory annotations), claims, templates and pods with claims."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubecell.kube import dra_names
from kubecell.kube.inventory_schema import parse_inventory
from kubecell.kube.names import ANNOTATION_ALLOCATION, ANNOTATION_INVENTORY
from kubecell.kube.records import parse_record
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra.slices import node_slices

ROOT = Path(__file__).resolve().parents[1]
DEVICE_CLASSES = ROOT / "deploy" / "dra" / "deviceclasses.yaml"
RESOURCE = "/apis/resource.k8s.io/v1"


def apply_device_classes(kube: Kube) -> list[str]:
    """Create (or replace) the shipped DeviceClasses; returns their names."""
    created = []
    for document in yaml.safe_load_all(DEVICE_CLASSES.read_text()):
        name = document["metadata"]["name"]
        created.append(name)
        try:
            kube.create(f"{RESOURCE}/deviceclasses", document)
        except ApiError as error:
            if not error.conflict:
                raise
            current = kube.get(f"{RESOURCE}/deviceclasses/{name}")
            kube.replace(f"{RESOURCE}/deviceclasses/{name}", {**document, "metadata": {
                **document["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}})
    return created


@contextlib.contextmanager
def published(kube: Kube, nodes: Sequence[str]) -> Iterator[list[dict[str, Any]]]:
    """The nodes' slices, as their agents would publish them, for the duration of the block."""
    created = []
    try:
        for name in nodes:
            node = kube.get(f"/api/v1/nodes/{name}")
            inventory = parse_inventory(node["metadata"]["annotations"][ANNOTATION_INVENTORY], node=name)
            for piece in node_slices(inventory, name, node["metadata"]["uid"], 1):
                with contextlib.suppress(ApiError):
                    kube.delete(f"{RESOURCE}/resourceslices/{piece['metadata']['name']}")
                created.append(kube.create(f"{RESOURCE}/resourceslices", piece))
        yield created
    finally:
        for piece in created:
            with contextlib.suppress(ApiError):
                kube.delete(f"{RESOURCE}/resourceslices/{piece['metadata']['name']}")


def gpu_nodes(kube: Kube, count: int, *, skip: int = 0) -> list[str]:
    """``count`` nodes of the testbed with GPUs and an inventory, by name, from the end (other tests use the
    first ones)."""
    found = [n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"]
             if ANNOTATION_INVENTORY in (n["metadata"].get("annotations") or {})
             and not (n["spec"].get("taints") or [])]
    found.sort()
    return found[len(found) - skip - count:len(found) - skip]


def request(name: str, device_class: str = dra_names.CLASS_GPU, *, count: int = 1,
            capacity: dict[str, str] | None = None, selectors: Sequence[str] = ()) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": text}} for text in selectors]
    return {"name": name, "exactly": exactly}


def make_claim(kube: Kube, namespace: str, name: str, requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": list(requests)}}}
    return kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body)


def make_template(kube: Kube, namespace: str, name: str, requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}
    return kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", body)


def claim_pod(kube: Kube, namespace: str, name: str, *, claim: str | None = None, template: str | None = None,
              annotations: dict[str, str] | None = None, scheduler: str | None = "kubecell",
              limits: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod with one claim (a direct one, or one from a template), used by its container."""
    source = {"resourceClaimName": claim} if claim is not None else {"resourceClaimTemplateName": template}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"claims": [{"name": "gpu"}], **({"limits": limits} if limits else {})}}],
        "resourceClaims": [{"name": "gpu", **source}] if (claim or template) else []}
    if not (claim or template):
        del spec["resourceClaims"]
        del spec["containers"][0]["resources"]["claims"]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}, "spec": spec}
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get_claim(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")


def claim_of(kube: Kube, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's (only) claim, direct or made from its template."""
    namespace = pod["metadata"]["namespace"]
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    source = pod["spec"]["resourceClaims"][0]
    name = source.get("resourceClaimName") or next(s["resourceClaimName"] for s in statuses)
    return get_claim(kube, namespace, name)


def recorded(pod: dict[str, Any]) -> tuple[str, list[tuple[int, str, int, int]]]:
    """(node, [(GPU index, UUID, milli, memory MiB)]) of the pod's allocation record."""
    meta = pod["metadata"]
    record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{meta['namespace']}/{meta['name']}",
                          uid=meta["uid"])
    return record.node, [(g.index, g.uuid, g.milli, g.memory_mib) for g in record.gpus]


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []


def events_of(kube: Kube, namespace: str, name: str) -> list[str]:
    items = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in items if e.get("involvedObject", {}).get("name") == name]
