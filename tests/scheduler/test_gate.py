"""The node gate's bookkeeping: one GPU pod in flight per agent-served node, the rest queued in order, a
node freed by the agent's acknowledgement, by the pod's end, or by the Binding being undone."""

from __future__ import annotations

from typing import Any, cast

from kubecell.core.engine.engine import Engine
from kubecell.core.model import Gpu, Node
from kubecell.kube.inventory import NodeView
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_ALLOCATION
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.gate import BindItem, NodeGate, acknowledged
from kubecell.scheduler.tracking import Tracking


def pod(uid: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {"kubecell.io/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def setup(*uids: str) -> tuple[NodeGate, Tracking, Mirror]:
    mirror = Mirror()
    for uid in uids:
        mirror.pods[uid] = pod(uid)
    node = Node("served", 1000, 1000, (Gpu(0, "A100", 40_000),))
    views = {"served": NodeView("served", node, serial_binds=True), "plain": NodeView("plain", node)}
    return NodeGate(mirror), Tracking(cast(Engine, None), views), mirror


def item(mirror: Mirror, uid: str, node: str = "served") -> BindItem:
    return ("job-" + uid, uid, mirror.pods[uid], node, None)


def test_one_pod_in_flight_per_served_node_the_rest_in_order() -> None:
    gate, state, mirror = setup("a", "b", "c", "p")
    ready = gate.admit(state, [item(mirror, "a"), item(mirror, "b"), item(mirror, "p", "plain"),
                               item(mirror, "c")])
    assert [i[1] for i in ready] == ["a", "p"]  # a node without the agent is never held
    assert [i[1] for i in state.deferred["served"]] == ["b", "c"]
    assert gate.release(state) == []  # a is neither acknowledged nor gone
    assert gate.waiting_on(state, "served") == "ns/a"


def test_the_agents_acknowledgement_of_the_current_record_frees_the_node() -> None:
    gate, state, mirror = setup("a", "b")
    gate.admit(state, [item(mirror, "a"), item(mirror, "b")])
    record_id = "a-0"
    annotations = mirror.pods["a"]["metadata"]["annotations"]
    annotations[ANNOTATION_ALLOCATION] = "{not a record"
    annotations[ANNOTATION_ACK] = record_id
    assert not acknowledged(mirror.pods["a"])  # an ack of a record that cannot be read frees nothing
    assert gate.release(state) == []
    del mirror.pods["a"]  # the pod is gone: its node is free
    assert [i[1] for i in gate.release(state)] == ["b"]
    assert state.inflight == {"served": "b"}


def test_an_undone_binding_frees_its_node_and_leaves_its_queue() -> None:
    gate, state, mirror = setup("a", "b", "c")
    gate.admit(state, [item(mirror, "a"), item(mirror, "b"), item(mirror, "c")])
    gate.forget(state, {"a", "b"})
    assert "served" not in state.inflight
    assert [i[1] for i in state.deferred["served"]] == ["c"]
    assert [i[1] for i in gate.release(state)] == ["c"]


def test_a_pod_asking_for_no_device_plugin_resource_is_never_held() -> None:
    gate, state, mirror = setup("a")
    mirror.pods["cpu"] = pod("cpu", {"cpu": "1"})
    mirror.pods["gpumem"] = pod("gpumem", {"kubecell.io/gpu-memory": "1000"})
    ready = gate.admit(state, [item(mirror, "a"), item(mirror, "cpu"), item(mirror, "gpumem")])
    assert [i[1] for i in ready] == ["a", "cpu", "gpumem"]
    assert gate.holding(state, "served", mirror.pods["cpu"]) is None
    assert gate.holding(state, "served", pod("x")) == "ns/a"
