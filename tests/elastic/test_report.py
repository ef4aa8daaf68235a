"""The worker's step reporter (``kubecell.elastic.report``) against the testbed's real API server, as the
worker's own ServiceAccount of ``deploy/elastic/worker-rbac.yaml`` (so the RBAC example is checked too).

It writes the annotation on its own pod at the first step and then at most once per interval, the mean of the
steps between; the scheduler's reader parses back exactly that; outside a pod it does nothing; without
credentials it logs one warning; with the API server unreachable or its pod gone, and with arguments that are
not a measurement, it returns False, logs once per kind, never raises and writes nothing. Intervals are short
and every loop is bounded.
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubecell.elastic.report import StepReporter
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.step_reports import ParsedReport, ReportProblem, build_step_report, read_step_report
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import DEPLOY
from tests.scheduler.deploy_support import kubectl, service_account_kubeconfig
from tests.support import wait_for

WORKER_RBAC = DEPLOY / "worker-rbac.yaml"
ACCOUNT = "kubecell-elastic-worker"
POD = "train-worker-0"
LOGGER = "kubecell.elastic.report"
ENV = ("KUBECELL_POD_NAME", "KUBECELL_POD_NAMESPACE", "KUBECELL_ELASTIC_JOB", "KUBECELL_WORKER_INDEX", "KUBECONFIG",
       "KUBERNETES_SERVICE_HOST", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "GROUP_RANK", "LOCAL_RANK")


def can_i(testbed: ControlPlaneState, verb: str, namespace: str) -> bool:
    answer = kubectl(testbed, "auth", "can-i", verb, "pods", "-n", namespace,
                     f"--as=system:serviceaccount:{namespace}:{ACCOUNT}", check=False)
    return answer.stdout.strip() == "yes"


@pytest.fixture
def worker_kubeconfig(testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> Path:
    """The worker's identity: deploy/elastic/worker-rbac.yaml applied in the namespace, and a token of its
    ServiceAccount in a kubeconfig."""
    kubectl(testbed, "apply", "-n", namespace, "-f", str(WORKER_RBAC))
    wait_for("the worker's Role in force", lambda: can_i(testbed, "patch", namespace), 30)
    assert not can_i(testbed, "get", namespace), "the worker may patch pods, nothing more"
    return service_account_kubeconfig(testbed, kube, tmp_path / "worker.kubeconfig", ACCOUNT, namespace=namespace)


@pytest.fixture
def worker_pod(kube: Kube, namespace: str) -> str:
    """A pod standing for the worker (no scheduler picks it up: it only has to exist)."""
    kube.create(f"/api/v1/namespaces/{namespace}/pods",
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": namespace},
                 "spec": {"schedulerName": "nobody", "serviceAccountName": ACCOUNT,
                          "containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1"}]}})
    return POD


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def in_pod(clean_env: pytest.MonkeyPatch, worker_kubeconfig: Path, worker_pod: str,
           namespace: str) -> pytest.MonkeyPatch:
    """The environment a worker's training process has: the controller's variables, torchrun's (a world of
    8 processes on 2 pods), and the worker's credentials (a kubeconfig here: the in-cluster token file does
    not exist on a test machine, so ``KUBERNETES_SERVICE_HOST`` alone must fall back to the kubeconfig)."""
    for name, value in {"KUBECELL_POD_NAME": worker_pod, "KUBECELL_POD_NAMESPACE": namespace,
                        "KUBECELL_ELASTIC_JOB": "train", "KUBECELL_WORKER_INDEX": "0",
                        "KUBECONFIG": str(worker_kubeconfig), "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                        "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "0", "GROUP_RANK": "0",
                        "LOCAL_RANK": "0"}.items():
        clean_env.setenv(name, value)
    return clean_env


def annotation(kube: Kube, namespace: str, name: str = POD) -> str | None:
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    value = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_STEP_REPORT)
    return None if value is None else str(value)


def parsed(kube: Kube, namespace: str) -> ParsedReport:
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{POD}")
    answer = read_step_report(pod, gpu_type="V100", now=time.time())
    assert isinstance(answer, ParsedReport), answer
    return answer


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == LOGGER and record.levelno >= logging.WARNING]


def test_it_writes_its_own_pod_and_the_reader_parses_it_back(in_pod: pytest.MonkeyPatch, kube: Kube,
                                                            namespace: str) -> None:
    reporter = StepReporter.from_environment(interval_seconds=30.0)
    assert reporter.enabled
    assert (reporter.replicas, reporter.nodes) == (8, 2)

    assert reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=16, grad_sqr=1.0, grad_var=3.0), \
        "the first step writes"
    first = parsed(kube, namespace)
    assert first.steps == 1
    assert (first.report.num_replicas, first.report.num_nodes, first.report.local_bsz) == (8, 2, 16)
    assert (first.report.step_time, first.report.sync_time) == (1.0, 0.1)
    assert (first.report.grad_sqr, first.report.grad_var) == (1.0, 3.0)
    assert abs(first.time - time.time()) < 30

    # within the interval: counted, not written; then flushed as their mean
    assert not reporter.step(step_seconds=2.0, sync_seconds=0.2, local_batch=16, grad_sqr=2.0, grad_var=5.0)
    assert not reporter.step(step_seconds=4.0, sync_seconds=0.4, local_batch=16)
    assert parsed(kube, namespace) == first, "nothing written within the interval"
    assert reporter.flush()
    second = parsed(kube, namespace)
    assert second.steps == 2
    assert (second.report.step_time, second.report.sync_time) == pytest.approx((3.0, 0.3))
    assert (second.report.grad_sqr, second.report.grad_var) == (2.0, 5.0), "the steps that measured them"
    assert second.time >= first.time
    assert not reporter.flush(), "nothing new to write"

    # on the pod: exactly the text of the one format's builder, for what the reader parsed back
    assert annotation(kube, namespace) == build_step_report(
        time=second.time, replicas=8, nodes=2, local_batch=16, accumulation_steps=1,
        step_seconds=(0.0 + 2.0 + 4.0) / 2, sync_seconds=(0.0 + 0.2 + 0.4) / 2, grad_sqr=2.0, grad_var=5.0, steps=2)

    # a new micro-batch size starts a new mean; accumulation is converted to the synchronising micro-step
    assert not reporter.step(step_seconds=9.0, sync_seconds=0.5, local_batch=16)
    assert not reporter.step(step_seconds=2.1, sync_seconds=0.1, local_batch=32, accumulation_steps=4)
    assert reporter.flush()
    third = parsed(kube, namespace)
    assert (third.steps, third.accumulation_steps, third.report.local_bsz) == (1, 4, 32)
    assert third.report.step_time == pytest.approx(0.6)
    assert (third.report.grad_sqr, third.report.grad_var) == (None, None)


def test_it_states_the_largest_micro_batch_the_script_fits(in_pod: pytest.MonkeyPatch, kube: Kube,
                                                          namespace: str) -> None:
    reporter = StepReporter.from_environment(max_local_batch=24)
    assert reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=16, accumulation_steps=3)
    assert parsed(kube, namespace).max_local_batch == 24
    assert reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=32) is False  # within the interval
    assert reporter.flush()
    assert parsed(kube, namespace).max_local_batch == 32, "never below the micro-batch it ran (the reader's rule)"
    assert StepReporter(None, max_local_batch=0).max_local_batch is None, "not a limit: not stated"


def test_it_writes_at_most_once_per_interval(in_pod: pytest.MonkeyPatch, kube: Kube, namespace: str) -> None:
    interval = 0.05
    reporter = StepReporter.from_environment(interval_seconds=interval)
    written: list[float] = []
    deadline = time.monotonic() + 1.0
    for _ in range(2000):  # bounded, whatever the machine's speed
        if time.monotonic() > deadline:
            break
        started = time.monotonic()
        if reporter.step(step_seconds=0.2, sync_seconds=0.02, local_batch=8):
            written.append(started)
        time.sleep(0.002)
    assert len(written) >= 2, "the first step and at least one interval later"
    gaps = [later - earlier for earlier, later in itertools.pairwise(written)]
    assert min(gaps) >= interval, gaps
    assert len(written) <= 1 + 1.0 / interval
    report = parsed(kube, namespace)
    assert report.report.step_time == pytest.approx(0.2)
    assert report.steps >= 1


def test_it_does_nothing_outside_a_pod(clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.0)
        assert not reporter.enabled
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
        assert not reporter.flush()
    assert warnings(caplog) == []


def test_without_credentials_it_logs_one_warning_and_does_nothing(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    clean_env.setenv("KUBECELL_POD_NAME", POD)
    clean_env.setenv("KUBECELL_POD_NAMESPACE", "default")
    clean_env.setenv("KUBECONFIG", str(tmp_path / "missing.kubeconfig"))
    clean_env.setenv("HOME", str(tmp_path))  # no ~/.kube/config to fall back on either
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.0)
        assert not reporter.enabled
        for _ in range(3):
            assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
    assert len(warnings(caplog)) == 1
    assert "no Kubernetes credentials" in warnings(caplog)[0]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_it_never_raises_when_the_api_server_is_unreachable(in_pod: pytest.MonkeyPatch, worker_kubeconfig: Path,
                                                            tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config: dict[str, Any] = yaml.safe_load(worker_kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{closed_port()}"
    unreachable = tmp_path / "unreachable.kubeconfig"
    unreachable.write_text(yaml.safe_dump(config))
    in_pod.setenv("KUBECONFIG", str(unreachable))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.05)
        assert reporter.enabled, "credentials load; the server is what is missing"
        started = time.monotonic()
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
        assert time.monotonic() - started < 10, "a refused connection costs no retries"
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8), "within the interval"
        time.sleep(0.06)
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8), "tried again, failed again"
        assert not reporter.flush()
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "not written" in logged[0]


def test_it_never_raises_when_its_pod_is_gone(in_pod: pytest.MonkeyPatch, kube: Kube, namespace: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.05)
        assert reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/{POD}", gracePeriodSeconds=0)

        def gone() -> bool:
            try:
                kube.get(f"/api/v1/namespaces/{namespace}/pods/{POD}")
            except ApiError as error:
                return error.not_found
            return False

        wait_for("the worker pod gone", gone, 30)
        time.sleep(0.06)
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
        time.sleep(0.06)
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
        assert not reporter.flush()
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "404" in logged[0]


def test_without_the_role_it_logs_one_warning_naming_it(clean_env: pytest.MonkeyPatch, testbed: ControlPlaneState,
                                                        kube: Kube, namespace: str, worker_pod: str, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The namespace's default ServiceAccount (no worker-rbac.yaml): forbidden, said once, with the fix."""
    wait_for("the default ServiceAccount", lambda: kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts")
             ["items"], 30)
    config = service_account_kubeconfig(testbed, kube, tmp_path / "default.kubeconfig", "default",
                                        namespace=namespace)
    for name, value in {"KUBECELL_POD_NAME": worker_pod, "KUBECELL_POD_NAMESPACE": namespace,
                        "KUBECONFIG": str(config)}.items():
        clean_env.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.0)
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.0, local_batch=8)
        assert not reporter.step(step_seconds=1.0, sync_seconds=0.0, local_batch=8)
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "403" in logged[0]
    assert "worker-rbac.yaml" in logged[0]
    assert annotation(kube, namespace) is None


