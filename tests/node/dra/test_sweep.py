"""Claims the kubelet never unprepares (its state wiped, a pod force-deleted while it was down): each stayed in
the plugin's checkpoint for good, with its CDI spec and its GPU's MPS daemon held. The sweeper asks the API
about every prepared claim and releases one only after it has been seen unused for a whole grace period."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra import cdi
from kubecell.node.dra.checkpoint import ClaimRef, PreparedClaim
from kubecell.node.dra.sweep import ClaimSweeper
from tests.node.dra.test_cdi import NODE, Node, add_claim, result

GRACE = 600.0
CLAIM = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/share"
PODS = "/api/v1/pods"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node_pods(node: Node, *pods: dict[str, Any]) -> None:
    """The pods the API server lists on the node (the fake answers the LIST whatever its selector)."""
    node.fake.objects[PODS] = {"items": list(pods)}


def pod_naming(claim: str, *, templated: bool, phase: str = "Running") -> dict[str, Any]:
    if templated:
        return {"metadata": {"namespace": "ns", "name": "trainer"},
                "status": {"phase": phase, "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}
    return {"metadata": {"namespace": "ns", "name": "trainer"}, "status": {"phase": phase},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


def mps_node(tmp_path: Path) -> tuple[Node, ClaimRef, ClaimSweeper, Clock]:
    node = Node(tmp_path, modes=("accounting", "mps"))
    ref = add_claim(node.fake, "share", "uid-share", [result("gpu-2", share="s", consumed={"compute": "250"})])
    node.prepared(ref)
    node_pods(node)
    clock = Clock()
    return node, ref, ClaimSweeper(cast(Kube, node.fake), NODE, node.preparer, grace_seconds=GRACE,
                                   clock=clock), clock


def still_prepared(node: Node, ref: ClaimRef) -> bool:
    return ref.uid in node.preparer.checkpoint.claims and cdi.spec_path(node.directory / "cdi", ref.uid).is_file()


def test_a_deleted_claim_never_unprepared_is_released_after_the_grace_period(tmp_path: Path) -> None:
    node, ref, sweeper, clock = mps_node(tmp_path)
    del node.fake.objects[CLAIM]
    assert sweeper.sweep() == []
    clock.now += GRACE - 1
    assert sweeper.sweep() == [], "the kubelet's own unprepare has the grace period"
    assert still_prepared(node, ref)
    clock.now += 1
    assert sweeper.sweep() == [ref]
    assert not still_prepared(node, ref)
    assert node.released == [(node.uuid(2), ref.uid)], "its GPU's MPS daemon is held no more"
    assert json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())["claims"] == {}
    assert node.preparer.unprepare([ref]) == {ref.uid: ""}, "the kubelet's late unprepare still succeeds"


@pytest.mark.parametrize("change", ["replaced", "deallocated", "elsewhere"])
def test_a_claim_replaced_deallocated_or_allocated_elsewhere_is_unused(tmp_path: Path, change: str) -> None:
    node, ref, sweeper, clock = mps_node(tmp_path)
    if change == "replaced":
        add_claim(node.fake, "share", "uid-other", [result("gpu-2", share="s", consumed={"compute": "250"})])
    else:
        add_claim(node.fake, "share", ref.uid, None if change == "deallocated" else [result("gpu-2", pool="n2")])
    sweeper.sweep()
    clock.now += GRACE
    assert sweeper.sweep() == [ref]


def test_a_claim_in_use_is_never_released(tmp_path: Path) -> None:
    node, ref, sweeper, clock = mps_node(tmp_path)
    for _ in range(5):
        assert sweeper.sweep() == []
        clock.now += GRACE
    assert still_prepared(node, ref)


@pytest.mark.parametrize("templated", [True, False], ids=["from-a-template", "named"])
def test_a_claim_a_pod_on_the_node_names_is_in_use_and_not_asked_about(tmp_path: Path, templated: bool) -> None:
    """A node of many shares: a GET per prepared claim per sweep would cost the API server thousands of calls a
    minute over a cluster. The node's pods are listed once, and the claims they name are in use (the kubelet
    unprepares them when their pod is done), even where the claim's allocation is gone."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    node_pods(node, pod_naming("share", templated=templated))
    del node.fake.objects[CLAIM]
    for _ in range(3):
        assert sweeper.sweep() == []
        clock.now += GRACE
    assert sweeper.asked == 0
    assert still_prepared(node, ref)
    node_pods(node, pod_naming("other", templated=templated))
    sweeper.sweep()
    clock.now += GRACE
    assert sweeper.sweep() == [ref], "once no pod on the node names it, it is asked about"
    assert sweeper.asked == 2


