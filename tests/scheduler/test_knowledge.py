"""The scheduler takes what the job history knows of a pod's family into the engine's job: the expected run time
(for ``queue_order: shortest-expected``) and, for a share, the solo profile (for the co-location rule); a pod
with no history, or a gang of member groups, is submitted as before. The co-location rule then keeps two heavy
shares apart on the scheduler's own intake path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import JobKey, PairHistory, SoloProfile, SummedUtilThreshold, informed_by_pairs
from kubecell.kube.pods import counted_by_kubernetes
from kubecell.scheduler.knowledge import Knowledge
from tests.core.support import engine, make_nodes
from tests.scheduler.test_shrink_pods import Loop
from tests.scheduler.trust_support import pod_body


class Known:
    """Knowledge by pod name prefix (what a history would say of each family)."""

    def __init__(self, runs: Mapping[str, float], uses: Mapping[str, float],
                 shares: Mapping[str, int] | None = None, keyed: frozenset[str] = frozenset()) -> None:
        self.runs, self.uses, self.shares, self.keyed = runs, uses, shares or {}, keyed
        self.asked: list[str] = []

    def _family(self, pod: Mapping[str, Any]) -> str:
        name = str(pod["metadata"]["name"])
        self.asked.append(name)
        return name.split("-")[0]

    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        return self.runs.get(self._family(pod))

    def profile(self, pod: Mapping[str, Any]) -> SoloProfile | None:
        family = self._family(pod)
        util = self.uses.get(family)
        return None if util is None else SoloProfile(JobKey(family), util, util, 1000.0)

    def share_milli(self, pod: Mapping[str, Any]) -> int | None:
        return self.shares.get(self._family(pod))

    def family(self, pod: Mapping[str, Any]) -> JobKey | None:
        family = self._family(pod)
        return JobKey(family) if family in self.keyed else None


def share(name: str, milli: int = 400) -> dict[str, Any]:
    body = pod_body("ns", name, {"kubecell.io/gpu-milli": str(milli), "kubecell.io/gpu-memory": "1000"})
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="1970-01-01T00:00:00Z")
    body["status"] = {"phase": "Pending"}
    return body


def job_of(loop: Loop, pod: str) -> Any:
    (name,) = [n for n in loop.state.tracked if pod in n]
    return loop.state.engine.jobs[name]


def test_the_history_reaches_the_engine_job_and_a_pod_without_history_is_unchanged() -> None:
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}))
    known: Knowledge = Known({"bert": 1800.0}, {"bert": 70.0})
    loop.intake.knowledge = known
    loop.add(share("bert-0"), share("gpt-0"))
    bert, gpt = job_of(loop, "bert-0"), job_of(loop, "gpt-0")
    assert bert.spec.expected_seconds == 1800.0
    assert bert.spec.member.profile == SoloProfile(JobKey("bert"), 70.0, 70.0, 1000.0)
    assert gpt.spec.expected_seconds is None
    assert gpt.spec.member.profile is None


class Refusing(Known):
    """Knowledge whose answers for one family fail a check (rows made of what nodes wrote)."""

    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        if self._family(pod) == "bert":
            raise InvalidInputError("-60.0", location="job ns/bert-0", field="seconds")
        return super().expected_seconds(pod)


def test_knowledge_that_fails_a_check_leaves_the_pod_uninformed_and_scheduled() -> None:
    """An error of the knowledge once escaped the intake at every reconcile: nobody was scheduled."""
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}))
    loop.intake.knowledge = Refusing({"gpt": 60.0}, {})
    loop.add(share("bert-0"), share("gpt-0"))
    loop.cycle(1)
    bert, gpt = job_of(loop, "bert-0"), job_of(loop, "gpt-0")
    assert bert.spec.expected_seconds is None, "submitted as if no history were kept"
    assert gpt.spec.expected_seconds == 60.0
    assert {bert.name, gpt.name} <= set(loop.state.engine.running), "both placed"


def test_the_colocation_rule_keeps_heavy_shares_apart_on_the_intake_path() -> None:
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}, colocation=SummedUtilThreshold(100)))
    loop.intake.knowledge = Known({}, {"heavy": 70.0, "light": 20.0})
    loop.add(share("heavy-0"), share("heavy-1"), share("light-0"))
    loop.cycle(1)
    gpus = {pod: loop.state.engine.book.allocations[next(iter(job_of(loop, pod).running_members))].gpu_indices
            for pod in ("heavy-0", "heavy-1", "light-0")}
    assert gpus["heavy-0"] != gpus["heavy-1"], "70 % + 70 % is above the limit"
    assert gpus["light-0"] in (gpus["heavy-0"], gpus["heavy-1"]), "20 % fits beside either"


def labelled_share(name: str, fraction: str = "0.4") -> dict[str, Any]:
    """A share asked by KubeShare's labels: no extended resource, so nothing but kubecell counts it."""
    body = pod_body("ns", name, {}, labels={"sharedgpu/gpu_request": fraction,
                                            "sharedgpu/gpu_mem": str(1000 * 1024 * 1024)})
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="1970-01-01T00:00:00Z")
    body["status"] = {"phase": "Pending"}
    return body


