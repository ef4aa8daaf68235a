"""``kubecell profile`` end to end on real servers: pods on the testbed's API server, the node agent's per-pod
gauges scraped every second by a real Prometheus, the job history in SQLite. A job made of a controller's pods is
found (with only the shipped RBAC's rights), each pod's distribution is what its gauge said, a pod without series
is a problem of its job (not an error), a forged demand is kept as a problem, a finished job is advised on, and
the report is written."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge
from typer.testing import CliRunner

from kubecell.cli.main import app
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.kube.rest import ApiError, Kube
from kubecell.profiler.history import JobHistory, Outcome
from kubecell.profiler.jobs import created_at
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.shared_gpus import metrics_endpoint
from tests.profiler.prometheus_server import serve
from tests.scheduler.deploy_support import ensure_namespace, kubectl, service_account_kubeconfig

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "profiler" / "rbac.yaml"

GiB = 2**30
USE = {"train-0": (0.25, 1 * GiB), "train-1": (0.75, 3 * GiB)}


@pytest.fixture
def agent() -> Iterator[tuple[str, CollectorRegistry]]:
    """The node agent's two per-pod gauges on a loopback port (what ``node.overuse`` exports)."""
    registry = CollectorRegistry()
    with metrics_endpoint(registry) as target:
        yield target, registry


def pod(name: str, owner: dict[str, Any] | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": "nobody", "containers": [{
                "name": "c", "image": "registry.example/train:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def wait_for_samples(url: str, namespace: str, count: int) -> None:
    deadline = time.monotonic() + 60
    query = f'count_over_time(kubecell_node_gpu_pod_utilization_ratio{{namespace="{namespace}"}}[5m])'
    while time.monotonic() < deadline:
        result = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
        if len(result) == len(USE) and all(float(item["value"][1]) >= count for item in result):
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape {count} samples per pod within 60 s")


def finish(kube: Kube, namespace: str, name: str, start: datetime, end: datetime) -> None:
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {
        "phase": "Succeeded", "startTime": start.strftime(stamp),
        "containerStatuses": [{"name": "c", "image": "registry.example/train:1", "imageID": "", "ready": False,
                               "restartCount": 0, "state": {"terminated": {
                                   "exitCode": 0, "startedAt": start.strftime(stamp),
                                   "finishedAt": end.strftime(stamp)}}}]}})


