"""The shipped manifests on the testbed: kubectl of the testbed's release, the kustomize base rendered,
the VirtualCluster CRD installed, a client authenticated by a real ServiceAccount token, and the admission
policy of deploy/admission (which deploy/base installs) taken off again."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from kubecell.kube import virtualclusters
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.pki import write_kubeconfig
from kubecell.testbed.process_credentials import service_account_token
from tests.support import wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"
CRD = BASE / "crd-virtualclusters.yaml"
ADMISSION = DEPLOY / "admission"
POLICY = "kubecell-allocation-records"
NAMESPACE = "kubecell-system"
SERVICE_ACCOUNT = "kubecell-scheduler"


def kubectl(testbed: ControlPlaneState, *args: str, check: bool = True, timeout: float = 120.0,
            kubeconfig: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """The testbed's own kubectl (same release as the API server) as the admin, or as ``kubeconfig``."""
    command = [str(ensure_binaries().kubectl), f"--kubeconfig={kubeconfig or testbed.admin_kubeconfig}", *args]
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
    wait_for("the VirtualClusters to be gone", lambda: _cleared(kube))


def _cleared(kube: Kube) -> bool:
    """Delete the VirtualClusters and say whether none is left. A path that still 404s (just after the CRD is
    Established the API server may serve it a moment later) holds none; an API server that answers 429 or not
    at all (flow control on a loaded CI machine) is asked again."""
    try:
        kube.delete(virtualclusters.PATH)
        return not kube.get(virtualclusters.PATH)["items"]
    except ApiError as error:
        if error.not_found:
            return True
        if error.unavailable:
            return False
        raise


def ensure_namespace(kube: Kube, name: str = NAMESPACE) -> None:
    """The namespace exists (created unless an earlier test did)."""
    try:
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiError as error:
        if not error.conflict:
            raise


def service_account_kubeconfig(testbed: ControlPlaneState, kube: Kube, path: Path,
                               account: str = SERVICE_ACCOUNT, *, namespace: str = NAMESPACE,
                               bound_pod: dict[str, Any] | None = None) -> Path:
    """A kubeconfig holding a token the TokenRequest API issued for the ServiceAccount: the identity a
    pod of the Deployment would have (user system:serviceaccount:..., groups system:serviceaccounts...).
    With ``bound_pod`` (a Pod object), the token is bound to that Pod, as the one the kubelet mounts is: the
    API server then names the pod in the user's extra ``authentication.kubernetes.io/pod-name``."""
    token = service_account_token(kube, namespace, account, bound_pod=bound_pod)
    write_kubeconfig(path, server=testbed.api_url, ca_cert=Path(testbed.directory) / "pki" / "ca.crt",
                     token=token, user=f"system:serviceaccount:{namespace}:{account}")
    return path


def policy_in_effect(kube: Kube) -> bool:
    """Whether the API server enforces the policy of deploy/admission now: a server dry run (nothing is
    created either way) of the admin, whom it exempts no more than anyone, creating a pod with a record."""
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "kubecell-policy-probe", "annotations": {ANNOTATION_ALLOCATION: "{}"}},
             "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    try:
        kube.create("/api/v1/namespaces/default/pods", probe, dryRun="All")
    except ApiError as error:
        if error.status == 403 and POLICY in error.api_message:
            return True
        raise
    return False


def remove_admission_policy(testbed: ControlPlaneState, kube: Kube) -> None:
    """Take the policy off (deploy/base installs it) and wait until the API server stops enforcing it: other
    tests write records as the admin on purpose, to test the scheduler's own defences."""
    kubectl(testbed, "delete", "-k", str(ADMISSION), "--ignore-not-found")
    wait_for("the API server to stop enforcing the admission policy", lambda: not policy_in_effect(kube), 60)
