"""The extender's wire format and its answers to bad requests (no API server needed: the verbs that
reach the engine run on a scheduler loop driven by hand, over no cluster)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from kubecell.kube.offline import OfflineKube
from kubecell.kube.rest import Kube
from kubecell.kube.watch import Event
from kubecell.scheduler.extender import protocol
from kubecell.scheduler.extender.http import routes
from kubecell.scheduler.extender.verbs import Extender
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.nodes import node_manifest, synthetic_cluster


def pod(name: str = "p", scheduler: str = "kubecell", limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"schedulerName": scheduler, "containers": [
                {"name": "c", "resources": {"limits": limits if limits is not None else {"kubecell.io/gpu": "1"}}}]}}


def test_keys_are_read_case_insensitively_and_written_exactly() -> None:
    args = protocol.parse_args({"pod": pod(), "NODENAMES": ["a", "b"]})
    assert args.by_name
    assert args.node_names == ["a", "b"]
    result = protocol.filter_result(args, ["a"], {"b": "full"})
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["NodeNames"] == ["a"]
    assert result["FailedNodes"] == {"b": "full"}


def test_without_a_node_cache_the_passed_node_objects_come_back() -> None:
    nodes = {"items": [{"metadata": {"name": "a"}, "status": {}}, {"metadata": {"name": "b"}}]}
    args = protocol.parse_args(json.dumps({"Pod": pod(), "Nodes": nodes}))
    assert not args.by_name
    result = protocol.filter_result(args, ["b"], {})
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["b"]


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({"NodeNames": ["a"]}), "no Pod"),
    (json.dumps({"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}), "metadata.uid"),
    (json.dumps({"Pod": pod()}), "neither NodeNames nor Nodes"),
    (json.dumps({"Pod": pod(), "NodeNames": "a"}), "list of strings"),
    (json.dumps({"Pod": pod(), "Nodes": {"items": [{"spec": {}}]}}), "no metadata.name"),
    (b'{"Pod": {}, "NodeNames": [], "n": ' + b"1" * 5000 + b"}", "not JSON"),  # past int()'s 4,300 digits
    (json.dumps({"Pod": {**pod(), "spec": "x"}, "NodeNames": []}), "spec must be an object"),
    (json.dumps({"Pod": {**pod(), "spec": {"schedulerName": ["kubecell"]}}, "NodeNames": []}), "schedulerName"),
    (json.dumps({"Pod": {**pod(), "spec": {"containers": ["c"]}}, "NodeNames": []}), "containers"),
    (json.dumps({"Pod": {**pod(), "spec": {"containers": [{"resources": ["x"]}]}}, "NodeNames": []}), "containers"),
    (json.dumps({"Pod": {**pod(), "spec": {"initContainers": [{"resources": {"limits": [["a"]]}}]}},
                 "NodeNames": []}), "containers"),
])
def test_malformed_filter_requests_are_named(body: bytes | str, message: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.parse_args(body)


def test_binding_args_need_every_field() -> None:
    args = protocol.parse_binding({"podname": "p", "PodNamespace": "ns", "PODUID": "u", "Node": "n"})
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ns", "u", "n")
    with pytest.raises(protocol.ProtocolError, match="missing PodUID, Node"):
        protocol.parse_binding({"PodName": "p", "PodNamespace": "ns"})


def test_preemption_victims_by_uid_either_form() -> None:
    meta = protocol.parse_preemption({"Pod": pod(), "NodeNameToMetaVictims": {"n": {"Pods": [{"uid": "v1"}]}}})
    assert meta.victims == {"n": ["v1"]}
    victims = {"n": {"Pods": [{"metadata": {"uid": "v2"}}]}}
    full = protocol.parse_preemption({"Pod": pod(), "NodeNameToVictims": victims})
    assert full.victims == {"n": ["v2"]}
    assert protocol.preemption_result({}) == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize("victims", [
    {"NodeNameToVictims": {"n": ["a"]}},
    {"NodeNameToVictims": {"n": {"Pods": 5}}},
    {"NodeNameToMetaVictims": {"n": "x"}},
    {"NodeNameToMetaVictims": {"n": {"Pods": {"uid": "v"}}}},
])
def test_malformed_preemption_victims_are_named(victims: dict[str, Any]) -> None:
    """Before, these raised AttributeError or TypeError out of the parser: a 500 and a traceback per request."""
    with pytest.raises(protocol.ProtocolError, match="preempt: the victims of node n"):
        protocol.parse_preemption({"Pod": pod(), **victims})


def test_priorities_stay_within_the_extender_range() -> None:
    assert protocol.priorities({"a": 12, "b": -1, "c": 10}) == [
        {"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}, {"Host": "c", "Score": 10}]


@pytest.fixture
def loop() -> Iterator[Scheduler]:
    """A scheduler over no cluster, its loop without watches: enough for the verbs' answers that need no
    node."""
    scheduler = Scheduler(cast(Kube, None), SchedulerOptions(extender=True))
    thread = threading.Thread(target=scheduler.loop, daemon=True)
    thread.start()
    try:
        assert scheduler.ready.wait(5)
        yield scheduler
    finally:
        scheduler.shutdown()
        thread.join(5)


def client(scheduler: Scheduler, timeout: float = 4.0) -> TestClient:
    return TestClient(Starlette(routes=routes(Extender(scheduler, timeout=timeout))))


def test_http_answers_bad_input_with_400_and_the_reason(loop: Scheduler) -> None:
    http = client(loop)
    answer = http.post("/extender/filter", content=b"{}")
    assert answer.status_code == 400
    assert "no Pod" in answer.json()["Error"]
    answer = http.post("/extender/bind", json={"PodName": "p"})
    assert answer.status_code == 400
    assert "missing" in answer.json()["Error"]
    # read on the request's thread and on the scheduler's: before, a 500 and a traceback per request
    for verb in ("filter", "prioritize", "preempt"):
        answer = http.post(f"/extender/{verb}", json={"Pod": {**pod(), "spec": {"schedulerName": ["kubecell"]}},
                                                      "NodeNames": ["a"], "NodeNameToVictims": {}})
        assert answer.status_code == 400, verb
    answer = http.post("/extender/filter", content=b'{"Pod": 1' + b"0" * 5000 + b"}")
    assert answer.status_code == 400
    assert "not JSON" in answer.json()["Error"]


def test_a_pod_of_another_scheduler_is_refused_for_good(loop: Scheduler) -> None:
    answer = client(loop).post("/extender/filter", json={"Pod": pod(scheduler="default-scheduler"),
                                                         "NodeNames": ["a", "b"]}).json()
    assert answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert "--scheduler-names" in answer["FailedAndUnresolvableNodes"]["a"]


def test_a_pod_that_asks_for_no_gpu_passes_untouched(loop: Scheduler) -> None:
    answer = client(loop).post("/extender/filter", json={"Pod": pod(limits={"cpu": "1"}), "NodeNames": ["a"]}).json()
    assert answer["NodeNames"] == ["a"]


def test_without_an_engine_every_node_fails_with_the_reason(loop: Scheduler) -> None:
    answer = client(loop).post("/extender/filter", json={"Pod": pod(), "NodeNames": ["a", "b"]}).json()
    assert answer["NodeNames"] == []
    assert "no engine" in answer["FailedNodes"]["a"]
    bound = client(loop).post("/extender/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-p",
                                                      "Node": "a"}).json()
    assert "does not know pod uid-p" in bound["Error"]  # the request's pod is never taken for the cluster's
    unknown = client(loop).post("/extender/bind", json={"PodName": "q", "PodNamespace": "ns", "PodUID": "uid-q",
                                                        "Node": "a"}).json()
    assert "does not know pod uid-q" in unknown["Error"]


def test_a_replica_that_is_not_ready_answers_503() -> None:
    scheduler = Scheduler(cast(Kube, None), SchedulerOptions(extender=True))
    answer = client(scheduler).post("/extender/filter", json={"Pod": pod(), "NodeNames": ["a"]})
    assert answer.status_code == 503
    assert "not ready" in answer.json()["Error"]


def test_a_loop_that_does_not_answer_in_time_gives_503_not_a_hang() -> None:
    scheduler = Scheduler(cast(Kube, None), SchedulerOptions(extender=True))
    scheduler.ready.set()  # ready, but no loop runs the call
    answer = client(scheduler, timeout=0.2).post("/extender/filter", json={"Pod": pod(), "NodeNames": ["a"]})
    assert answer.status_code == 503
    assert "did not answer" in answer.json()["Error"]


@pytest.mark.parametrize("nodes", [
    {"items": [{"metadata": {"name": ["a"]}}]},
    {"items": [{"metadata": {"name": {"a": 1}}}]},
    {"items": [{"metadata": ["name"]}]},
    {"items": ["a"]},
])
def test_a_node_name_that_is_not_text_is_a_400_not_a_500(nodes: dict[str, Any]) -> None:
    """Before, a list or an object as a node's name got past the parser and failed building the answer."""
    with pytest.raises(protocol.ProtocolError, match=r"no metadata\.name that is text"):
        protocol.parse_args({"Pod": pod(), "Nodes": nodes})


