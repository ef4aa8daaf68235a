"""``kubecell scheduler`` with DRA ResourceClaims on the real testbed: claims of kubecell's device classes are
placed by the same engine as every other pod (gangs, guarantees, preemption), their allocation is written
before the Binding and matches the pod's record, claims others allocated are held, and bad claims are told
to their pods without disturbing anything else."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kubecell.kube import claim_writes, dra_names
from kubecell.kube.claim_writes import FINALIZER
from kubecell.kube.names import ANNOTATION_VC
from kubecell.kube.rest import Kube
from kubecell.scheduler.claims import ClaimsDeferred
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.dra_support import (
    apply_device_classes,
    claim_of,
    claim_pod,
    events_of,
    get_claim,
    gpu_nodes,
    make_claim,
    make_template,
    published,
    recorded,
    request,
    results,
)
from tests.scheduler.deploy_support import kubectl
from tests.scheduler.test_scheduler import bound, get_pod, make_pod
from tests.scheduler.test_tenant_source import configmap, tenant_names, waiting_message
from tests.support import wait_for

ATTR = f'device.attributes["{dra_names.DRIVER}"]'


@pytest.fixture(scope="module")
def dra_nodes(testbed: ControlPlaneState, kube: Kube) -> Iterator[list[str]]:
    """Four of the testbed's nodes publish their GPUs as kubecell's DRA devices (the others do not, so a
    claim can only land on these four)."""
    nodes = gpu_nodes(kube, 4)
    apply_device_classes(kube)
    with published(kube, nodes):
        yield nodes


def placed(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    found = bound(kube, namespace, name)
    return found[0] if found else None


def claimed_devices(kube: Kube, pod: dict[str, Any]) -> tuple[str, list[str]]:
    """(node, device names) of the pod's claim as allocated; checks it is reserved for the pod and protected."""
    claim = claim_of(kube, pod)
    status = claim["status"]
    assert status["reservedFor"] == [{"resource": "pods", "name": pod["metadata"]["name"],
                                      "uid": pod["metadata"]["uid"]}]
    assert FINALIZER in claim["metadata"]["finalizers"]
    terms = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    (node,) = terms[0]["matchFields"][0]["values"]
    found = results(claim)
    assert {r["driver"] for r in found} == {dra_names.DRIVER}
    assert {r["pool"] for r in found} == {node}
    return node, sorted(r["device"] for r in found)


