"""VirtualCluster objects as the tenant configuration: conversion and verdicts (no cluster), then on the
testbed: the running scheduler uses them, refuses an infeasible change on the object itself while the
configuration in force keeps working, and running pods keep their GPUs across a reload."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from kubecell.core.topology import CellForest
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.rest import Kube
from kubecell.kube.tenant_source import TenantInputs, TenantMemory, choose_tenants
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.core.support import make_nodes
from tests.scheduler.test_scheduler import bound, get_pod, gpus_of, make_pod
from tests.support import wait_for


def vc(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": name, "generation": generation, "uid": f"uid-{name}"}, "spec": spec}


@pytest.fixture
def forest() -> CellForest:
    """Four 8-GPU V100M32 nodes in two racks: chain V100M32x8, 32 GPUs."""
    return CellForest(make_nodes(4, racks_of=2))


# ------------------------------------------------------------------ conversion, without a cluster
@pytest.mark.parametrize(("spec", "entry"), [
    ({"gpus": 8}, {"gpus": 8}),
    ({"gpus": 8, "chain": "V100M32x8"}, {"gpus": {"count": 8, "chain": "V100M32x8"}}),
    ({"cells": {"V100M32x8/node": 2}, "weight": 2, "borrowLimitGpus": 4, "minRuntimeMinutes": 10},
     {"cells": {"V100M32x8/node": 2}, "weight": 2, "borrowLimitGpus": 4, "minRuntimeMinutes": 10}),
    ({"pinnedCells": ["n0"]}, {"pinnedCells": ["n0"]}),
])
def test_a_spec_is_the_tenant_documents_entry(spec: dict[str, Any], entry: dict[str, Any]) -> None:
    assert vcs.tenant_entry(spec) == entry


def test_accepted_objects_become_the_tenants(forest: CellForest) -> None:
    resolution = vcs.resolve([vc("b", gpus=4, weight=2), vc("a", 3, cells={"V100M32x8/node": 2})], forest)
    assert resolution.tenants is not None
    assert resolution.tenants.names == ["a", "b"]
    a, b = resolution.tenants.vcs
    assert (a.guaranteed_gpus, b.guaranteed_gpus, b.weight) == (16, 4, 2)
    assert [(v.name, v.accepted, v.reason, v.generation, v.guaranteed_gpus) for v in resolution.verdicts] == [
        ("a", True, "Accepted", 3, 16), ("b", True, "Accepted", 1, 4)]


@pytest.mark.parametrize(("spec", "says"), [
    ({"cells": {"A100x8/node": 1}}, "VirtualCluster bad: spec.cells.A100x8/node"),   # a GPU model not in the cluster
    ({"gpus": 8, "chain": "H100x8"}, "VirtualCluster bad: spec.chain: unknown chain 'H100x8'"),
    ({"pinnedCells": ["n9"]}, "VirtualCluster bad: spec.pinnedCells[0]"),
    ({"gpus": 40}, "guarantees cannot all be met"),                                   # more than the cluster
])
def test_an_object_refused_on_its_own_blames_it_alone(forest: CellForest, spec: dict[str, Any], says: str) -> None:
    resolution = vcs.resolve([vc("good", gpus=8), vc("bad", 2, **spec)], forest)
    assert resolution.tenants is None
    verdicts = {v.name: v for v in resolution.verdicts}
    assert (verdicts["bad"].accepted, verdicts["bad"].reason, verdicts["bad"].generation) == (
        False, "InvalidGuarantee", 2)
    assert says in verdicts["bad"].message
    assert (verdicts["good"].accepted, verdicts["good"].reason) == (False, "NotApplied")
    assert "VirtualCluster bad refused" in verdicts["good"].message


def test_a_set_that_does_not_fit_together_blames_what_changed(forest: CellForest) -> None:
    before = [vc("a", gpus=16), vc("b", gpus=8)]
    in_force = {o["metadata"]["name"]: vcs.canonical_spec(o) for o in before}
    after = [vc("a", gpus=16), vc("b", 2, gpus=24)]          # each fits alone; 40 > 32 together
    verdicts = {v.name: v for v in vcs.resolve(after, forest, in_force).verdicts}
    assert (verdicts["b"].accepted, verdicts["b"].reason) == (False, "Infeasible")
    assert "cannot all be met at once" in verdicts["b"].message
    assert (verdicts["a"].accepted, verdicts["a"].reason) == (True, "Accepted")   # unchanged: still in force
    first_time = {v.name: v.reason for v in vcs.resolve(after, forest).verdicts}
    assert first_time == {"a": "Infeasible", "b": "Infeasible"}                   # nothing in force: both


def test_a_status_write_is_not_a_change_of_tenants() -> None:
    obj = vc("a", gpus=8)
    written = {**obj, "status": {"conditions": [{"type": "Accepted", "status": "True"}]},
               "metadata": {**obj["metadata"], "resourceVersion": "9"}}
    assert vcs.signature([obj]) == vcs.signature([written])
    assert vcs.signature([obj]) != vcs.signature([vc("a", 2, gpus=16)])


def test_the_condition_keeps_its_transition_time_while_the_status_holds() -> None:
    verdict = vcs.Verdict("a", 2, True, "Accepted", "in force")
    earlier = {"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert vcs.condition(verdict, earlier)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    flipped = vcs.condition(vcs.Verdict("a", 3, False, "Infeasible", "no"), earlier)
    assert flipped["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert set(flipped) == {"type", "status", "observedGeneration", "lastTransitionTime", "reason", "message"}


# ------------------------------------------------------------------ on the testbed
def put(kube: Kube, name: str, **spec: Any) -> dict[str, Any]:
    """Create the VirtualCluster, or replace its spec."""
    path = f"{vcs.PATH}/{name}"
    existing = [o for o in kube.get(vcs.PATH)["items"] if o["metadata"]["name"] == name]
    if existing:
        return kube.patch(path, [{"op": "replace", "path": "/spec", "value": spec}], kind="json")
    return kube.create(vcs.PATH, {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
                                  "metadata": {"name": name}, "spec": spec})


def accepted(kube: Kube, name: str, status: str = "True") -> dict[str, Any] | None:
    """The object once its Accepted condition has ``status`` for its current generation."""
    obj = kube.get(f"{vcs.PATH}/{name}")
    found = vcs.current_condition(obj)
    current = obj["metadata"]["generation"]
    return obj if found is not None and found["status"] == status and found["observedGeneration"] == current else None


def condition_message(kube: Kube, namespace: str, name: str) -> str:
    conditions = get_pod(kube, namespace, name)["status"].get("conditions") or []
    return next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "")


def record_vc(kube: Kube, namespace: str, name: str) -> tuple[str, str]:
    record = json.loads(get_pod(kube, namespace, name)["metadata"]["annotations"]["kubecell.io/allocation"])
    return record["vc"], record["class"]


def test_the_scheduler_uses_virtualcluster_objects(testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
                                                   start_scheduler: type[RunningScheduler]) -> None:
    put(kube, "a", gpus=8, borrowLimitGpus=0)
    put(kube, "b", gpus=16)
    running = start_scheduler(testbed)
    for name, gpus in (("a", 8), ("b", 16)):
        obj = wait_for(f"{name} accepted", partial(accepted, kube, name))
        assert obj["status"]["guaranteedGpus"] == gpus
    assert running.scheduler.engine is not None
    assert sorted(running.scheduler.engine.session.tenants.names) == ["a", "b"]
    make_pod(kube, namespace, "a-full", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "a"})
    wait_for("a's pod within its guarantee", lambda: bound(kube, namespace, "a-full"))
    assert record_vc(kube, namespace, "a-full") == ("a", "guaranteed")
    make_pod(kube, namespace, "a-more", {"nvidia.com/gpu": "1"}, {"kubecell.io/vc": "a"})  # beyond, may not borrow
    make_pod(kube, namespace, "nobody", {"nvidia.com/gpu": "1"}, {"kubecell.io/vc": "zeta"})
    wait_for("the unknown VC's pod told which VCs exist",
             lambda: "unknown virtual cluster 'zeta' (known: a, b)" in condition_message(kube, namespace, "nobody"))
    message = wait_for("a's second pod told why it waits", lambda: condition_message(kube, namespace, "a-more"))
    assert not bound(kube, namespace, "a-more"), message
    assert "a" in message


def test_an_infeasible_change_is_refused_on_the_object_and_the_running_configuration_stays(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    put(kube, "a", gpus=8, borrowLimitGpus=0)
    put(kube, "b", gpus=16)
    start_scheduler(testbed)
    wait_for("a accepted", lambda: accepted(kube, "a"))
    put(kube, "b", gpus=510)                       # fits the 512 GPUs alone, not beside a's 8
    refused = wait_for("b refused", lambda: accepted(kube, "b", "False"))
    condition = vcs.current_condition(refused)
    assert condition is not None
    assert condition["reason"] == "Infeasible"
    assert "cannot all be met at once" in condition["message"]
    assert condition["observedGeneration"] == refused["metadata"]["generation"] == 2
    put(kube, "c", gpus=8)                         # sound, but the set is refused: not applied
    waiting = wait_for("c not applied", lambda: accepted(kube, "c", "False"))
    assert (vcs.current_condition(waiting) or {})["reason"] == "NotApplied"
    events = wait_for("a Warning Event on b", lambda: [
        e for e in kube.get("/api/v1/namespaces/default/events")["items"]
        if e["involvedObject"].get("kind") == "VirtualCluster" and e["involvedObject"]["name"] == "b"])
    assert events[0]["type"] == "Warning"
    assert events[0]["reason"] == "Infeasible"
    # the configuration in force is the accepted one: a is guaranteed 8 GPUs and may not borrow
    make_pod(kube, namespace, "a-8", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "a"})
    make_pod(kube, namespace, "a-9th", {"nvidia.com/gpu": "1"}, {"kubecell.io/vc": "a"})
    make_pod(kube, namespace, "c-1", {"nvidia.com/gpu": "1"}, {"kubecell.io/vc": "c"})
    wait_for("a's guaranteed pod placed by the old guarantees", lambda: bound(kube, namespace, "a-8"))
    wait_for("c unknown to the configuration in force",
             lambda: "unknown virtual cluster 'c'" in condition_message(kube, namespace, "c-1"))
    assert not bound(kube, namespace, "a-9th")
    assert (vcs.current_condition(kube.get(f"{vcs.PATH}/a")) or {})["status"] == "True"   # a: still in force
    put(kube, "b", gpus=16)                        # repaired: the whole set is accepted
    for name in ("a", "b", "c"):
        wait_for(f"{name} accepted after the repair", partial(accepted, kube, name))
    wait_for("c's pod placed once c is in force", lambda: bound(kube, namespace, "c-1"))


def test_running_pods_keep_their_gpus_across_a_reload(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                      crd: None, start_scheduler: type[RunningScheduler]) -> None:
    put(kube, "a", gpus=16)
    running = start_scheduler(testbed)
    wait_for("a accepted", lambda: accepted(kube, "a"))
    for i in range(2):
        make_pod(kube, namespace, f"run-{i}", {"nvidia.com/gpu": "4"}, {"kubecell.io/vc": "a"})
    pods = wait_for("two running pods", lambda: bound(kube, namespace, "run-0", "run-1"))
    before = {name: gpus_of(pod) for name, pod in zip(("run-0", "run-1"), pods, strict=True)}
    put(kube, "a", gpus=4, weight=3)                # a smaller guarantee: one pod no longer covered
    wait_for("the new spec in force", lambda: accepted(kube, "a"))
    engine = wait_for("the rebuilt engine", lambda: running.scheduler.engine)
    assert engine.session.tenants.by_name["a"].guaranteed_gpus == 4
    after = {name: gpus_of(pod) for name, pod in zip(("run-0", "run-1"), bound(kube, namespace, "run-0", "run-1") or [],
                                                      strict=True)}
    assert after == before                          # nothing evicted, nothing moved
    classes = sorted(job.job_class.value for job in engine.running.values() if job.vc == "a" and job.job_class)
    assert classes == ["borrowed", "guaranteed"]    # held as recorded, one now beyond the guarantee
    make_pod(kube, namespace, "next", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "a"})
    placed = wait_for("a new pod", lambda: bound(kube, namespace, "next"))
    taken = {(node, gpu) for slots in before.values() for node, gpu, _ in slots}
    assert not taken & {(node, gpu) for node, gpu, _ in gpus_of(placed[0])}


HOSTILE_STATUSES = ["x", 7, [], {"conditions": "abc"}, {"conditions": 5}, {"conditions": {"Accepted": "True"}},
                    {"conditions": [5, "x", None, {"type": "Accepted"}]}, {"conditions": [{"type": 3}]}]


@pytest.mark.parametrize("status", HOSTILE_STATUSES)
def test_a_malformed_status_is_overwritten_never_raised(forest: CellForest, status: Any) -> None:
    """A status the schema would refuse (an object stored under an older CRD, or one without a schema) reached
    ``current_condition`` and ``report``, which raised AttributeError/TypeError out of the rebuild and stopped the
    scheduler's loop. It is judged like no condition at all, and the verdict replaces it."""
    obj = {**vc("a", gpus=8), "status": status}
    choice = choose_tenants(make_nodes(4, racks_of=2), TenantInputs([obj], None, list), TenantMemory())
    assert choice.kind == "virtualclusters"
    assert choice.tenants is not None
    assert not vcs.accepted_as_is(obj)
    patch = vcs.status_patch(obj, choice.verdicts[0])
    assert patch is not None
    assert [c["type"] for c in patch["status"]["conditions"]] == ["Accepted"]
    assert patch["status"]["conditions"][0]["status"] == "True"
    assert patch["status"]["guaranteedGpus"] == 8


