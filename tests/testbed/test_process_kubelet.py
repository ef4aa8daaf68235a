"""The process kubelet runs the pods of chosen testbed nodes as real host processes.

On the session testbed: each test registers a node of its own, labelled for the process kubelet (the fake
kubelet then leaves it alone), starts a process kubelet for that node alone, and runs real programs
(``python -c``) as pods; the kubelet is stopped and every process it started ended when the test ends,
also when it fails. Every wait is bounded.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubecell.core.model import make_node
from kubecell.kube import pods
from kubecell.kube.inventory import inventory_of
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_INVENTORY, RESOURCE_GPU_MEMORY, RESOURCE_GPU_MILLI
from kubecell.kube.records import gpu_environment
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.kubelet_server import KubeletServer, serving_certificate
from kubecell.testbed.nodes import node_manifest
from kubecell.testbed.process_env import HOST_ONLY, ContainerStartError, command_line, expand
from kubecell.testbed.process_kubelet import (
    RUNS_LABEL,
    RUNS_PROCESSES,
    ProcessKubelet,
    container_log,
    kill_leftovers,
    running_process_kubelet,
)
from kubecell.testbed.process_runtime import CONTAINER_MARKER, PidRegistry
from kubecell.testbed.processes import alive
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.deploy_support import kubectl
from tests.support import registered_node, wait_for
from tests.testbed.process_support import IMAGE, TEST_NODE, WAIT, python
from tests.testbed.process_support import process_node as process_node_of


def pod_body(name: str, node: str, containers: list[dict[str, Any]], *, restart: str = "Never",
             init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod bound to ``node`` directly (``spec.nodeName``): no scheduler involved."""
    for container in (*containers, *(init or ())):
        container.setdefault("image", IMAGE)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                            "spec": {"nodeName": node, "restartPolicy": restart, "containers": containers, **spec}}
    if init:
        body["spec"]["initContainers"] = init
    return body