def test_place_by_use_places_a_share_at_its_familys_need_never_above_what_it_asked() -> None:
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}))
    loop.intake.knowledge = Known({}, {}, {"idle": 150, "busy": 900})
    loop.add(labelled_share("idle-0"), labelled_share("busy-0"), labelled_share("new-0"))
    assert job_of(loop, "idle-0").spec.member.gpu_milli == 400, "off by default"
    loop.intake.place_by_use = True
    loop.add(labelled_share("idle-1"), labelled_share("busy-1"), labelled_share("new-1"))
    assert job_of(loop, "idle-1").spec.member.gpu_milli == 150
    assert job_of(loop, "idle-1").spec.member.gpu_memory_mib == 1000, "memory is never lowered"
    assert job_of(loop, "busy-1").spec.member.gpu_milli == 400, "the request is the limit"
    assert job_of(loop, "new-1").spec.member.gpu_milli == 400, "no advice: as asked"


def test_place_by_use_never_lowers_a_share_kubernetes_counts() -> None:
    """A share asked as ``kubecell.io/gpu-milli``: the kubelet hands the device plugin as many slots as the
    limit, and the node agent refuses more than the record grants, so a smaller grant would fail the pod; one
    asked through a ResourceClaim has its capacity recorded in the claim's allocation."""
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}))
    loop.intake.knowledge = Known({}, {}, {"idle": 150})
    loop.intake.place_by_use = True
    loop.add(share("idle-2", 400))
    assert job_of(loop, "idle-2").spec.member.gpu_milli == 400
    assert counted_by_kubernetes(share("idle-3", 400))
    assert counted_by_kubernetes({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
                                           "containers": [{"name": "main"}]}})
    assert not counted_by_kubernetes(labelled_share("idle-4"))
    init_only = labelled_share("idle-5")
    init_only["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    assert counted_by_kubernetes(init_only)


def test_known_pairs_decide_before_the_rule_on_the_intake_path() -> None:
    """What two families did when they last shared a GPU (``kubecell scheduler --history``: the profiler's pairs)
    outranks what their solo use predicts, both ways."""
    pairs = PairHistory()
    for own, partner, speed in (("mid", "other", 0.6), ("other", "mid", 1.0),
                                ("calm", "quiet", 1.0), ("quiet", "calm", 0.97)):
        pairs.observe(JobKey(own), JobKey(partner), speed, 3600.0)
    rule = informed_by_pairs(SummedUtilThreshold(100), pairs, 0.95)
    uses = {"mid": 40.0, "other": 40.0, "calm": 60.0, "quiet": 60.0}
    loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}, colocation=rule))
    loop.intake.knowledge = Known({}, uses)
    loop.add(share("mid-0"), share("other-0"))
    loop.cycle(1)
    gpus = {pod: loop.state.engine.book.allocations[next(iter(job_of(loop, pod).running_members))].gpu_indices
            for pod in ("mid-0", "other-0")}
    assert gpus["mid-0"] != gpus["other-0"], "40 % + 40 % fits the limit, but mid ran at 0.6x beside other"
    loop = Loop(engine(make_nodes(1, gpus=1), {"b": {"gpus": 1}}, colocation=rule))
    loop.intake.knowledge = Known({}, uses)
    loop.add(share("calm-0"), share("quiet-0"))
    loop.cycle(1)
    assert all(job_of(loop, pod).running_members for pod in ("calm-0", "quiet-0")), (
        "60 % + 60 % is above the limit, but neither lost anything beside the other: both run on the one GPU")


def test_known_pairs_decide_for_a_family_without_a_solo_profile_yet() -> None:
    """A family with fewer finished jobs than a solo profile needs, but observed beside another (the profiler
    keeps pairs from running jobs too): its request stands for its use, under its family's key, so the pair
    history decides as it would with a profile."""
    pairs = PairHistory()
    for own, partner, speed in (("mid", "other", 0.6), ("other", "mid", 1.0)):
        pairs.observe(JobKey(own), JobKey(partner), speed, 3600.0)
    rule = informed_by_pairs(SummedUtilThreshold(100), pairs, 0.95)
    for keyed, apart in ((frozenset({"mid", "other"}), True), (frozenset(), False)):
        loop = Loop(engine(make_nodes(1, gpus=2), {"b": {"gpus": 2}}, colocation=rule))
        loop.intake.knowledge = Known({}, {}, keyed=keyed)
        loop.add(share("mid-0"), share("other-0"))
        loop.cycle(1)
        gpus = {pod: loop.state.engine.book.allocations[next(iter(job_of(loop, pod).running_members))].gpu_indices
                for pod in ("mid-0", "other-0")}
        assert (gpus["mid-0"] != gpus["other-0"]) == apart, keyed
        if keyed:
            assert job_of(loop, "mid-0").spec.member.profile == SoloProfile(JobKey("mid"), 40.0, 40.0, 1000.0)
