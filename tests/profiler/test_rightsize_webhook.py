"""The right-sizing webhook on the real testbed: the API server calls it for a new pod (over HTTPS, verified
against the CA it was given) and applies its patch, so the pod is created asking for its family's need, which
is what the kubelet will then count. Opted-out pods are left as they are, and a webhook that is down costs no
pod (``failurePolicy: Ignore``)."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from kubecell.cli.serving import Served, serve
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.rightsize import ANNOTATION_ASKED
from kubecell.profiler.history import JobHistory
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.profiler.webhook import webhook_app
from kubecell.testbed import pki
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.processes import free_port, terminate, wait_http
from tests.profiler.test_knowledge import finished
from tests.support import wait_for

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "rightsize" / "webhook.yaml"


def share_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"schedulerName": "kubecell", "containers": [{"name": "main", "image": "busybox", "resources": {
                "limits": {"kubecell.io/gpu-milli": "400", "kubecell.io/gpu-memory": "1024"}}}]}}


def asks(pod: dict[str, Any]) -> tuple[str, str, str | None]:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return (limits["kubecell.io/gpu-milli"], limits["kubecell.io/gpu-memory"],
            (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ASKED))


@pytest.fixture
def webhook(testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> Iterator[tuple[Served, int]]:
    """The webhook serving a history in which the ``light`` family of ``namespace`` needs less than 400 milli,
    registered as ``deploy/rightsize`` ships it but at its loopback address, with ``namespace`` opted in (the
    only one: the testbed is shared), and its advice."""
    credentials = Path(testbed.directory) / "pki"
    with JobHistory.open(f"sqlite:///{tmp_path / 'history.db'}") as history:
        for i in range(3):
            history.save(finished(namespace, f"light-{i}", 600, 0.1, milli=400))
        knowledge = HistoryKnowledge(history)
        advice = knowledge.share_milli({"metadata": {"name": "light-9", "namespace": namespace}})
        assert advice is not None
        assert advice < 400
        served = serve(webhook_app(knowledge.share_milli), "127.0.0.1", 0,
                       tls=(str(credentials / "apiserver.crt"), str(credentials / "apiserver.key")))
        kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"kubecell.io/right-size": "enabled"}}})
        name = f"kubecell-rightsize-{namespace}"
        shipped = yaml.safe_load(SHIPPED.read_text())  # its rules, selector and match condition, as shipped
        shipped["metadata"] = {"name": name}
        (hook,) = shipped["webhooks"]
        hook["clientConfig"] = {"url": f"{served.url}/mutate",
                                "caBundle": base64.b64encode((credentials / "ca.crt").read_bytes()).decode()}
        kube.create(WEBHOOKS, shipped)
        try:
            yield served, advice
        finally:
            with contextlib.suppress(ApiError):
                kube.delete(f"{WEBHOOKS}/{name}")
            served.stop()


def test_the_api_server_creates_a_share_asking_for_its_familys_need(
        kube: Kube, namespace: str, webhook: tuple[Served, int]) -> None:
    served, advice = webhook
    pods = f"/api/v1/namespaces/{namespace}/pods"
    # the API server picks a new webhook configuration up within a second or so: a dry run shows when
    wait_for("the webhook to be called", lambda: asks(kube.create(pods, share_pod("light-5"), dryRun="All"))[0]
             == str(advice))
    created = kube.create(pods, share_pod("light-9"))
    assert asks(created) == (str(advice), "1024", "400"), "the share lowered, its memory never"
    assert asks(kube.get(f"{pods}/light-9")) == (str(advice), "1024", "400")
    kept = kube.create(pods, share_pod("light-8", {"kubecell.io/right-size": "false"}))
    assert asks(kept) == ("400", "1024", None)
    served.stop()
    down = kube.create(pods, share_pod("light-7"))
    assert asks(down) == ("400", "1024", None), "a webhook that is down costs no pod"


def test_the_command_serves_the_history_over_https_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``kubecell profile webhook`` as a process: its history's advice in the patch, its certificate verified,
    SIGTERM ends it."""
    files = pki.create(tmp_path / "pki", "https://127.0.0.1:1")
    db = f"sqlite:///{tmp_path / 'history.db'}"
    with JobHistory.open(db) as history:
        for i in range(3):
            history.save(finished("team-a", f"light-{i}", 600, 0.1, milli=400))
        advice = HistoryKnowledge(history).share_milli({"metadata": {"name": "light-9", "namespace": "team-a"}})
    port = free_port()
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from kubecell.cli.main import app; app()", "profile", "webhook", "--db", db,
             "--tls-cert", str(files.serving_cert), "--tls-key", str(files.serving_key),
             "--listen", f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"https://127.0.0.1:{port}/healthz", process=process, log=log, timeout=60, ca=files.ca_cert)
        pod = {**share_pod("light-9"), "metadata": {"name": "light-9", "namespace": "team-a"}}
        body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
            "namespace": "team-a", "object": pod}}
        reply = requests.post(f"https://127.0.0.1:{port}/mutate", json=body, verify=str(files.ca_cert), timeout=10)
        assert reply.status_code == 200, reply.text
        patch = json.loads(base64.b64decode(reply.json()["response"]["patch"]))
        assert patch[0]["value"] == str(advice)
        assert requests.post(f"https://127.0.0.1:{port}/mutate", data=b"{", verify=str(files.ca_cert),
                             timeout=10).status_code == 400
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        terminate(process)
