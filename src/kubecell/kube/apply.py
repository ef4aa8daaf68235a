"""Create-or-update of manifest objects, for the kinds kubecell ships in ``deploy/``.

``kubectl apply`` is not available to a Python test or the testbed command, and a server-side apply
needs field managers the shipped manifests do not need; this creates each object and, if it exists,
replaces it with the stored resourceVersion. Unknown kinds are refused by name, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kubecell.core.errors import InvalidInputError
from kubecell.kube.rest import ApiError, Kube

COLLECTIONS: Mapping[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("/api/v1/namespaces", False),
    ("v1", "ServiceAccount"): ("/api/v1/namespaces/{ns}/serviceaccounts", True),
    ("v1", "ConfigMap"): ("/api/v1/namespaces/{ns}/configmaps", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("/apis/rbac.authorization.k8s.io/v1/clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", True),
    ("apps/v1", "Deployment"): ("/apis/apps/v1/namespaces/{ns}/deployments", True),
}


def collection_of(obj: Mapping[str, Any]) -> str:
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    if key not in COLLECTIONS:
        raise InvalidInputError(f"cannot apply {key[1]} ({key[0]})", field="kind",
                                accepted=", ".join(kind for _, kind in COLLECTIONS))
    path, namespaced = COLLECTIONS[key]
    return path.format(ns=obj["metadata"].get("namespace", "default")) if namespaced else path


def apply(kube: Kube, objects: Iterable[Mapping[str, Any]], *, kinds: Iterable[str] | None = None) -> int:
    """Create or replace ``objects`` (only those of ``kinds`` when given); returns how many were written."""
    wanted = set(kinds) if kinds is not None else None
    written = 0
    for obj in objects:
        if wanted is not None and obj.get("kind") not in wanted:
            continue
        path = collection_of(obj)
        try:
            kube.create(path, obj)
        except ApiError as error:
            if not error.conflict:
                raise
            current = kube.get(f"{path}/{obj['metadata']['name']}")
            kube.replace(f"{path}/{obj['metadata']['name']}",
                         {**obj, "metadata": {**obj["metadata"],
                                              "resourceVersion": current["metadata"]["resourceVersion"]}})
        written += 1
    return written


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
