"""A process-kubelet pod's Kubernetes credentials: its ServiceAccount's token, bound to the pod.

A real kubelet projects a token the TokenRequest API issued for the pod's ServiceAccount, bound to the pod
(``boundObjectRef``), into ``/var/run/secrets/kubernetes.io/serviceaccount``; the API server then knows the
requester's pod (the user's extra ``authentication.kubernetes.io/pod-name``), which admission policies such as
``deploy/elastic/worker-admission.yaml`` rely on. A host process cannot have that fixed path per pod, so the
process kubelet asks for the same token and hands it over the way a program outside a cluster finds its
credentials: a kubeconfig in the pod's directory named by ``KUBECONFIG`` (the ``kubernetes`` client and
``kubecell.kube.rest.Kube`` fall back to it when the in-cluster token file is absent).

What differs from a kubelet, deliberately: a pod that names no ServiceAccount, or one that does not exist, runs
without credentials (the testbed's API server runs without the ServiceAccount admission plugin, which would name
``default``, and without a controller-manager, which would create it; a kubelet would fail to mount the
volume); and the token (an hour) is not refreshed, as testbed pods run for minutes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.pki import write_kubeconfig

log = logging.getLogger("kubecell.testbed.process_kubelet")

TOKEN_SECONDS = 3600
"""The kubelet's own default lifetime for a projected token."""


def service_account_credentials(kube: Kube, pod: Mapping[str, Any], directory: Path, *, api_url: str,
                                ca_cert: Path) -> dict[str, str]:
    """The environment that gives the pod's processes its ServiceAccount's identity (``KUBECONFIG``), after
    writing that kubeconfig under ``directory``; empty when the pod opts out
    (``automountServiceAccountToken: false``), names no account, or its account does not exist. Other API
    errors raise: the container waits and is retried, as a kubelet retries a volume it cannot mount."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    account = str(spec.get("serviceAccountName") or "")
    if spec.get("automountServiceAccountToken") is False or not account:
        return {}
    namespace = str(meta.get("namespace", "default"))
    try:
        token = service_account_token(kube, namespace, account, bound_pod=pod)
    except ApiError as error:
        if error.not_found:
            log.info("pod %s/%s: ServiceAccount %r not found; its processes run without credentials", namespace,
                     meta["name"], account)
            return {}
        raise
    path = directory / "serviceaccount" / "kubeconfig"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_kubeconfig(path, server=api_url, ca_cert=ca_cert, token=token,
                     user=f"system:serviceaccount:{namespace}:{account}")
    return {"KUBECONFIG": str(path)}


def service_account_token(kube: Kube, namespace: str, account: str, *, bound_pod: Mapping[str, Any] | None = None,
                          seconds: int = TOKEN_SECONDS) -> str:
    """A token the TokenRequest API issues for the ServiceAccount; with ``bound_pod`` (a Pod object), bound to
    that Pod, as the one a kubelet mounts is (raises ``ApiError``)."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}
    answer = kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    return str(answer["status"]["token"])