def test_a_whole_gpu_claim_from_a_template_is_allocated_as_recorded(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_template(kube, namespace, "two-gpus", [request("gpus", count=2)])
    claim_pod(kube, namespace, "trainer", template="two-gpus")
    pod = wait_for("the pod bound", partial(placed, kube, namespace, "trainer"))
    node, gpus = recorded(pod)
    assert node in dra_nodes
    assert len(gpus) == 2
    assert {milli for _, _, milli, _ in gpus} == {1000}
    assert claimed_devices(kube, pod) == (node, sorted(f"gpu-{index}" for index, _, _, _ in gpus))


def test_two_shares_by_capacity_land_on_one_gpu(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                dra_nodes: list[str], start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    for name in ("half-a", "half-b"):
        make_claim(kube, namespace, name, [request("gpu", dra_names.CLASS_GPU_SHARE, capacity={"compute": "500"})])
        claim_pod(kube, namespace, name, claim=name)
    pods = [wait_for(f"{name} bound", partial(placed, kube, namespace, name)) for name in ("half-a", "half-b")]
    slots = [recorded(pod) for pod in pods]
    assert slots[0][0] == slots[1][0], slots
    assert slots[0][1][0][0] == slots[1][1][0][0], slots   # one GPU
    assert {gpu[2] for _, gpus in slots for gpu in gpus} == {500}
    allocated = [results(get_claim(kube, namespace, name))[0] for name in ("half-a", "half-b")]
    assert {r["device"] for r in allocated} == {f"gpu-{slots[0][1][0][0]}"}
    assert all(r["consumedCapacity"]["compute"] == "500" for r in allocated), allocated
    assert allocated[0]["shareID"] != allocated[1]["shareID"]


def test_a_selector_on_the_device_attributes_chooses_the_gpu(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    model = recorded_model(kube, dra_nodes[0])
    make_claim(kube, namespace, "sixth", [request("gpu", selectors=[
        f'{ATTR}.model == "{model}" && {ATTR}.index == 5'])])
    claim_pod(kube, namespace, "sixth", claim="sixth")
    pod = wait_for("the pod bound", partial(placed, kube, namespace, "sixth"))
    assert [index for index, _, _, _ in recorded(pod)[1]] == [5]
    make_claim(kube, namespace, "absent", [request("gpu", selectors=[f'{ATTR}.model == "NoSuchGPU"'])])
    claim_pod(kube, namespace, "absent", claim="absent")
    wait_for("the pod told it fits nowhere", lambda: waiting_message(kube, namespace, "absent"))
    assert not get_pod(kube, namespace, "absent")["spec"].get("nodeName")


def recorded_model(kube: Kube, node: str) -> str:
    slices = kube.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
    (mine,) = [s for s in slices if s["spec"].get("nodeName") == node]
    return str(mine["spec"]["devices"][0]["attributes"]["model"]["string"])


def test_a_gang_of_eight_pods_with_claims_is_bound_all_or_nothing(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_template(kube, namespace, "four-gpus", [request("gpus", count=4)])
    gang = {"kubecell.io/group": "train", "kubecell.io/group-size": "8"}
    for i in range(7):
        claim_pod(kube, namespace, f"worker-{i}", template="four-gpus", annotations=gang)
    time.sleep(3.0)
    assert not any(get_pod(kube, namespace, f"worker-{i}")["spec"].get("nodeName") for i in range(7))
    claims = kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")["items"]
    assert not any((c.get("status") or {}).get("allocation") for c in claims), "a claim allocated before the gang"
    claim_pod(kube, namespace, "worker-7", template="four-gpus", annotations=gang)
    names = [f"worker-{i}" for i in range(8)]
    pods = wait_for("the whole gang bound", lambda: bound(kube, namespace, *names), 60)
    devices = [claimed_devices(kube, pod) for pod in pods]
    assert {node for node, _ in devices} == set(dra_nodes)       # 8 x 4 GPUs: all 32 GPUs of the 4 nodes
    assert len({(node, device) for node, found in devices for device in found}) == 32


def test_a_guaranteed_claim_preempts_borrowed_claim_holders_of_another_vc(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    configmap(kube, namespace, "virtualClusters:\n  a:\n    cells: {P40x8/node: 1}\n  b:\n"
                               "    cells: {P40x8/node: 1}\n")
    running = start_scheduler(testbed, SchedulerOptions(tenants_namespace=namespace, tenants_configmap="tenants"))
    wait_for("VCs a and b in force", lambda: tenant_names(running) == ["a", "b"])
    make_template(kube, namespace, "node", [request("gpus", count=8)])
    for i in range(4):   # VC b takes all four DRA nodes: one guaranteed, three borrowed
        claim_pod(kube, namespace, f"b-{i}", template="node", annotations={ANNOTATION_VC: "b"})
    wait_for("VC b on all four nodes", lambda: bound(kube, namespace, *(f"b-{i}" for i in range(4))), 60)
    claim_pod(kube, namespace, "a-0", template="node", annotations={ANNOTATION_VC: "a"})
    pod = wait_for("VC a's guaranteed claim placed after a preemption",
                   partial(placed, kube, namespace, "a-0"), 90)
    node, devices = claimed_devices(kube, pod)
    assert len(devices) == 8
    assert node in dra_nodes
    items = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    left = [p for p in items if p["metadata"]["name"].startswith("b-") and not p["metadata"].get("deletionTimestamp")]
    assert len(left) == 3, "exactly one borrowed pod of VC b was preempted"


def test_the_same_workload_lands_identically_through_claims_and_extended_resources(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    """Each ask is placed alone on the same cluster state by a stateless policy (best fit), once through a
    claim and once through kubecell's extended resources limited to the same nodes: same node, GPUs, share."""
    start_scheduler(testbed, SchedulerOptions(placement="bestfit"))
    only_dra = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                                      for node in dra_nodes]}   # a field selector takes one value per term
    asks = [("two", [request("g", count=2)], {"kubecell.io/gpu": "2"}),
            ("quarter", [request("g", dra_names.CLASS_GPU_SHARE, capacity={"compute": "250"})],
             {"kubecell.io/gpu-milli": "250"})]
    for label, claim_requests, limits in asks:
        make_claim(kube, namespace, f"c-{label}", claim_requests)
        claim_pod(kube, namespace, f"c-{label}", claim=f"c-{label}")
        through_claim = recorded(wait_for("the claim's pod bound", partial(placed, kube, namespace, f"c-{label}")))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/c-{label}", gracePeriodSeconds=0)
        wait_for("its GPUs free again", partial(_gone, kube, namespace, f"c-{label}"))
        body = make_pod_body(namespace, f"r-{label}", limits, only_dra)
        kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
        through_resources = recorded(wait_for("the resource pod bound", partial(placed, kube, namespace, f"r-{label}")))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/r-{label}", gracePeriodSeconds=0)
        wait_for("its GPUs free again", partial(_gone, kube, namespace, f"r-{label}"))
        assert through_claim == through_resources, label


def make_pod_body(namespace: str, name: str, limits: dict[str, str], affinity: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "kubecell",
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": affinity}},
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}}


def _gone(kube: Kube, namespace: str, name: str) -> bool:
    return not any(p["metadata"]["name"] == name for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"])


@pytest.mark.parametrize(("label", "claim_requests", "expected"), [
    ("unknown-class", [request("g", "no-such-class.example.com")], "no-such-class.example.com"),
    ("too-large", [request("g", dra_names.CLASS_GPU_SHARE, capacity={"compute": "250", "memory": "4Ti"})],
     "memory"),
    # the API server refuses CEL that does not compile; these compile, but kubecell's evaluator lacks them
    ("ip-library", [request("g", selectors=[f"isIP({ATTR}.uuid)"])], "isIP"),
    ("optional-syntax", [request("g", selectors=[f'{ATTR}.?model.orValue("") == ""'])], "syntax"),
])
def test_a_claim_kubecell_cannot_allocate_is_told_to_its_pod_and_blocks_nobody(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler], label: str, claim_requests: list[dict[str, Any]],
        expected: str) -> None:
    start_scheduler(testbed)
    make_claim(kube, namespace, label, claim_requests)
    claim_pod(kube, namespace, label, claim=label)
    make_pod(kube, namespace, "bystander", {"kubecell.io/gpu": "1"})
    wait_for("the bystander placed", lambda: bound(kube, namespace, "bystander"))
    try:
        told = wait_for("a FailedScheduling Event on the pod", lambda: [
            e for e in events_of(kube, namespace, label) if e.startswith("FailedScheduling")])
    except AssertionError as error:
        raise AssertionError(f"{error}; events: {events_of(kube, namespace, label)}, waiting: "
                             f"{waiting_message(kube, namespace, label)!r}") from None
    assert expected in told[0], told
    assert not get_pod(kube, namespace, label)["spec"].get("nodeName")
    assert not (get_claim(kube, namespace, label).get("status") or {}).get("allocation")


def test_a_claim_whose_selectors_take_several_passes_is_placed_and_others_meanwhile(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler], monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim's selectors run in slices of a pass (``scheduler.claims.PASS_SELECTOR_SECONDS``, 10 ms here): the
    pod waits a few passes, is read again without any event to wake the loop, and is placed; a pod asking by
    extended resource, made after it, is placed meanwhile."""
    monkeypatch.setattr("kubecell.scheduler.claims.PASS_SELECTOR_SECONDS", 0.01)
    passes: list[bool] = []
    deferred = ClaimsDeferred.__init__

    def counted(self: ClaimsDeferred, key: str, message: str, *, started: bool) -> None:
        passes.append(started)
        deferred(self, key, message, started=started)

    monkeypatch.setattr(ClaimsDeferred, "__init__", counted)
    start_scheduler(testbed)
    numbers = "[" + ",".join(str(i) for i in range(40)) + "]"  # a few ms a device; new to this scheduler
    make_claim(kube, namespace, "slow", [request("gpu", selectors=[f"{numbers}.all(x, x >= -{time.time_ns()})"])])
    claim_pod(kube, namespace, "slow", claim="slow")
    make_pod(kube, namespace, "bystander", {"kubecell.io/gpu": "1"})
    wait_for("the bystander placed", lambda: bound(kube, namespace, "bystander"))
    try:
        node = wait_for("the slow claim's pod placed", partial(placed, kube, namespace, "slow"))["spec"]["nodeName"]
    except AssertionError as error:
        raise AssertionError(f"{error}; passes {passes}, events {events_of(kube, namespace, 'slow')}, waiting: "
                             f"{waiting_message(kube, namespace, 'slow')!r}") from None
    assert node in dra_nodes
    assert passes.count(True) >= 2, f"read over several passes: {passes}"
    assert claimed_devices(kube, get_pod(kube, namespace, "slow"))[0] == node


def test_a_claim_nested_too_deep_for_python_never_stops_the_claims_watch(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler], tmp_path: Path) -> None:
    """Opaque parameters are free-form: a 3 KB claim nested 1,500 deep (the API server accepts 10,000) raised
    RecursionError out of the watch's decoding, which ended the watcher thread: no claim made afterwards, by
    anyone, was ever seen, and their pods waited for ever."""
    start_scheduler(testbed)
    config = '[{"requests": ["g"], "opaque": {"driver": "other.example.com", "parameters": {"a": ' + \
        "[" * 1500 + "]" * 1500 + "}}}]"  # written as text: Python's own encoder stops near 1,000 levels too
    body = json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": "deep", "namespace": namespace},
                       "spec": {"devices": {"requests": [request("g")], "config": "CONFIG"}}})
    (tmp_path / "deep.json").write_text(body.replace('"CONFIG"', config))
    kubectl(testbed, "create", "-f", str(tmp_path / "deep.json"))  # (Go's encoder takes it)
    claim_pod(kube, namespace, "deep", claim="deep")
    told = wait_for("a FailedScheduling Event on the deep claim's pod", lambda: [
        e for e in events_of(kube, namespace, "deep") if e.startswith("FailedScheduling")])
    assert "nested deeper than kubecell reads" in told[0], told
    make_claim(kube, namespace, "after", [request("g")])
    claim_pod(kube, namespace, "after", claim="after")
    wait_for("a pod whose claim came after the deep one placed", partial(placed, kube, namespace, "after"))


def test_a_claim_reserved_for_another_pod_is_refused(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_claim(kube, namespace, "shared", [request("g")])
    claim_pod(kube, namespace, "first", claim="shared")
    first = wait_for("the first pod bound", partial(placed, kube, namespace, "first"))
    claim_pod(kube, namespace, "second", claim="shared")
    told = wait_for("a FailedScheduling Event on the second pod", lambda: [
        e for e in events_of(kube, namespace, "second") if e.startswith("FailedScheduling")])
    assert "reserved for pod(s) first" in told[0], told
    assert claimed_devices(kube, first)[0] == first["spec"]["nodeName"]   # the first pod's claim untouched


def test_a_claim_allocated_for_a_pod_never_bound_is_taken_back_and_placed_afresh(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    """What a crash between the claim's write and the Binding leaves: the claim allocated (here to GPU 7 of
    the first DRA node) and reserved for a pod nobody bound. The next scheduler takes it back and places the
    pod where its selector says (GPU 0), allocating the claim to match its record."""
    claim = make_claim(kube, namespace, "stale", [request("g", selectors=[f"{ATTR}.index == 0"])])
    pod = claim_pod(kube, namespace, "stale", claim="stale")
    node = dra_nodes[0]
    allocation = {"devices": {"results": [{"request": "g", "driver": dra_names.DRIVER, "pool": node,
                                            "device": "gpu-7"}]},
                  "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                      {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    claim_writes.allocate(kube, namespace, "stale", claim["metadata"]["uid"], allocation, pod)
    start_scheduler(testbed)
    bound_pod = wait_for("the pod bound", partial(placed, kube, namespace, "stale"))
    _, gpus = recorded(bound_pod)
    assert [index for index, _, _, _ in gpus] == [0]
    assert claimed_devices(kube, bound_pod)[1] == ["gpu-0"]


def test_a_claim_kube_scheduler_allocated_is_held_on_its_exact_gpu(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    running = start_scheduler(testbed)
    make_claim(kube, namespace, "theirs", [request("g", selectors=[f"{ATTR}.index == 6"])])
    claim_pod(kube, namespace, "theirs", claim="theirs", scheduler=None)   # the stock kube-scheduler's
    pod = wait_for("kube-scheduler binds it", partial(placed, kube, namespace, "theirs"), 60)
    node = pod["spec"]["nodeName"]
    assert [r["device"] for r in results(get_claim(kube, namespace, "theirs"))] == ["gpu-6"]
    engine = running.scheduler.engine
    assert engine is not None

    def held() -> list[tuple[str, tuple[int, ...]]]:
        return [(a.node, tuple(a.gpu_indices)) for a in engine.book.allocations.values()
                if a.name.startswith(f"claim:{namespace}/theirs")]
    assert wait_for("kubecell holds the claim's GPU", held) == [(node, (6,))]
    make_claim(kube, namespace, "same-gpu", [request("g", selectors=[f"{ATTR}.index == 6"])])
    claim_pod(kube, namespace, "same-gpu", claim="same-gpu",
              annotations={})
    time.sleep(3.0)
    mine = get_pod(kube, namespace, "same-gpu")
    assert mine["spec"].get("nodeName") != node, "GPU 6 of that node was given twice"
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/theirs", gracePeriodSeconds=0)
    wait_for("the hold released once the controller deallocates the claim", lambda: not held(), 60)


def test_a_restarted_scheduler_restores_claim_pods_from_their_records(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    first = start_scheduler(testbed)
    make_template(kube, namespace, "two", [request("gpus", count=2)])
    make_claim(kube, namespace, "quarter", [request("g", dra_names.CLASS_GPU_SHARE, capacity={"compute": "250"})])
    claim_pod(kube, namespace, "whole", template="two")
    claim_pod(kube, namespace, "share", claim="quarter")
    before = {name: recorded(wait_for(f"{name} bound", partial(placed, kube, namespace, name)))
              for name in ("whole", "share")}
    first.close()
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    restored = sorted((a.node, sorted(a.gpu_indices)) for job in engine.running.values() for a in
                      (engine.book.allocations[m] for m in job.running_members) if job.name.startswith(namespace))
    assert restored == sorted((node, sorted(index for index, _, _, _ in gpus)) for node, gpus in before.values())
    assert not any(a.name.startswith("external:") and namespace in a.name for a in engine.book.allocations.values())
    assert not [e for name in ("whole", "share") for e in events_of(kube, namespace, name) if "does not use" in e]
    for name in ("whole", "share"):
        pod = get_pod(kube, namespace, name)
        assert claimed_devices(kube, pod)[1] == sorted(f"gpu-{i}" for i, _, _, _ in before[name][1])


def test_a_slice_published_for_another_node_is_left_out_and_told(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dra_nodes: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    """A slice naming a node that does not own it (an agent publishing for a node not its own): its devices
    are never allocated, and the slice gets a Warning Event saying why."""
    (victim,) = gpu_nodes(kube, 1, skip=len(dra_nodes))   # a node without slices of its own
    running = start_scheduler(testbed)
    with published(kube, [victim]) as (forged,):
        owner = kube.get(f"/api/v1/nodes/{dra_nodes[0]}")["metadata"]
        forged["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": owner["name"],
                                                   "uid": owner["uid"]}]
        kube.replace(f"/apis/resource.k8s.io/v1/resourceslices/{forged['metadata']['name']}", forged)

        def told() -> list[str]:
            return [e["message"] for e in kube.get("/api/v1/namespaces/default/events")["items"]
                    if e.get("reason") == "UntrustedResourceSlice"
                    and e["involvedObject"].get("name") == forged["metadata"]["name"]]
        make_claim(kube, namespace, "there", [request("g", selectors=[f"{ATTR}.index == 3"])])
        claim_pod(kube, namespace, "there", claim="there")
        pod = wait_for("the claim placed on a trusted node", partial(placed, kube, namespace, "there"))
        assert pod["spec"]["nodeName"] in dra_nodes
        (message,) = wait_for("a Warning Event on the forged slice", told)
        assert "is not the Node that owns it" in message
        state = running.scheduler.state
        assert state is not None
        assert not [d for d in running.scheduler.claims.devices(state.views).listed if d.node == victim]
