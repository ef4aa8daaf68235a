"""Extender mode end to end: the stock kube-scheduler (built by the testbed, configured with the sample
of ``deploy/extender``) places kubecell's pods by calling ``kubecell extender``; the allocations must be
the ones ``kubecell scheduler`` makes, and a gang is never half bound."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubecell.cli.main import example_paths
from kubecell.cli.serving import serve
from kubecell.kube import pods
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import Kube
from kubecell.scheduler.extender.config import render
from kubecell.scheduler.extender.http import routes
from kubecell.scheduler.extender.verbs import Extender
from kubecell.scheduler.observe.web.app import build_app
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.testbed import testbed as testbed_driver
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.control_plane import ControlPlane, ControlPlaneState
from kubecell.testbed.replay import own_scheduler, plan, replay
from tests.scheduler.test_node_gate import acknowledge, get, pod_on, served_node
from tests.support import wait_for


@contextlib.contextmanager
def extender_mode(state: ControlPlaneState, options: SchedulerOptions, tmp: Path, *,
                  node_cache: bool = True) -> Iterator[Scheduler]:
    """kubecell as an extender (its HTTP server on loopback) and kube-scheduler configured to call it."""
    kube = Kube.from_kubeconfig(state.admin_kubeconfig)
    scheduler = Scheduler(kube, options)
    thread = threading.Thread(target=scheduler.run, name="kubecell-extender", daemon=True)
    thread.start()
    served = serve(build_app(scheduler, None, extra_routes=routes(Extender(scheduler))), "127.0.0.1", 0)
    config = tmp / f"kube-scheduler-{node_cache}.yaml"
    config.write_text(render(url=f"{served.url}/extender", kubeconfig=state.kubeconfig("kube-scheduler"),
                             node_cache=node_cache, qps=5000))
    plane = ControlPlane.attach(state, ensure_binaries(log=lambda _: None))
    server = None
    try:
        assert scheduler.ready.wait(60)
        server = plane.start_kube_scheduler(config)
        yield scheduler
    finally:
        if server is not None:
            plane.stop_server(server)
        served.stop()
        scheduler.shutdown()
        thread.join(timeout=10)
        kube.close()


def placements(kube: Kube, namespace: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Pod name -> (node, GPU indices) from the allocation records the API server holds."""
    found = {}
    for pod in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        record: AllocationRecord | None = pods.record_of(pod)
        if record is not None and pods.node_of(pod):
            assert record.node == pods.node_of(pod)
            found[pod["metadata"]["name"]] = (record.node, tuple(g.index for g in record.gpus))
    return found


def fresh_namespace(kube: Kube, name: str) -> str:
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def clear(kube: Kube, namespace: str) -> None:
    testbed_driver.clear_pods(kube, namespace, timeout=60)


def test_kube_scheduler_with_the_extender_places_pods_as_kubecell_scheduler(
        example_state: ControlPlaneState, example_kube: Kube, tmp_path: Path) -> None:
    """The bundled example's GPU arrivals (fractional and whole-GPU pods, heterogeneous models), one at a
    time: first through ``kubecell scheduler``, then through kube-scheduler + extender. (Its CPU-only
    pods are left out: kube-scheduler never sends a pod that asks for no managed resource to an
    extender, so in extender mode kube-scheduler places those alone, on its own scores.)"""
    nodes_csv, pods_csv = example_paths()
    run = plan(load_nodes(nodes_csv), [pod for pod in load_pods(pods_csv) if pod.gpu_count], seed=42)
    options = run.scheduler_options("kubecell")
    alone = fresh_namespace(example_kube, "standalone")
    with own_scheduler(example_kube, options):
        standalone = replay(example_kube, run, namespace=alone)
    expected = placements(example_kube, alone)
    clear(example_kube, alone)
    extended = fresh_namespace(example_kube, "extended")
    with extender_mode(example_state, SchedulerOptions(**{**options.__dict__, "extender": True}), tmp_path):
        through_extender = replay(example_kube, run, namespace=extended)
    got = placements(example_kube, extended)
    clear(example_kube, extended)
    assert through_extender.failed == standalone.failed
    assert len(expected) > 300
    assert set(got) == set(expected)
    same = sum(got[name] == where for name, where in expected.items())
    differ = {name: (expected[name], got[name]) for name in expected if got[name] != expected[name]}
    assert same / len(expected) >= 0.99, f"{len(differ)} pods placed differently: {list(differ.items())[:5]}"
    assert not differ, f"every pod should match (one decision path): {list(differ.items())[:5]}"