def create(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def phase_is(kube: Kube, namespace: str, name: str, *phases: str) -> dict[str, Any] | None:
    pod = get(kube, namespace, name)
    return pod if pod.get("status", {}).get("phase") in phases else None


def gone(kube: Kube, namespace: str, name: str) -> bool:
    try:
        get(kube, namespace, name)
    except ApiError as error:
        if error.not_found:
            return True
        raise
    return False


@pytest.fixture
def process_node(testbed: ControlPlaneState, kube: Kube) -> Iterator[tuple[str, ProcessKubelet]]:
    """A 2-GPU node of the test's own, served by a process kubelet of the test's own."""
    with process_node_of(testbed, kube, gpus=2) as served:
        yield served


def test_a_gpu_pod_placed_by_kubecell_runs_with_the_environment_its_record_gives(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet],
        start_scheduler: type[RunningScheduler]) -> None:
    node, kubelet = process_node
    kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"epochs": "3"}})
    dump = python("import json, os; print(json.dumps(dict(os.environ)), flush=True)")
    field = {name: {"valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in (
        ("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"), ("POD_UID", "metadata.uid"),
        ("APP", "metadata.labels['app']"), ("NOTE", "metadata.annotations['note']"), ("NODE", "spec.nodeName"),
        ("ACCOUNT", "spec.serviceAccountName"), ("POD_IP", "status.podIP"), ("HOST_IP", "status.hostIP"))}
    env = [{"name": name, **value} for name, value in field.items()] + [
        {"name": "MEMORY_MIB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
        {"name": "CPU_MILLI", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
        {"name": "EPOCHS", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "epochs"}}},
        {"name": "GREETING", "value": "hello $(POD_NAME), $$(POD_NAME) stays"},
    ]
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "labels": {"app": "train"}, "annotations": {"note": "first run"}},
            "spec": {"schedulerName": "kubecell", "nodeSelector": {TEST_NODE: node}, "restartPolicy": "Never",
                     "containers": [
                         {"name": "main", "image": IMAGE, "command": dump, "env": env, "resources": {
                             "requests": {"cpu": "500m", "memory": "256Mi"},
                             "limits": {"memory": "256Mi", RESOURCE_GPU_MILLI: "250", RESOURCE_GPU_MEMORY: "4096"}}},
                         {"name": "helper", "image": IMAGE, "command": dump}]}}
    start_scheduler(testbed)
    create(kube, namespace, body)
    done = wait_for("the pod to succeed", lambda: phase_is(kube, namespace, "probe", "Succeeded", "Failed"), WAIT)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == node

    record = pods.record_of(done)
    assert record is not None
    assert record.gpus
    assert record.gpus[0].milli == 250
    seen = json.loads(container_log(testbed.directory, namespace, "probe", "main"))
    expected = gpu_environment(record)
    assert {key: seen.get(key) for key in expected} == expected
    assert seen["CUDA_VISIBLE_DEVICES"] == seen["NVIDIA_VISIBLE_DEVICES"] == record.gpus[0].uuid
    assert (seen["KUBECELL_GPU_MILLI"], seen["KUBECELL_GPU_MEMORY_MIB"]) == ("250", "4096")
    assert seen["KUBECELL_GPU_MEMORY_FRACTION"] == f"{4096 / 40536:.4f}"  # of an A100's 40536 MiB, as the agent
    assert {name: seen[name] for name in field} == {
        "POD_NAME": "probe", "POD_NAMESPACE": namespace, "POD_UID": done["metadata"]["uid"], "APP": "train",
        "NOTE": "first run", "NODE": node, "ACCOUNT": done["spec"].get("serviceAccountName", ""),
        "POD_IP": "127.0.0.1", "HOST_IP": "127.0.0.1"}
    assert (seen["MEMORY_MIB"], seen["CPU_MILLI"], seen["EPOCHS"]) == ("256", "500", "3")
    assert seen["GREETING"] == "hello probe, $(POD_NAME) stays"
    api = testbed.api_url.removeprefix("https://")
    assert f"{seen['KUBERNETES_SERVICE_HOST']}:{seen['KUBERNETES_SERVICE_PORT']}" == api
    assert "KUBECONFIG" not in seen
    assert Path(seen["HOME"]).is_dir()
    assert seen["PATH"]

    helper = json.loads(container_log(testbed.directory, namespace, "probe", "helper"))
    assert (helper["NVIDIA_VISIBLE_DEVICES"], helper["CUDA_VISIBLE_DEVICES"]) == ("void", "")
    assert "KUBECELL_GPU_MILLI" not in helper

    statuses = {s["name"]: s for s in done["status"]["containerStatuses"]}
    for status in statuses.values():
        terminated = status["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"], status["restartCount"]) == (0, "Completed", 0)
        assert terminated["startedAt"] <= terminated["finishedAt"]
    conditions = {c["type"]: c for c in done["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "PodCompleted"
    assert conditions["Initialized"]["status"] == "True"
    assert conditions["PodScheduled"]["status"] == "True"
    assert done["status"]["podIP"] == done["status"]["hostIP"] == "127.0.0.1"
    assert kubelet.port


def test_on_a_device_plugin_node_it_acknowledges_as_the_agent_so_the_next_gpu_pod_is_bound(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    name = f"proc-{uuid.uuid4().hex[:6]}"
    node = make_node(name, cpu_milli=32_000, memory_mib=131_072, gpu_count=2, gpu_model="A100",
                     labels={TEST_NODE: name, RUNS_LABEL: RUNS_PROCESSES})
    manifest = node_manifest(node)
    inventory = inventory_of(node, agent="kubecell-node-agent/test").model_copy(update={"device_plugin": True})
    manifest["metadata"]["annotations"][ANNOTATION_INVENTORY] = inventory.to_annotation()
    with registered_node(kube, manifest), running_process_kubelet(testbed, [name]):
        start_scheduler(testbed)
        for pod in ("first", "second"):  # bound one at a time: the second waits for the first's acknowledgement
            create(kube, namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod}, "spec": {
                "schedulerName": "kubecell", "nodeSelector": {TEST_NODE: name}, "restartPolicy": "Never",
                "containers": [{"name": "main", "image": IMAGE, "command": python("print('ok')"),
                                "resources": {"limits": {RESOURCE_GPU_MILLI: "300"}}}]}})
        for pod in ("first", "second"):
            done = wait_for(f"{pod} to succeed", functools.partial(phase_is, kube, namespace, pod, "Succeeded"), WAIT)
            record = pods.record_of(done)
            assert record is not None
            assert done["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id


def test_a_gpu_pod_without_an_allocation_record_is_refused_as_the_agent_refuses_it(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    create(kube, namespace, pod_body("unplaced", node, [{"name": "main", "command": python("print('ran')"),
                                                         "resources": {"limits": {RESOURCE_GPU_MILLI: "500"}}}]))
    done = wait_for("the pod to fail", lambda: phase_is(kube, namespace, "unplaced", "Failed", "Succeeded"), WAIT)
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["reason"] == "UnexpectedAdmissionError"
    assert "carries no allocation record" in done["status"]["message"]
    assert container_log(testbed.directory, namespace, "unplaced", "main") == ""  # nothing ran
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    assert any(event["reason"] == "GPUAllocationRefused" for event in events)


def test_a_failing_command_fails_the_pod_with_its_exit_code(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    create(kube, namespace, pod_body("fails", node, [{"name": "main", "command": python(
        "import sys; print('about to fail', flush=True); sys.exit(3)")}]))
    done = wait_for("the pod to fail", lambda: phase_is(kube, namespace, "fails", "Succeeded", "Failed"), WAIT)
    assert done["status"]["phase"] == "Failed"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert container_log(testbed.directory, namespace, "fails", "main") == "about to fail\n"


def test_on_failure_restarts_the_container_and_counts(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    # The working directory is the container's own and outlives a restart: it counts the runs.
    code = ("import pathlib, sys; f = pathlib.Path('runs'); n = int(f.read_text()) + 1 if f.exists() else 1; "
            "f.write_text(str(n)); print('run', n, flush=True); sys.exit(0 if n == 3 else 7)")
    create(kube, namespace, pod_body("flaky", node, [{"name": "main", "command": python(code)}], restart="OnFailure"))
    done = wait_for("the third run to succeed", lambda: phase_is(kube, namespace, "flaky", "Succeeded", "Failed"), WAIT)
    assert done["status"]["phase"] == "Succeeded"
    status = done["status"]["containerStatuses"][0]
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert status["state"]["terminated"]["exitCode"] == 0
    assert container_log(testbed.directory, namespace, "flaky", "main") == "run 3\n"
    assert container_log(testbed.directory, namespace, "flaky", "main", previous=True) == "run 2\n"


def test_always_restarts_even_a_clean_exit_until_the_pod_is_deleted(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    create(kube, namespace, pod_body("loop", node, [{"name": "main", "command": python("print('once')")}],
                                     restart="Always"))

    def restarted() -> dict[str, Any] | None:
        statuses = get(kube, namespace, "loop")["status"].get("containerStatuses") or [{}]
        return statuses[0] if statuses[0].get("restartCount", 0) >= 2 else None

    status = wait_for("two restarts", restarted, WAIT)
    assert get(kube, namespace, "loop")["status"]["phase"] == "Running"
    assert status["lastState"]["terminated"]["reason"] == "Completed"
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/loop")  # also while it waits in its back-off
    wait_for("the pod to disappear", lambda: gone(kube, namespace, "loop"), WAIT)


def test_stopping_the_kubelet_ends_the_processes_it_started(
        testbed: ControlPlaneState, kube: Kube, namespace: str) -> None:
    name = f"proc-{uuid.uuid4().hex[:6]}"
    node = make_node(name, cpu_milli=8_000, memory_mib=16_384, labels={RUNS_LABEL: RUNS_PROCESSES})
    with registered_node(kube, node_manifest(node)):
        with running_process_kubelet(testbed, [name], shutdown_grace=1.0):
            create(kube, namespace, pod_body("lasting", name, [{"name": "main", "command": python(
                "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print(os.getpid(), flush=True); time.sleep(600)")}]))
            text = wait_for("the program to run",
                            lambda: container_log(testbed.directory, namespace, "lasting", "main"), WAIT)
            pid = int(text.split()[0])
            assert alive(pid)
        assert not alive(pid)  # SIGKILLed after the shutdown grace, though it ignored SIGTERM
        pid_files = Path(testbed.directory) / "process-kubelet" / "pids"
        assert not (pid_files / f"{pid}.json").exists()


def test_deletion_sends_sigterm_and_the_pod_disappears(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    code = ("import signal, sys, time\n"
            "def bye(*_):\n    print('got SIGTERM', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye); print('ready', flush=True)\n"
            "for _ in range(600): time.sleep(0.1)\n")
    create(kube, namespace, pod_body("polite", node, [{"name": "main", "command": python(code)}]))
    wait_for("the program to run", lambda: "ready" in container_log(testbed.directory, namespace, "polite", "main"),
             WAIT)
    assert get(kube, namespace, "polite")["status"]["phase"] == "Running"
    started = time.monotonic()
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/polite")  # the default grace period, 30 s
    wait_for("the pod to disappear", lambda: gone(kube, namespace, "polite"), WAIT)
    assert time.monotonic() - started < 10, "the program ended at once on SIGTERM; nothing waited for the grace"
    assert container_log(testbed.directory, namespace, "polite", "main") == "ready\ngot SIGTERM\n"


def test_a_program_ignoring_sigterm_is_killed_after_its_grace_period(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    code = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(os.getpid(), flush=True); time.sleep(600)")
    create(kube, namespace, pod_body("stubborn", node, [{"name": "main", "command": python(code)}],
                                     terminationGracePeriodSeconds=2))
    text = wait_for("the program to run", lambda: container_log(testbed.directory, namespace, "stubborn", "main"), WAIT)
    pid = int(text.split()[0])
    assert alive(pid)
    deleted = kube.delete(f"/api/v1/namespaces/{namespace}/pods/stubborn")
    started = time.monotonic()
    last: dict[str, Any] = deleted
    for event in kube.watch(f"/api/v1/namespaces/{namespace}/pods", deleted["metadata"]["resourceVersion"],
                            timeout_seconds=int(WAIT), fieldSelector="metadata.name=stubborn"):
        last = event["object"]
        if event["type"] == "DELETED":
            break
    elapsed = time.monotonic() - started
    assert gone(kube, namespace, "stubborn")
    assert 1.5 <= elapsed < 12, elapsed  # the 2 s grace period, then SIGKILL
    terminated = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 128 + signal.SIGKILL
    assert last["status"]["phase"] == "Failed"
    assert not alive(pid)


def test_processes_that_left_the_container_session_die_with_the_container(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    """torchrun starts each training process in a session of its own: neither the end of the agent nor a
    SIGKILL of its process group reaches it, but the end of the container does (its PID namespace)."""
    node, _ = process_node
    spawn = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', "
             "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], "
             "start_new_session=True); print(child.pid, flush=True)\n")
    create(kube, namespace, pod_body("leaver", node, [{"name": "main", "command": python(spawn)}]))
    create(kube, namespace, pod_body("deleted", node, [{"name": "main", "command": python(
        spawn + "import time; time.sleep(600)")}], terminationGracePeriodSeconds=1))
    children = {name: int(wait_for(f"{name} to start its child", functools.partial(
        container_log, testbed.directory, namespace, name, "main"), WAIT).split()[0]) for name in ("leaver", "deleted")}
    wait_for("the leaver to succeed", lambda: phase_is(kube, namespace, "leaver", "Succeeded"), WAIT)
    wait_for("the leaver's child to be killed", lambda: not alive(children["leaver"]), WAIT)
    assert alive(children["deleted"])
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/deleted")
    wait_for("the pod to disappear", lambda: gone(kube, namespace, "deleted"), WAIT)
    wait_for("the deleted pod's child to be killed", lambda: not alive(children["deleted"]), WAIT)


def test_init_containers_run_first_in_order(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet],
        tmp_path: Path) -> None:
    node, _ = process_node
    trail = tmp_path / "trail"

    def step(word: str) -> dict[str, Any]:
        return {"name": word, "command": python(f"open({str(trail)!r}, 'a').write({word!r} + ' ')")}

    create(kube, namespace, pod_body("ordered", node, [step("main")], init=[step("first"), step("second")]))
    done = wait_for("the pod to succeed", lambda: phase_is(kube, namespace, "ordered", "Succeeded", "Failed"), WAIT)
    assert done["status"]["phase"] == "Succeeded"
    assert trail.read_text() == "first second main "
    assert [s["state"]["terminated"]["reason"] for s in done["status"]["initContainerStatuses"]] == ["Completed"] * 2

    # A failing init container fails a restartPolicy: Never pod; its containers never start.
    failing = {"name": "broken", "command": python("import sys; sys.exit(4)")}
    create(kube, namespace, pod_body("blocked", node, [step("never")], init=[failing]))
    done = wait_for("the pod to fail", lambda: phase_is(kube, namespace, "blocked", "Succeeded", "Failed"), WAIT)
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 4
    assert done["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert "never" not in trail.read_text()


def test_a_container_without_command_is_refused_with_the_reason(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    create(kube, namespace, pod_body("imaged", node, [{"name": "main", "image": "busybox", "args": ["sleep", "1"]}]))
    done = wait_for("the pod to fail", lambda: phase_is(kube, namespace, "imaged", "Succeeded", "Failed"), WAIT)
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert HOST_ONLY in terminated["message"]
    assert "no `command`" in terminated["message"]
    assert HOST_ONLY in container_log(testbed.directory, namespace, "imaged", "main")


def test_kubectl_logs_reads_the_container_output_through_the_api_server(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    node, _ = process_node
    code = "import time\nfor i in range(3):\n    print('line', i, flush=True); time.sleep(0.5)\n"
    create(kube, namespace, pod_body("talker", node, [{"name": "main", "command": python(code)}]))
    wait_for("the program to start", lambda: container_log(testbed.directory, namespace, "talker", "main"), WAIT)
    followed = kubectl(testbed, "logs", "-f", "-n", namespace, "talker", "-c", "main", timeout=WAIT)
    assert followed.stdout == "line 0\nline 1\nline 2\n"  # -f: until the program ended
    wait_for("the pod to succeed", lambda: phase_is(kube, namespace, "talker", "Succeeded"), WAIT)
    assert kubectl(testbed, "logs", "-n", namespace, "talker").stdout == "line 0\nline 1\nline 2\n"
    assert kubectl(testbed, "logs", "--tail=1", "-n", namespace, "talker").stdout == "line 2\n"
    assert kubectl(testbed, "logs", "--limit-bytes=4", "-n", namespace, "talker").stdout == "line"
    missing = kubectl(testbed, "logs", "--previous", "-n", namespace, "talker", check=False)
    assert missing.returncode != 0
    assert "previous terminated container" in missing.stderr


def test_the_pods_of_a_deleted_node_are_killed(testbed: ControlPlaneState, kube: Kube, namespace: str) -> None:
    name = f"proc-{uuid.uuid4().hex[:6]}"
    node = make_node(name, cpu_milli=8_000, memory_mib=16_384, labels={RUNS_LABEL: RUNS_PROCESSES})
    with running_process_kubelet(testbed, [name], node_interval=0.5) as kubelet, \
            registered_node(kube, node_manifest(node)):
        wait_for("the kubelet to take the node", lambda: name in kubelet.nodes, WAIT)
        create(kube, namespace, pod_body("orphan", name, [{"name": "main", "command": python(
            "import os, time; print(os.getpid(), flush=True); time.sleep(600)")}]))
        text = wait_for("the program to run", lambda: container_log(testbed.directory, namespace, "orphan", "main"),
                        WAIT)
        pid = int(text.split()[0])
        assert alive(pid)
        kube.delete(f"/api/v1/nodes/{name}")
        wait_for("the process to be killed", lambda: not alive(pid), WAIT)
        failed = wait_for("the pod to fail", lambda: phase_is(kube, namespace, "orphan", "Failed"), WAIT)
        assert failed["status"]["reason"] == "NodeLost"


def test_kill_leftovers_ends_what_a_dead_kubelet_left_running(tmp_path: Path) -> None:
    registry = PidRegistry(tmp_path / "process-kubelet" / "pids", "dead-kubelet")
    marked = {**os.environ, CONTAINER_MARKER: "pod-uid/main/1"}
    process = subprocess.Popen(python("import time; time.sleep(600)"), start_new_session=True, env=marked)
    # what torchrun does with its training processes: a session of their own, the container's environment
    escaped = subprocess.Popen(python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "print('ready', flush=True); time.sleep(600)"), start_new_session=True,
                               env=marked, stdout=subprocess.PIPE)
    try:
        assert escaped.stdout is not None
        assert escaped.stdout.readline() == b"ready\n"  # ignoring SIGTERM from now on
        registry.add(process.pid, pod="ns/p", container="main", argv0=sys.executable, marker="pod-uid/main/1")
        stale = tmp_path / "process-kubelet" / "pids" / "999999999.json"
        stale.write_text(json.dumps({"pid": 999_999_999, "start": "1"}))
        assert kill_leftovers(tmp_path, grace=0.5) == [process.pid]
        assert not alive(process.pid)  # (reaped by kill_leftovers, since this test is its parent)
        assert escaped.wait(10) == -signal.SIGKILL  # found by its environment, though in no registered group
        assert not list((tmp_path / "process-kubelet" / "pids").glob("*.json"))
    finally:
        for started in (process, escaped):
            if started.poll() is None:
                os.killpg(started.pid, signal.SIGKILL)
                started.wait(10)
        if escaped.stdout is not None:
            escaped.stdout.close()


def _certificate_authority(directory: Path) -> tuple[Path, Path, Any, Any]:
    """A CA written as files, and its certificate and key objects (to sign a client certificate with)."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-kubelet-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "ca.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return directory / "ca.crt", directory / "ca.key", cert, key


def test_the_log_endpoint_can_verify_and_be_verified_by_the_api_server(tmp_path: Path) -> None:
    """Ready for an API server given ``--kubelet-certificate-authority`` and ``--kubelet-client-certificate``:
    the serving certificate is signed by the kubelet CA, and a client certificate is required."""
    ca_cert, ca_key, ca, key = _certificate_authority(tmp_path / "ca")
    now = datetime.datetime.now(datetime.UTC)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client")]))
              .issuer_name(ca.subject).public_key(client_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
              .sign(key, hashes.SHA256()))
    (tmp_path / "client.crt").write_bytes(client.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "client.key").write_bytes(client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    stop = threading.Event()
    server = KubeletServer(lambda *_: "no such log", lambda _: False, stop,
                           certificate=serving_certificate(tmp_path / "serving", issuer=(ca_cert, ca_key)),
                           client_ca=ca_cert).start()
    try:
        def get(with_client_certificate: bool) -> str:
            context = ssl.create_default_context(cafile=str(ca_cert))  # verifies the kubelet's certificate
            if with_client_certificate:
                context.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as secured:
                secured.sendall(b"GET /containerLogs/ns/p/c HTTP/1.0\r\n\r\n")
                answer = b""
                while chunk := secured.recv(4096):  # HTTP/1.0: the server closes after the answer
                    answer += chunk
                return answer.decode()

        answer = get(True)
        assert answer.startswith("HTTP/1.0 400")
        assert answer.endswith("no such log")
        with pytest.raises((ssl.SSLError, OSError)):
            get(False)  # refused: no client certificate
    finally:
        stop.set()
        server.close()


def test_commands_are_composed_as_kubernetes_composes_them() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)-$(C)-$$(A)-$-$x-$(", env.get) == "1-two-$(C)-$(A)-$-$x-$("
    assert command_line({"name": "c", "command": ["run", "$(A)"], "args": ["--b=$(B)"]}, env) == ["run", "1", "--b=two"]
    with pytest.raises(ContainerStartError, match="has `args` but no `command`"):
        command_line({"name": "c", "args": ["x"]}, env)


def test_a_pod_gets_its_service_accounts_token_unless_it_opts_out(
        testbed: ControlPlaneState, kube: Kube, namespace: str, process_node: tuple[str, ProcessKubelet]) -> None:
    """As a kubelet projects it: a token of the pod's ServiceAccount bound to the pod (here a kubeconfig named by
    KUBECONFIG); none with automountServiceAccountToken false, where the account does not exist, or where the
    pod names none (no admission plugin names ``default`` on the testbed)."""
    node, _ = process_node
    kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}})
    who = python("import os, yaml\npath = os.environ.get('KUBECONFIG')\n"
                 "print(yaml.safe_load(open(path))['users'][0]['name'] if path else 'none', flush=True)")
    cases: dict[str, dict[str, Any]] = {"with-account": {"serviceAccountName": "trainer"},
                                        "opted-out": {"serviceAccountName": "trainer",
                                                      "automountServiceAccountToken": False},
                                        "no-account": {"serviceAccountName": "nobody-made-me"},
                                        "names-none": {}}
    for name, spec in cases.items():
        create(kube, namespace, pod_body(name, node, [{"name": "main", "command": who}], **spec))
    for name in cases:
        finished = functools.partial(phase_is, kube, namespace, name, "Succeeded", "Failed")
        done = wait_for(f"{name} to finish", finished, WAIT)
        assert done["status"]["phase"] == "Succeeded", container_log(testbed.directory, namespace, name, "main")
    said = {name: container_log(testbed.directory, namespace, name, "main").strip() for name in cases}
    assert said == {"with-account": f"system:serviceaccount:{namespace}:trainer", "opted-out": "none",
                    "no-account": "none", "names-none": "none"}
