"""The shipped manifests on the testbed: kubectl of the testbed's release, the kustomize base rendered,
the VirtualCluster CRD installed, and a client authenticated by a real ServiceAccount token."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from kubecell.k8s import virtualclusters
from kubecell.k8s.rest import ApiError, Kube
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.pki import write_kubeconfig
from tests.support import wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"
CRD = BASE / "crd-virtualclusters.yaml"
NAMESPACE = "kubecell-system"
SERVICE_ACCOUNT = "kubecell-scheduler"


def kubectl(testbed: ControlPlaneState, *args: str, check: bool = True,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """The testbed's own kubectl (same release as the API server) as the admin."""
    command = [str(ensure_binaries().kubectl), f"--kubeconfig={testbed.admin_kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command[1:])} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def rendered(testbed: ControlPlaneState, directory: Path = BASE) -> list[dict[str, Any]]:
    """The objects a kustomization stands for (``kubectl kustomize``)."""
    return [doc for doc in yaml.safe_load_all(kubectl(testbed, "kustomize", str(directory)).stdout) if doc]


def install_crd(testbed: ControlPlaneState) -> None:
    """The VirtualCluster CRD applied for real and served (Established)."""
    kubectl(testbed, "apply", "-f", str(CRD))
    kubectl(testbed, "wait", "--for=condition=Established", "--timeout=60s",
            "customresourcedefinition/virtualclusters.kubecell.io")


def clear_virtualclusters(kube: Kube) -> None:
    """Delete every VirtualCluster (cluster-scoped: other tests must find the default tenants again)."""
    try:
        kube.delete(virtualclusters.PATH)
    except ApiError as error:
        if not error.not_found:
            raise
    wait_for("the VirtualClusters to be gone", lambda: not kube.get(virtualclusters.PATH)["items"])


def service_account_kubeconfig(testbed: ControlPlaneState, kube: Kube, path: Path,
                               account: str = SERVICE_ACCOUNT) -> Path:
    """A kubeconfig holding a token the TokenRequest API issued for the ServiceAccount: the identity a
    pod of the Deployment would have (user system:serviceaccount:..., groups system:serviceaccounts...)."""
    answer = kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": 3600}})
    write_kubeconfig(path, server=testbed.api_url, ca_cert=Path(testbed.directory) / "pki" / "ca.crt",
                     token=answer["status"]["token"], user=f"system:serviceaccount:{NAMESPACE}:{account}")
    return path