def test_a_victim_whose_metadata_is_not_an_object_is_read_as_no_uid() -> None:
    """Before, an AttributeError: a 500 and a traceback per request."""
    args = protocol.parse_preemption({"Pod": pod(), "NodeNameToVictims": {"n": {"Pods": [{"metadata": [1]}]}}})
    assert args.victims == {"n": [""]}


def test_a_long_name_in_the_request_is_never_repeated_per_node(loop: Scheduler) -> None:
    """Each failed node carries the reason, and the reason echoed the request's schedulerName: 0.5 MB in (an
    8 KB name, 50,000 node names) was 416 MB out, past the scheduler's memory limit."""
    nodes = [f"n{i}" for i in range(2_000)]
    answer = client(loop).post("/extender/filter", json={"Pod": pod(scheduler="x" * 8_000), "NodeNames": nodes})
    reasons = answer.json()["FailedAndUnresolvableNodes"]
    assert len(reasons) == len(nodes)
    assert max(len(reason) for reason in reasons.values()) < 300
    unknown = {**pod(), "metadata": {"name": "y" * 8_000, "namespace": "ns", "uid": "uid-long"}}
    answer = client(loop).post("/extender/filter", json={"Pod": unknown, "NodeNames": nodes})
    assert max(len(reason) for reason in answer.json()["FailedNodes"].values()) < 300


def test_a_call_that_changes_nothing_runs_no_scheduling_cycle() -> None:
    """Every extender call wakes the loop; the wake-up alone marked it dirty, so each call, even a bind of a pod
    nobody knows from whoever reaches the port, cost a whole scheduling pass."""
    scheduler = Scheduler(cast(Kube, OfflineKube()), SchedulerOptions(extender=True))
    scheduler.events.put(Event("nodes", "SYNC", objects=tuple(node_manifest(n) for n in synthetic_cluster(4))))
    thread = threading.Thread(target=scheduler.loop, daemon=True)
    thread.start()
    try:
        assert scheduler.ready.wait(30)
        http = client(scheduler)
        http.post("/extender/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "warm", "Node": "a"})
        assert scheduler.state is not None, "an engine over the four nodes"
        before = scheduler.cycles
        for n in range(30):
            answer = http.post("/extender/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": f"nobody-{n}",
                                                       "Node": "a"}).json()
            assert "does not know pod" in answer["Error"]
        assert scheduler.cycles - before <= 1, "a wake-up alone is no change"
    finally:
        scheduler.shutdown()
        thread.join(5)