def test_a_node_with_nothing_prepared_lists_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    sweeper = ClaimSweeper(cast(Kube, node.fake), NODE, node.preparer, grace_seconds=GRACE)
    node.fake.fail = ApiError(500, "InternalError", "must not be called")
    assert sweeper.sweep() == []


def test_no_answer_from_the_api_server_releases_nothing(tmp_path: Path) -> None:
    """An API server that is away, or forbids the read, says nothing about the claim: a sweeper that took an
    error for "gone" would pull the devices of every running pod on a node cut off from its control plane."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    for error in (ApiError(503, "ServiceUnavailable", "etcd"), ApiError(403, "Forbidden", "rbac")):
        node.fake.fail = error  # the pods' LIST fails
        for _ in range(3):
            assert sweeper.sweep() == []
            clock.now += GRACE
    node.fake.fail = None
    listed = node.fake.get

    def claims_refused(path: str, **query: Any) -> dict[str, Any]:
        if "/resourceclaims/" in path:
            raise ApiError(403, "Forbidden", "resourceclaims is forbidden")
        return listed(path, **query)

    node.fake.get = claims_refused  # type: ignore[method-assign]
    for _ in range(3):  # the pods are listed, the claim cannot be read
        assert sweeper.sweep() == []
        clock.now += GRACE
    assert sweeper.asked == 3
    assert still_prepared(node, ref)


def test_a_claim_seen_in_use_again_starts_its_grace_period_afresh(tmp_path: Path) -> None:
    """Deallocated, then allocated to this node again (same UID): the grace period counts unbroken sightings."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    allocated = node.fake.objects[CLAIM]["status"]["allocation"]["devices"]["results"]
    add_claim(node.fake, "share", ref.uid, None)
    sweeper.sweep()
    clock.now += GRACE - 10
    add_claim(node.fake, "share", ref.uid, allocated)
    assert sweeper.sweep() == []
    add_claim(node.fake, "share", ref.uid, None)
    clock.now += 20
    assert sweeper.sweep() == [], "unused again only 0 s ago"
    assert still_prepared(node, ref)


def test_a_claim_being_prepared_again_is_not_released(tmp_path: Path) -> None:
    node, ref, sweeper, clock = mps_node(tmp_path)
    del node.fake.objects[CLAIM]
    sweeper.sweep()
    clock.now += GRACE
    node.preparer._reading[ref.uid] = 1  # a prepare of it is reading the claim (the kubelet means it again)
    assert sweeper.sweep() == []
    assert still_prepared(node, ref)
    del node.preparer._reading[ref.uid]


def test_a_restarted_agent_sweeps_what_an_earlier_one_prepared(tmp_path: Path) -> None:
    node, ref, _, clock = mps_node(tmp_path)
    del node.fake.objects[CLAIM]
    preparer = node.restart()
    sweeper = ClaimSweeper(cast(Kube, node.fake), NODE, preparer, grace_seconds=GRACE, clock=clock)
    sweeper.sweep()
    clock.now += GRACE
    assert sweeper.sweep() == [ref]
    assert not cdi.spec_path(node.directory / "cdi", ref.uid).exists()


@pytest.mark.parametrize("status", [{"allocation": "x"}, {"allocation": {"devices": ["x"]}},
                                    {"allocation": {"devices": {"results": {"driver": "gpu.kubecell.io"}}}}, "x"])
