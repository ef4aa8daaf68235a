"""Claims another scheduler (the stock kube-scheduler) allocated on kubecell's devices, held in kubecell's engine
exactly where they are (``ClaimBroker.hold_foreign``), with the real ``Mirror`` and the agent's own slices.

Each test fails on the code before its fix: a claim holding two shares of one GPU (two results, two share IDs)
asked the engine for two GPUs on one, which it refused, so the claim was held neither whole nor as a share and
kubecell gave the GPU away; and a claim read while its node's slice was away (the kubelet wipes a driver's
slices when it starts, a GPU leaves the slice for an XID) was looked at again only when the claim changed,
never when the slice came back: its GPU was given to kubecell's own pods."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase
from kubecell.core.engine.job_spec import JobSpec
from kubecell.core.model import Request
from kubecell.kube.inventory import NodeView
from kubecell.kube.inventory_schema import GpuRecord, NodeInventory
from kubecell.kube.rest import Kube
from kubecell.kube.watch import Event
from kubecell.node.dra.slices import node_slices
from kubecell.scheduler.claims import ClaimBroker
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes, whole

GPUS = 4
MEMORY_MIB = 32768


def not_ours(pod: Any) -> bool:
    return False


class Cluster:
    """One node of ``GPUS`` GPUs, its engine and views, a real Mirror and a broker on them."""

    def __init__(self) -> None:
        nodes = make_nodes(1, gpus=GPUS, prefix="n")
        self.engine: Engine = engine(nodes, {"a": {"gpus": GPUS}})
        self.views = {"n0": NodeView("n0", nodes[0], uuids=tuple(f"GPU-{i}" for i in range(GPUS)),
                                     source="inventory")}
        inventory = NodeInventory(gpus=[GpuRecord(index=i, uuid=f"GPU-{i}", model="V100M32", memory_mib=MEMORY_MIB)
                                        for i in range(GPUS)])
        self.slice = node_slices(inventory, "n0", "node-uid", 1)[0]
        self.slice["metadata"].update(uid="slice-uid", resourceVersion="1")
        self.mirror = Mirror()
        self.broker = ClaimBroker(self.mirror, cast(Kube, SimpleNamespace(create=lambda *a, **k: None)))
        self.state = Tracking(self.engine, self.views)

    def publish(self, *, without: tuple[str, ...] = (), version: str = "2") -> None:
        """The slice as the agent writes it, less the devices ``without`` (an XID took them out)."""
        body = copy.deepcopy(self.slice)
        body["spec"]["devices"] = [d for d in body["spec"]["devices"] if d["name"] not in without]
        body["metadata"]["resourceVersion"] = version
        self.mirror.apply(Event("resourceslices", "MODIFIED", obj=body))

    def reconcile(self) -> bool:
        """What ``Intake.reconcile`` does with the claims changed."""
        changed = self.mirror.take_claims_changed()
        return bool(changed) and self.broker.hold_foreign(self.state, changed, not_ours)

    def held(self) -> list[tuple[str, tuple[int, ...], int]]:
        """The claims' holds: (node, GPUs, milli-GPU of each)."""
        return [(a.node, tuple(a.gpu_indices), a.gpu_milli)
                for a in self.engine.book.allocations.values() if a.name.startswith("claim:")]

    def place(self, spec: JobSpec) -> JobPhase:
        self.engine.submit(spec, 0)
        self.engine.schedule(0)
        return self.engine.jobs[spec.name].phase


def result(device: str, request: str = "gpu", *, share: str | None = None, compute: str | None = None,
           memory: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": "gpu.kubecell.io", "pool": "n0", "device": device}
    if share is not None:
        out["shareID"] = share
    consumed = {k: v for k, v in (("compute", compute), ("memory", memory)) if v is not None}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def claim(name: str, results: list[dict[str, Any]], version: str = "5") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": version},
            "status": {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": f"pod-uid-{name}"}]}}


@pytest.fixture
def cluster() -> Cluster:
    found = Cluster()
    found.mirror.apply(Event("resourceslices", "SYNC", objects=(found.slice,)))
    return found


def share(name: str, milli: int) -> JobSpec:
    return JobSpec(name=name, vc="a", member=Request(name=name, gpu_count=1, gpu_milli=milli))


def test_two_shares_of_one_gpu_in_one_claim_are_held_as_their_sum(cluster: Cluster) -> None:
    """kube-scheduler gives one claim two shares of gpu-0 (two requests of 400 milli, two share IDs)."""
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("two", [
        result("gpu-0", "a", share="s1", compute="400", memory="4Gi"),
        result("gpu-0", "b", share="s2", compute="400", memory="2Gi")])))
    assert cluster.reconcile()
    assert cluster.state.external_claims == {"ns/two": "claim:ns/two@uid-two"}
    assert cluster.held() == [("n0", (0,), 800)]
    assert [a.gpu_memory_mib for a in cluster.engine.book.allocations.values()] == [6144]
    assert cluster.place(whole("rest", "a", GPUS - 1)) is JobPhase.RUNNING
    assert cluster.place(whole("one-more", "a", 1)) is not JobPhase.RUNNING, "gpu-0 is partly the claim's"
    assert cluster.place(share("big", 300)) is not JobPhase.RUNNING, "300 milli: more than gpu-0 has left"
    assert cluster.place(share("small", 200)) is JobPhase.RUNNING, "what the claim leaves of gpu-0 is free"
    assert cluster.engine.book.allocations["small/0"].gpu_indices == (0,)