def shipped_identity(testbed: ControlPlaneState, kube: Kube, tmp_path: Path) -> Path:
    """A kubeconfig of the profiler's ServiceAccount with deploy/profiler's RBAC applied (least privilege: the
    command must work with it, and it must be refused what the profiler never does)."""
    ensure_namespace(kube)
    kubectl(testbed, "apply", "-f", str(RBAC))
    config = service_account_kubeconfig(testbed, kube, tmp_path / "profiler.kubeconfig", "kubecell-profiler")
    denied = Kube.from_kubeconfig(config)
    try:
        for attempt in (partial(denied.get, "/api/v1/namespaces/kube-system/secrets"),
                        partial(denied.get, "/api/v1/nodes"),
                        partial(denied.create, "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "x"}})):
            with pytest.raises(ApiError) as refused:
                attempt()
            assert refused.value.status == 403
    finally:
        denied.close()
    return config


def test_collect_recommend_and_report_on_real_servers(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                      agent: tuple[str, CollectorRegistry], tmp_path: Path) -> None:
    owner_object = kube.create(f"/api/v1/namespaces/{namespace}/configmaps",
                               {"metadata": {"name": "train"}, "data": {}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "train", "uid": owner_object["metadata"]["uid"],
             "controller": True}
    accepted = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    created: list[datetime] = []
    for name in (*USE, "train-2"):
        made = created_at(kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(name, owner)))
        assert made is not None
        created.append(made)
        # a kubelet took them (their containers starting): a pass reads a job from its first pod's start
        kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                   {"status": {"phase": "Pending", "startTime": accepted}})
    kube.create(f"/api/v1/namespaces/{namespace}/pods",
                pod("forged", None, {"kubecell.io/topology": "bogus", "kubecell.io/vc": "x" * 300}))
    target, registry = agent
    util = Gauge("kubecell_node_gpu_pod_utilization_ratio", "", ["pod", "namespace", "node", "gpu"],
                 registry=registry)
    memory = Gauge("kubecell_node_gpu_pod_memory_bytes", "", ["pod", "namespace", "node", "gpu"], registry=registry)
    for name, (ratio, used) in USE.items():
        util.labels(name, namespace, "n0", f"GPU-{name}").set(ratio)
        memory.labels(name, namespace, "n0", f"GPU-{name}").set(used)
    db = f"sqlite:///{tmp_path}/history.db"
    runner = CliRunner()
    profiler = shipped_identity(testbed, kube, tmp_path)
    with serve(tmp_path / "tsdb", scrape=[target]) as url:
        wait_for_samples(url, namespace, 4)
        args = ["profile", "collect", "--prometheus", url, "--db", db, "--kubeconfig", str(profiler),
                "--namespace", namespace]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "2 job(s) saved" in result.output, "the ConfigMap's three pods, and the forged pod alone"

        with JobHistory.open(db) as history:
            job = history.get(owner["uid"])
            forged = [j for j in history.jobs(namespace=namespace) if j.owner_name == "forged"]
        assert job is not None
        assert (job.owner_kind, job.owner_name, job.pod_count, job.gpus_per_pod) == ("ConfigMap", "train", 3, 1)
        assert job.outcome == Outcome.PENDING
        for record in job.pods:
            if record.name in USE:
                ratio, used = USE[record.name]
                assert set(record.metrics["gpu_utilization"].deciles) == {ratio}
                assert set(record.metrics["gpu_memory"].deciles) == {float(used)}
        assert job.metrics["gpu_utilization"].quantile(0) == 0.25
        assert job.metrics["gpu_utilization"].quantile(10) == 0.75
        assert any("train-2" in problem and "no samples" in problem for problem in job.problems)
        (forged_job,) = forged
        assert any("cannot be read" in problem for problem in forged_job.problems)

        # The job ends: pods finished an hour after they started, as their status says, which is before they were
        # created (a test cannot make a pod an hour old): the run counts from their creation. A second pass saves
        # it once more (and the forged pod, still pending); a third finds the finished job unchanged and reads
        # nothing for it.
        end = datetime.now(UTC)
        for name in (*USE, "train-2"):
            finish(kube, namespace, name, end - timedelta(hours=1), end)
        assert "2 job(s) saved, 0 unchanged" in runner.invoke(app, args).output
        assert "1 job(s) saved, 1 unchanged" in runner.invoke(app, args).output

    with JobHistory.open(db) as history:
        job = history.get(owner["uid"])
    assert job is not None
    assert job.outcome == Outcome.SUCCEEDED
    assert job.seconds == (end.replace(microsecond=0) - min(created)).total_seconds()
    assert any("before their creation" in problem for problem in job.problems), job.problems

    advice = json.loads(runner.invoke(app, ["profile", "recommend", "--db", db, "-o", "json"]).output)
    (train,) = [item for item in advice if item["family"] == "train"]
    assert train["jobs"] == 1
    assert train["milli"] is None, "one finished job is not history enough"
    assert "3 needed" in train["reason"]

    result = runner.invoke(app, ["profile", "report", "--db", db, "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report" / "index.html").read_text()
    assert "train" in page
    assert (tmp_path / "report" / "usage.png").stat().st_size > 1000


def share(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A pod of half a GPU (what kubecell time-slices), named like the jobs of its family."""
    created = pod(name, owner)
    created["spec"]["containers"][0]["resources"]["limits"] = {"kubecell.io/gpu-milli": "500"}
    return created


def placed(kube: Kube, namespace: str, name: str) -> None:
    """The allocation record kubecell's binder writes: half of GPU-shared under time-slicing."""
    uid = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"]["uid"]
    record = AllocationRecord(allocation_id=f"{uid}-0", pod_uid=uid, attempt=0, node="n0",
                              gpus=[GpuGrant(index=0, uuid="GPU-shared", milli=500, memory_mib=0)], cpu_milli=0,
                              memory_mib=0, isolation="accounting", job=f"{namespace}/{name}", vc="v",
                              job_class="guaranteed", member=0, batch=1, scheduler="kubecell",
                              created_at=datetime.now(UTC))
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}",
               {"metadata": {"annotations": {ANNOTATION_ALLOCATION: record.to_annotation()}}})


def wait_for(url: str, selector: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = requests.get(f"{url}/api/v1/query", params={"query": f"count_over_time({selector}[5m])"},
                              timeout=5).json()["data"]["result"]
        if result and all(float(item["value"][1]) >= count for item in result):
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape {count} samples of {selector} within 60 s")


def test_two_pods_on_one_gpu_feed_the_pair_history(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                   agent: tuple[str, CollectorRegistry], tmp_path: Path) -> None:
    """bert runs alone on GPU-shared, then resnet joins it: the pass keeps both families' time alone and
    beside each other, under the keys the scheduler asks, and ``kubecell profile pairs`` shows them."""
    busy = {"bert-1-x": 0.6, "resnet-2-y": 0.5}
    for name in busy:
        owner_name = name.rsplit("-", 1)[0]
        created = kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": owner_name}})
        kube.create(f"/api/v1/namespaces/{namespace}/pods", share(name, {
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": created["metadata"]["uid"],
            "controller": True}))
        placed(kube, namespace, name)
    target, registry = agent
    util = Gauge("kubecell_node_gpu_pod_utilization_ratio", "", ["pod", "namespace", "node", "gpu"],
                 registry=registry)
    db = f"sqlite:///{tmp_path}/history.db"
    runner = CliRunner()
    profiler = shipped_identity(testbed, kube, tmp_path)
    with serve(tmp_path / "tsdb", scrape=[target]) as url:
        util.labels("bert-1-x", namespace, "n0", "GPU-shared").set(busy["bert-1-x"])
        wait_for(url, f'kubecell_node_gpu_pod_utilization_ratio{{pod="bert-1-x", namespace="{namespace}"}}', 3)
        util.labels("resnet-2-y", namespace, "n0", "GPU-shared").set(busy["resnet-2-y"])
        wait_for(url, f'kubecell_node_gpu_pod_utilization_ratio{{pod="resnet-2-y", namespace="{namespace}"}}', 3)
        result = runner.invoke(app, ["profile", "collect", "--prometheus", url, "--db", db, "--kubeconfig",
                                     str(profiler), "--namespace", namespace])
        assert result.exit_code == 0, result.output
    with JobHistory.open(db) as history:
        kept = {(row.family, row.partner): row for row in history.sharing()}
    bert, resnet = f"{namespace}/bert", f"{namespace}/resnet"
    assert set(kept) >= {(bert, ""), (bert, resnet), (resnet, bert)}, kept
    pod_of = {bert: "bert-1-x", resnet: "resnet-2-y"}
    for (family, _), row in kept.items():
        assert row.busy_seconds / row.seconds == pytest.approx(busy[pod_of[family]]), "each pod's own gauge"
    assert kept[(bert, "")].seconds >= 2
    assert kept[(bert, resnet)].seconds >= 2
    listed = json.loads(runner.invoke(app, ["profile", "pairs", "--db", db, "-o", "json"]).output)
    pairs = {(item["family"], item["partner"]): item for item in listed}
    assert set(pairs) == {(bert, resnet), (resnet, bert)}
    assert pairs[(bert, resnet)]["busyBeside"] == pytest.approx(0.6)
    assert pairs[(bert, resnet)]["speed"] is None, "seconds of sharing say nothing yet"
    assert "300 s needed" in pairs[(bert, resnet)]["why"]
    result = runner.invoke(app, ["profile", "report", "--db", db, "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Speed beside a partner" in page
    assert f"<td>{bert}</td><td>{resnet}</td>" in page