def test_a_status_already_saying_the_verdict_is_not_written_again() -> None:
    verdict = vcs.Verdict("a", 1, True, "Accepted", "in force: 8 GPUs guaranteed", 8)
    obj = vc("a", gpus=8)
    patch = vcs.status_patch(obj, verdict)
    assert patch is not None
    other = {"type": "Ready", "status": "True"}
    written = {**obj, "status": {**patch["status"], "conditions": [other, *patch["status"]["conditions"]]}}
    assert vcs.status_patch(written, verdict) is None
    changed = vcs.status_patch(written, vcs.Verdict("a", 2, False, "Infeasible", "no"))
    assert changed is not None
    assert changed["status"]["conditions"][0] == other, "other conditions are kept"


def test_a_restarted_scheduler_keeps_the_accepted_set_beside_a_refused_object(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    """A restarted scheduler (or a new leader) knows what was accepted only from the objects' conditions. It began
    with no memory, so one refused object made the whole set refused with "None was accepted": the whole-cluster
    default took over, every tenant lost its guarantee, and the accepted objects were rewritten NotApplied."""
    put(kube, "a", gpus=8)
    put(kube, "b", gpus=16)
    first = start_scheduler(testbed)
    for name in ("a", "b"):
        wait_for(f"{name} accepted", partial(accepted, kube, name))
    put(kube, "c", gpus=500)                        # fits alone, not beside a and b
    wait_for("c refused", lambda: accepted(kube, "c", "False"))
    first.close()
    running = start_scheduler(testbed)
    engine = wait_for("the restarted scheduler's engine", lambda: running.scheduler.engine)
    assert sorted(engine.session.tenants.names) == ["a", "b"]
    make_pod(kube, namespace, "a-8", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "a"})
    wait_for("a's pod placed by the accepted set", lambda: bound(kube, namespace, "a-8"))
    assert record_vc(kube, namespace, "a-8") == ("a", "guaranteed")
    for name in ("a", "b"):
        assert accepted(kube, name) is not None, f"{name} still in force"
    assert (vcs.current_condition(kube.get(f"{vcs.PATH}/c")) or {})["reason"] == "Infeasible"