def test_a_claim_of_any_shape_is_read_without_an_error(tmp_path: Path, status: Any) -> None:
    """The sweep runs on the agent's housekeeping thread, which also keeps the MPS daemons: a claim of a shape
    it did not expect holds no device of this node, and is never an exception."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    node.fake.objects[CLAIM]["status"] = status
    assert sweeper.sweep() == []
    clock.now += GRACE
    assert sweeper.sweep() == [ref]


def test_a_pod_naming_a_claim_made_again_under_its_name_does_not_keep_the_old_one(tmp_path: Path) -> None:
    """A pod names a claim by name. The claim was deleted while the kubelet could not unprepare it, and made
    again under its name for a pod on this node: that pod vouches for the new claim, not for the old one, whose
    hold would otherwise last as long as the new pod runs."""
    node, old, sweeper, clock = mps_node(tmp_path)
    new = add_claim(node.fake, "share", "uid-new", [result("gpu-3", share="t", consumed={"compute": "250"})])
    node.prepared(new)
    node_pods(node, pod_naming("share", templated=False))
    assert sweeper.sweep() == []
    clock.now += GRACE
    assert sweeper.sweep() == [old]
    assert not still_prepared(node, old)
    assert still_prepared(node, new)
    for _ in range(3):
        clock.now += GRACE
        assert sweeper.sweep() == [], "the claim the pod uses is kept"
    assert still_prepared(node, new)
    asked = sweeper.asked
    sweeper.sweep()
    assert sweeper.asked == asked, "once the name is one claim's again, the pod's naming it is enough"


def test_a_pending_pod_naming_a_claim_made_again_does_not_keep_the_old_one(tmp_path: Path) -> None:
    """The old claim of the name still holds the GPU share, so the new claim's prepare is refused and its pod
    stays Pending, naming the claim. Were that enough to call the old one in use, neither would ever move: the
    old one is asked about (another UID has its name) and released, and the new one then prepares."""
    node, old, sweeper, clock = mps_node(tmp_path)
    new = add_claim(node.fake, "share", "uid-new", [result("gpu-2", share="t", consumed={"compute": "900"})])
    assert not isinstance(node.preparer.prepare([new])[new.uid], PreparedClaim), "250 + 900 of one GPU"
    node_pods(node, pod_naming("share", templated=False, phase="Pending"))
    assert sweeper.sweep() == []
    clock.now += GRACE
    assert sweeper.sweep() == [old]
    node.prepared(new)
    assert still_prepared(node, new)
    for _ in range(3):
        clock.now += GRACE
        assert sweeper.sweep() == [], "the new claim, allocated here, is in use while its pod starts"
    asked = sweeper.asked
    node_pods(node, pod_naming("share", templated=False))
    sweeper.sweep()
    assert sweeper.asked == asked, "a pod that has started vouches for its claim without a GET"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_naming_its_claim_does_not_keep_it_prepared(tmp_path: Path, phase: str) -> None:
    """A pod that has finished runs nothing on its claim: the kubelet would have unprepared it, and where it never
    will (its state wiped), the claim (deallocated once the pod ended) held its GPU share and MPS daemon for as
    long as the finished pod's object was kept (a Job's pods are kept until the Job is deleted), and a claim
    allocated there meanwhile was refused. A finished pod vouches for nothing; its claim is asked about."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    node_pods(node, pod_naming("share", templated=True, phase=phase))
    add_claim(node.fake, "share", ref.uid, None)  # deallocated once its pod ended
    assert sweeper.sweep() == []
    clock.now += GRACE
    assert sweeper.sweep() == [ref]
    assert not still_prepared(node, ref)
    assert node.released == [(node.uuid(2), ref.uid)]


def test_a_finished_pod_naming_a_claim_still_allocated_here_does_not_release_it(tmp_path: Path) -> None:
    """Another pod on the node may still use the claim (a claim is shared by the pods that reserve it): while it
    is allocated in this node's pool, it is in use, whichever pod named it."""
    node, ref, sweeper, clock = mps_node(tmp_path)
    node_pods(node, pod_naming("share", templated=False, phase="Succeeded"))
    for _ in range(3):
        assert sweeper.sweep() == []
        clock.now += GRACE
    assert still_prepared(node, ref)