@pytest.mark.parametrize(("results", "gpus"), [
    ([result("gpu-0", share="s1"), result("gpu-0", share="s2")], (0,)),
    ([result("gpu-0", "a", share="s1", compute="600"), result("gpu-0", "b", share="s2", compute="600")], (0,)),
    ([result("gpu-1", share="s1", compute="250"), result("gpu-2", share="s2", compute="250"),
      result("gpu-1", share="s3", compute="250")], (1, 2)),
    ([result("gpu-0"), result("gpu-3")], (0, 3)),
], ids=["one gpu whole under two share IDs", "shares past the whole gpu", "shares of two gpus", "two whole gpus"])
def test_gpus_a_claim_names_several_times_or_beside_others_are_held_whole_once_each(
        cluster: Cluster, results: list[dict[str, Any]], gpus: tuple[int, ...]) -> None:
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("c", results)))
    assert cluster.reconcile()
    assert cluster.held() == [("n0", gpus, 1000)]
    assert cluster.place(whole("mine", "a", GPUS - len(gpus) + 1)) is not JobPhase.RUNNING


def test_a_claim_read_while_its_slice_was_away_is_held_once_the_slice_is_back() -> None:
    """The scheduler (re)starts while the kubelet has wiped the driver's slices (it does when it starts): the
    claims are listed, the slices are not there yet. Before, the slice coming back looked at no claim."""
    cluster = Cluster()
    cluster.mirror.apply(Event("resourceclaims", "SYNC", objects=(claim("theirs", [result("gpu-0")]),)))
    cluster.mirror.apply(Event("resourceslices", "SYNC", objects=()))
    assert not cluster.reconcile()
    assert cluster.state.external_claims == {}
    cluster.mirror.apply(Event("resourceslices", "ADDED", obj=cluster.slice))
    assert cluster.reconcile()
    assert cluster.held() == [("n0", (0,), 1000)]
    assert cluster.place(whole("mine", "a", GPUS)) is not JobPhase.RUNNING, "gpu-0 is kube-scheduler's"
    assert cluster.mirror.claims_awaiting_devices == {}


def test_a_claim_whose_gpu_was_out_of_the_slice_is_held_on_it_once_it_is_back(cluster: Cluster) -> None:
    """An XID took gpu-1 out of the slice when the claim was read: it was held on gpu-0 alone, and still when
    gpu-1 came back (a hold was compared by its name only)."""
    cluster.publish(without=("gpu-1",))
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("two", [result("gpu-0"), result("gpu-1")])))
    assert cluster.reconcile()
    assert cluster.held() == [("n0", (0,), 1000)]
    cluster.publish(version="3")
    assert cluster.reconcile()
    assert cluster.held() == [("n0", (0, 1), 1000)]
    assert cluster.mirror.claims_awaiting_devices == {}
    assert cluster.place(whole("mine", "a", GPUS - 1)) is not JobPhase.RUNNING


def test_a_change_of_the_slices_looks_again_only_at_claims_waiting_for_devices(cluster: Cluster) -> None:
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("held", [result("gpu-0")])))
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("waiting", [result("gpu-9")])))
    cluster.reconcile()
    assert cluster.held() == [("n0", (0,), 1000)]
    assert list(cluster.mirror.claims_awaiting_devices) == ["ns/waiting"]
    cluster.publish(version="3")
    assert list(cluster.mirror.take_claims_changed()) == ["ns/waiting"]
    cluster.mirror.apply(Event("resourceclaims", "DELETED", obj=claim("waiting", [result("gpu-9")])))
    cluster.reconcile()
    assert cluster.mirror.claims_awaiting_devices == {}, "a deleted claim waits for nothing"
    cluster.publish(version="4")
    assert cluster.mirror.take_claims_changed() == {}


def test_a_claim_whose_new_devices_cannot_be_held_keeps_its_hold_where_it_was(cluster: Cluster) -> None:
    """gpu-1 came back to the slice while kubecell's pods run on it: the claim stays held on gpu-0 (before, a
    failed hold anew would have left it held nowhere)."""
    cluster.publish(without=("gpu-1",))
    cluster.mirror.apply(Event("resourceclaims", "ADDED", obj=claim("two", [result("gpu-0"), result("gpu-1")])))
    cluster.reconcile()
    assert cluster.place(whole("mine", "a", GPUS - 1)) is JobPhase.RUNNING
    cluster.publish(version="3")
    cluster.reconcile()
    assert cluster.held() == [("n0", (0,), 1000)]
    assert cluster.state.external_claims == {"ns/two": "claim:ns/two@uid-two"}
