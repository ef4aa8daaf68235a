"""The extender's port answers whoever reaches it, so what a request says of its pod is not believed: the pod is
the one the cluster has (the watch's copy, else read from the API server by the request's namespace and name,
its uid checked). A made-up pod was placed, preempted other tenants' pods for its room, and stayed in the
mirror until the next relist. Requests are bounded in size: an unbounded one was read whole (34 MB cost 2 GB)."""

from __future__ import annotations

import copy
import threading
from typing import Any, cast

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from kubecell.kube.rest import Kube
from kubecell.scheduler.extender import http, protocol
from kubecell.scheduler.extender.verbs import Extender
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.trust_support import create_pod


def test_a_pod_the_request_makes_up_is_never_taken_and_a_real_one_is_read_as_the_cluster_has_it(
        testbed: ControlPlaneState, kube: Kube, namespace: str) -> None:
    scheduler = Scheduler(kube, SchedulerOptions(extender=True))  # not running: its mirror has seen nothing
    extender = Extender(scheduler)
    real = create_pod(kube, namespace, "train", {"nvidia.com/gpu": "1"}, annotations={"kubecell.io/vc": "team-a"})
    before = extender._known(real)
    assert isinstance(before, dict), "read from the API server: the mirror has not seen it"
    forged = copy.deepcopy(real)
    forged["metadata"]["annotations"]["kubecell.io/vc"] = "team-b"  # another tenant's guarantee
    forged["spec"]["priority"] = 2**31 - 1
    known = extender._known(forged)
    assert isinstance(known, dict), known
    assert known["metadata"]["annotations"]["kubecell.io/vc"] == "team-a", "the cluster's copy, not the request's"
    assert "priority" not in known["spec"] or known["spec"]["priority"] != 2**31 - 1

    ghost = copy.deepcopy(forged)
    ghost["metadata"].update(name="ghost", uid="0f0e0d0c-made-up0-0000-000000000000")
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        assert scheduler.ready.wait(60)
        verdict = extender.filter(ghost, ["n1", "n2"])
    finally:
        scheduler.shutdown()
        thread.join(timeout=10)
    assert verdict.passed == []
    assert set(verdict.failed.values()) == {f"kubecell finds no pod {namespace}/ghost"}
    renamed = copy.deepcopy(ghost)
    renamed["metadata"]["name"] = "train"  # a real pod's name with another uid
    assert extender._known(renamed) == f"pod {namespace}/train is not the one asked about (its uid is another)"
    nameless = {"metadata": {"uid": "u"}, "spec": {}}
    assert extender._known(nameless) == "the request's pod has no namespace and name a pod can have"
    assert "0f0e0d0c-made-up0-0000-000000000000" not in scheduler.mirror.pods, "nothing made up is mirrored"


def test_requests_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1024)
    client = TestClient(Starlette(routes=http.routes(cast(Extender, object()), ready=lambda: True)))
    big = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": ["n"] * 500}
    answer = client.post("/extender/filter", json=big)
    assert answer.status_code == 413
    assert "over 1024 bytes" in answer.json()["Error"]
    with pytest.raises(protocol.ProtocolError, match="more than the 50000 nodes"):
        protocol.parse_args({**big, "NodeNames": ["n"] * (protocol.MAX_CANDIDATES + 1)})
    nodes: dict[str, Any] = {"items": [{"metadata": {"name": "n"}}] * (protocol.MAX_CANDIDATES + 1)}
    with pytest.raises(protocol.ProtocolError, match="more than the 50000 nodes"):
        protocol.parse_args({"Pod": big["Pod"], "Nodes": nodes})