def test_it_refuses_arguments_that_are_not_a_measurement(in_pod: pytest.MonkeyPatch, kube: Kube, namespace: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reporter = StepReporter.from_environment(interval_seconds=0.0)
        assert not reporter.step(step_seconds=math.nan, sync_seconds=0.1, local_batch=8)
        assert not reporter.step(step_seconds=math.nan, sync_seconds=0.1, local_batch=8)
        assert annotation(kube, namespace) is None, "nothing written"
        assert len(warnings(caplog)) == 1, "logged once per kind"
        assert "step_seconds nan" in warnings(caplog)[0]
        bad: list[dict[str, Any]] = [
            {"step_seconds": 1.0, "sync_seconds": -0.1, "local_batch": 8},
            {"step_seconds": 1.0, "sync_seconds": 0.1, "local_batch": 0},
            {"step_seconds": 1.0, "sync_seconds": 0.1, "local_batch": True},
            {"step_seconds": 1.0, "sync_seconds": 0.1, "local_batch": 8, "accumulation_steps": 1.5},
            {"step_seconds": 1.0, "sync_seconds": 0.1, "local_batch": 8, "grad_var": math.inf},
            {"step_seconds": "1.0", "sync_seconds": 0.1, "local_batch": 8},
        ]
        for arguments in bad:
            assert not reporter.step(**arguments), arguments
        assert annotation(kube, namespace) is None, "nothing written"
        assert reporter.step(step_seconds=1.0, sync_seconds=0.1, local_batch=8)
    report = parsed(kube, namespace)
    assert report.steps == 1, "refused calls are not counted"
    assert len(warnings(caplog)) == 5, warnings(caplog)  # step, sync, local_batch, accumulation, grad_var


def test_the_reader_refuses_a_report_written_by_hand(kube: Kube, namespace: str, worker_pod: str) -> None:
    """What anyone with patch on the pod writes is read as untrusted input: a problem, not an exception."""
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{worker_pod}",
               {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: '{"v":1,"time":"soon"}'}}})
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{worker_pod}")
    answer = read_step_report(pod, gpu_type="V100", now=time.time())
    assert answer == ReportProblem("MalformedReport", "time 'soon' is not a number")
