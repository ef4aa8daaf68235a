"""``kubecell inspect`` against the real testbed: two halves on one GPU, a pod that cannot fit waiting with
its reason, a row per node by default, per GPU with ``-g``, per pod with ``-d``; the tenants from
VirtualCluster objects when any exist, a missing CRD tolerated; API errors are one line and exit status 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kubecell.cli.inspect import read_cluster
from kubecell.cli.main import app
from kubecell.kube import virtualclusters
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_scheduler import bound, get_pod, gpus_of, make_pod
from tests.support import wait_for


def waiting_reason(kube: Kube, namespace: str, name: str) -> str | None:
    return next((c.get("message") for c in get_pod(kube, namespace, name)["status"].get("conditions") or []
                 if c["type"] == "PodScheduled" and c["status"] == "False"), None)


def inspect(*args: str) -> Any:
    return CliRunner().invoke(app, ["inspect", *args])


def test_inspect_shows_the_shared_gpu_the_waiting_pod_and_every_pod(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_pod(kube, namespace, "half-0", {"kubecell.io/gpu-milli": "500"})
    make_pod(kube, namespace, "half-1", {"kubecell.io/gpu-milli": "500"})
    make_pod(kube, namespace, "too-big", {"kubecell.io/gpu": "64"})  # valid, but no node has 64 GPUs
    placed = wait_for("both halves to be bound", lambda: bound(kube, namespace, "half-0", "half-1"))
    slots = {slot[:2] for pod in placed for slot in gpus_of(pod)}
    assert len(slots) == 1, f"two halves should share one GPU, got {slots}"
    ((node, index),) = slots
    reason = wait_for("the waiting reason", lambda: waiting_reason(kube, namespace, "too-big"))

    result = inspect("--kubeconfig", testbed.admin_kubeconfig, "-o", "json", "-d")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (gpu,) = [g for n in data["nodes"] if n["name"] == node for g in n["gpus"] if g["index"] == index]
    assert gpu["milliAllocated"] == 1000
    assert gpu["milliTotal"] == 1000
    assert sorted(p for p in gpu["pods"] if p.startswith(namespace)) == [f"{namespace}/half-0", f"{namespace}/half-1"]
    assert gpu["model"]
    assert gpu["uuid"].startswith("GPU-")
    assert gpu["healthy"] is True
    (pending,) = [p for p in data["pending"] if p["pod"] == f"{namespace}/too-big"]
    assert (pending["ask"], pending["reason"], pending["scheduler"]) == ("64 GPUs", reason, "kubecell")
    rows = {p["pod"]: p for p in data["pods"] if p["pod"].startswith(f"{namespace}/")}
    assert sorted(rows) == [f"{namespace}/half-0", f"{namespace}/half-1"]
    assert all((r["node"], r["gpus"], r["milli"], r["isolation"], r["vc"], r["error"])
               == (node, [index], 500, "accounting", "default", "") for r in rows.values())
    (default,) = [vc for vc in data["virtualClusters"] if vc["name"] == "default"]
    assert default["inUseGpus"] >= 1.0
    assert default["guaranteedGpus"] > 0

    only = inspect("--kubeconfig", testbed.admin_kubeconfig, "-o", "yaml", "--node", node)
    assert only.exit_code == 0, only.output
    assert [n["name"] for n in yaml.safe_load(only.stdout)["nodes"]] == [node]

    table = inspect("--kubeconfig", testbed.admin_kubeconfig, "-d")
    assert table.exit_code == 0, table.output
    for text in ("GPUs per node", f"{namespace}/half-0", f"{namespace}/too-big", "Virtual clusters",
                 "Tenants in force"):
        assert text in table.stdout
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(f"│ {node} ")]
    assert "█" in row                                 # the shared GPU, full
    per_gpu = inspect("--kubeconfig", testbed.admin_kubeconfig, "-g", "--node", node)
    assert per_gpu.exit_code == 0, per_gpu.output
    assert "1000/1000" in per_gpu.stdout
    assert f"{namespace}/half-0, {namespace}/half-1" in per_gpu.stdout


class ListsOnly:
    """A Kube that lists no node and no pod and answers ``status`` for the tenant objects."""

    def __init__(self, status: int) -> None:
        self.status = status

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        if path in ("/api/v1/nodes", "/api/v1/pods"):
            return {"items": [], "metadata": {}}
        raise ApiError(self.status, "NotFound" if self.status == 404 else "Forbidden", f"{path} refused", path=path)


@pytest.mark.parametrize(("status", "warned"), [(404, False), (403, True)])
def test_without_the_virtualcluster_crd_or_the_right_to_list_it_inspect_goes_on(status: int, warned: bool) -> None:
    report = read_cluster(ListsOnly(status), scheduler="kubecell")  # type: ignore[arg-type]
    assert report.tenants.kind == "none"
    assert any("VirtualClusters not listed" in w for w in report.warnings) is warned


def test_the_tenants_are_the_virtualclusters_when_any_exist(testbed: ControlPlaneState, kube: Kube,
                                                            crd: None) -> None:
    kube.create(virtualclusters.PATH, {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
                                       "metadata": {"name": "vision"}, "spec": {"gpus": 16}})
    result = inspect("--kubeconfig", testbed.admin_kubeconfig, "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tenantSource"] == {"kind": "virtualclusters", "summary": "1 VirtualCluster (accepted)"}
    assert [(vc["name"], vc["guaranteedGpus"]) for vc in data["virtualClusters"] if vc["name"] == "vision"] == [
        ("vision", 16)]
    table = inspect("--kubeconfig", testbed.admin_kubeconfig)
    assert "Tenants in force: 1 VirtualCluster (accepted)" in table.stdout


@pytest.mark.parametrize(("change", "message"), [
    ({"server": "https://127.0.0.1:1"}, "Unavailable"),
    ({"token": "not-a-token"}, "401"),
])
def test_api_errors_are_one_line_and_exit_status_1(testbed: ControlPlaneState, tmp_path: Path,
                                                  change: dict[str, str], message: str) -> None:
    config = yaml.safe_load(Path(testbed.admin_kubeconfig).read_text())
    if "server" in change:
        config["clusters"][0]["cluster"]["server"] = change["server"]
    else:
        config["users"][0]["user"] = {"token": change["token"]}
    broken = tmp_path / "kubeconfig"
    broken.write_text(yaml.safe_dump(config))
    result = inspect("--kubeconfig", str(broken))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: cannot read the cluster"), lines
    assert message in lines[0], lines


def test_a_missing_kubeconfig_is_one_line_and_exit_status_1(tmp_path: Path) -> None:
    result = inspect("--kubeconfig", str(tmp_path / "absent"))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot read kubeconfig")
    assert len(result.stderr.strip().splitlines()) == 1