def gang_pod(name: str, gang: str, size: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"kubecell.io/group": gang, "kubecell.io/group-size": str(size)}},
            "spec": {"schedulerName": "kubecell", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": {"kubecell.io/gpu": str(gpus)}}}]}}


def bound_names(kube: Kube, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            if pods.node_of(p)}


@pytest.mark.parametrize("node_cache", [True, False])
def test_a_gang_is_bound_whole_or_not_at_all(example_state: ControlPlaneState, example_kube: Kube,
                                            tmp_path: Path, node_cache: bool) -> None:
    namespace = fresh_namespace(example_kube, f"gang-{str(node_cache).lower()}")
    path = f"/api/v1/namespaces/{namespace}/pods"
    with extender_mode(example_state, SchedulerOptions(extender=True), tmp_path, node_cache=node_cache):
        for i in range(3):  # members arrive one at a time: none may be bound before the last exists
            example_kube.create(path, gang_pod(f"g-{i}", "train", 4, 2))
            time.sleep(1.5)
            assert not bound_names(example_kube, namespace), "a member of an incomplete gang was bound"
        pod = example_kube.get(f"{path}/g-0")
        message = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert "of 4 pods exist" in message  # kubecell's reason, reported by kube-scheduler
        example_kube.create(path, gang_pod("g-3", "train", 4, 2))
        wait_for("the whole gang bound", lambda: len(bound_names(example_kube, namespace)) == 4, 60)
        records = dict(placements(example_kube, namespace).items())
        assert len(records) == 4
        assert all(len(gpus) == 2 for _, gpus in records.values())
        # a gang no cluster can hold: nothing of it is ever bound
        for i in range(2):
            example_kube.create(path, gang_pod(f"huge-{i}", "huge", 2, 64))
        time.sleep(3)
        assert bound_names(example_kube, namespace) == set(records)
        def told_no_room() -> str | None:  # kube-scheduler retries after its back-off (up to 10 s)
            huge = example_kube.get(f"{path}/huge-0")
            message = next((c["message"] for c in huge["status"].get("conditions") or []
                            if c["type"] == "PodScheduled"), "")
            return message if "nodes are available" in message and "GPU" in message else None

        assert wait_for("kubecell's reason for the gang that cannot fit", told_no_room, 40)
        assert bound_names(example_kube, namespace) == set(records)
    clear(example_kube, namespace)


def test_the_extender_binds_one_gpu_pod_at_a_time_where_the_device_plugin_serves(
        example_state: ControlPlaneState, example_kube: Kube, tmp_path: Path) -> None:
    """Through kube-scheduler too, a node served by kubecell's device plugin gets its next GPU pod only after
    the node agent acknowledged the previous one (the bind call is refused meanwhile and retried)."""
    namespace = fresh_namespace(example_kube, "gate")
    try:
        with served_node(example_kube) as node, extender_mode(example_state, SchedulerOptions(extender=True),
                                                              tmp_path):
            pod_on(example_kube, namespace, "a", node, {"kubecell.io/gpu": "1"})
            wait_for("a bound", lambda: get(example_kube, namespace, "a")["spec"].get("nodeName"), 60)
            pod_on(example_kube, namespace, "b", node, {"kubecell.io/gpu": "1"})
            time.sleep(3)
            assert not get(example_kube, namespace, "b")["spec"].get("nodeName")
            acknowledge(example_kube, namespace, "a")
            wait_for("b bound after the ack", lambda: get(example_kube, namespace, "b")["spec"].get("nodeName"), 60)
    finally:
        clear(example_kube, namespace)
