"""The round loop with any policy: GPUs are never oversubscribed, broken policy answers stop the run with a
clear error, rigid jobs are never resized, and every job finishes."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from kubecell.core.elastic.types import ClusterNode, ElasticJobView, ElasticPolicy
from kubecell.sim.elastic.applications import ApplicationModel
from kubecell.sim.elastic.cluster import kinds_of
from kubecell.sim.elastic.policies import POLICIES, PolicySpec, RigidPolicy
from kubecell.sim.elastic.runner import load_models
from kubecell.sim.elastic.simulator import SimulationError, simulate
from kubecell.sim.elastic.workload import Workload, load_workload
from tests.sim.elastic.support import write_models, write_workload

NODES = (ClusterNode("t4-0", "t4", 4), ClusterNode("t4-1", "t4", 4), ClusterNode("a100-0", "a100", 8))
GPUS = {node.name: node.gpus for node in NODES}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workload, dict[str, ApplicationModel]]:
    root = tmp_path_factory.mktemp("elastic")
    models = write_models(root)
    rnd = random.Random(7)
    rows = "".join(f"cifar10-{i},{i * 20},cifar10,{rnd.choice((1, 2, 4))},{rnd.choice((32, 64, 128))}\n"
                   for i in range(24))
    workload = load_workload(write_workload(root, rows), ("cifar10",))
    return workload, load_models(models, ["cifar10"], kinds_of(NODES))


class Watch:
    """Wraps a policy; checks what every call sees (held GPUs never above a node's) and records it."""

    def __init__(self, inner: ElasticPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.seen: list[dict[str, tuple[str, ...]]] = []

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        held = Counter(node for job in jobs for node in job.current)
        assert all(count <= GPUS[node] for node, count in held.items()), held
        self.seen.append({job.name: job.current for job in jobs})
        return self.inner.allocate(now, jobs, nodes)


class Shuffler:
    """Each round gives every job a random size in its bounds on a random GPU type, where free GPUs allow:
    a stress test of restarts, resizes and moves."""

    name = "shuffler"

    def __init__(self) -> None:
        self.random = random.Random(3)

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        free = {node.name: node.gpus for node in nodes}
        decision: dict[str, tuple[str, ...]] = {}
        for job in jobs:
            size = self.random.randint(job.min_replicas, job.max_replicas)
            gpu_type = self.random.choice(["t4", "a100"])
            chosen: list[str] = []
            for node in nodes:
                while node.gpu_type == gpu_type and free[node.name] > 0 and len(chosen) < size:
                    free[node.name] -= 1
                    chosen.append(node.name)
            if len(chosen) < size:
                for name in chosen:
                    free[name] += 1
                chosen = []
            decision[job.name] = tuple(chosen)
        return decision


def spec(make: Callable[[], ElasticPolicy], *, tuned: bool = False) -> PolicySpec:
    return PolicySpec("test", "a test policy", make, tuned_jobs=tuned, estimate="oracle")


def test_elastic_stress_conserves_gpus_and_finishes(setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    workload, apps = setup
    watch = Watch(Shuffler())
    result = simulate(workload, apps, NODES, spec(lambda: watch))
    assert all(r.completion is not None for r in result.records)
    assert sum(r.restarts for r in result.records) > 0
    assert all(0 <= s.allocated_gpus <= 16 for s in result.samples)
    assert len(watch.seen) > 3
    for record in result.records:
        assert record.completion is not None
        assert record.first_start is not None
        assert record.submitted <= record.first_start < record.completion


def test_rigid_never_resizes(setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    workload, apps = setup
    watch = Watch(RigidPolicy())
    result = simulate(workload, apps, NODES, spec(lambda: watch, tuned=True))
    sizes = {job.name: job.num_replicas for job in workload.jobs}
    first: dict[str, tuple[str, ...]] = {}
    for call in watch.seen:
        for name, current in call.items():
            if current:
                assert len(current) == sizes[name]
                assert first.setdefault(name, current) == current, f"{name} was moved or resized"
    for record in result.records:
        assert (record.restarts, record.max_gpus, record.completion is not None) == (0, record.num_replicas, True)


class Fixed:
    """Answers the same (broken) decision for the first job it sees."""

    name = "broken"

    def __init__(self, answer: Callable[[ElasticJobView], Mapping[str, tuple[str, ...]]]) -> None:
        self.answer = answer

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        return self.answer(jobs[0])


BROKEN = [
    (lambda job: {"ghost": ("t4-0",)}, "allocated 'ghost', which is not a waiting or running job"),
    (lambda job: {job.name: ("t4-9",)}, "on unknown node(s) t4-9"),
    (lambda job: {job.name: ("t4-0", "a100-0")}, "mixes GPU types ['a100', 't4']; a job runs on one type"),
    (lambda job: {job.name: ("t4-0",) * 5}, "given 5 replicas; it takes 1..4 (or none)"),
    (lambda job: {"cifar10-23": ("t4-0",)}, "allocated 'cifar10-23', which is not a waiting or running job"),
]


@pytest.mark.parametrize(("answer", "message"), BROKEN)
def test_broken_answers_stop_the_run(setup: tuple[Workload, dict[str, ApplicationModel]],
                                     answer: Callable[[ElasticJobView], Mapping[str, tuple[str, ...]]],
                                     message: str) -> None:
    workload, apps = setup
    with pytest.raises(SimulationError) as info:
        simulate(workload, apps, NODES, spec(lambda: Fixed(answer)))
    assert message in str(info.value)
    assert str(info.value).startswith("policy test at 0.02 h on tiny/workload-1: ")


class Greedy:
    """Puts every job on t4-0 with 3 replicas: the second job oversubscribes it."""

    name = "greedy"

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        return {job.name: ("t4-0",) * 3 for job in jobs}


def test_oversubscription_is_refused(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    workload = load_workload(write_workload(tmp_path, "a,0,cifar10,1,32\nb,0,cifar10,1,32\n"), ("cifar10",))
    apps = load_models(models, ["cifar10"], kinds_of(NODES))
    with pytest.raises(SimulationError, match="6 replicas on node t4-0, which has 4 GPUs \\(jobs a, b\\)"):
        simulate(workload, apps, NODES, spec(Greedy))


class Idle:
    name = "idle"

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        return {}


def test_a_policy_that_never_runs_anything_hits_the_time_limit(
        setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    workload, apps = setup
    with pytest.raises(SimulationError, match="24 of 24 jobs unfinished after 2 simulated hours; raise --max-hours"):
        simulate(workload, apps, NODES, spec(Idle), max_hours=2)


def test_rigid_job_larger_than_any_gpu_type(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    workload = load_workload(write_workload(tmp_path, "a,0,cifar10,9,128\n"), ("cifar10",))
    apps = load_models(models, ["cifar10"], kinds_of(NODES))
    with pytest.raises(SimulationError, match="job a of tiny/workload-1 asks for 9 GPUs; no GPU type"):
        simulate(workload, apps, NODES, POLICIES["rigid"])


def test_kubecell_policy_runs_every_job_to_completion(setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    if not POLICIES["kubecell"].available():
        pytest.skip("kubecell's elastic policy (core/elastic/allocator.py) is not in this build")
    workload, apps = setup
    result = simulate(workload, apps, NODES, POLICIES["kubecell"])
    assert all(r.completion is not None for r in result.records)
    assert all(0 <= s.allocated_gpus <= 16 for s in result.samples)


@pytest.mark.parametrize("name", ["kubecell-true-noise", "kubecell-oracle", "kubecell-allocator",
                                  "kubecell-no-moves"])
def test_diagnostic_runs_finish_every_job(setup: tuple[Workload, dict[str, ApplicationModel]], name: str) -> None:
    """The runs that split the online model's gap (bench/elastic_gap.py) and the two that tell what the engine
    and moves between types are worth drive their jobs to the end."""
    if not POLICIES[name].available():
        pytest.skip("kubecell's elastic policy (core/elastic/allocator.py) is not in this build")
    workload, apps = setup
    result = simulate(workload, apps, NODES, POLICIES[name])
    assert all(r.completion is not None for r in result.records)
    assert all(0 <= s.allocated_gpus <= 16 for s in result.samples)


def _types_held(watch: Watch) -> dict[str, list[set[str]]]:
    """Per job, the GPU types of what it held at each decision it ran in."""
    node_type = {node.name: node.gpu_type for node in NODES}
    types: dict[str, list[set[str]]] = {}
    for seen in watch.seen:
        for name, held in seen.items():
            if held:
                types.setdefault(name, []).append({node_type[node] for node in held})
    return types


def test_the_cluster_path_runs_each_job_on_one_type_at_a_time_and_moves_it_when_that_pays(
        setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    """``kubecell`` decides through the core engine as a cluster does: a job's members are always on one GPU type,
    jobs grow past their minimum as the engine binds what the allocator sized into its headroom (the engine's
    own reasons say so), and some job is moved to another type (a new engine job there, as new pods form a new
    gang on a cluster), with the allocator's reason."""
    if not POLICIES["kubecell"].available():
        pytest.skip("kubecell's elastic policy (core/elastic/allocator.py) is not in this build")
    from kubecell.sim.elastic.engine_policy import EngineSizedPolicy

    workload, apps = setup
    watch = Watch(EngineSizedPolicy())
    result = simulate(workload, apps, NODES, dataclasses.replace(POLICIES["kubecell"], make=lambda: watch))
    assert all(r.completion is not None for r in result.records)
    types = _types_held(watch)
    assert all(len(kinds) == 1 for held in types.values() for kinds in held), types
    moved = [name for name, held in types.items() if len({next(iter(kinds)) for kinds in held}) > 1]
    assert moved, "no job was moved to another GPU type"
    assert any(r.max_gpus > 1 for r in result.records), "some job grew past its minimum"
    assert isinstance(watch.inner, EngineSizedPolicy)
    engine = watch.inner.engine
    assert engine is not None
    assert any(name.endswith("#2") for name in engine.jobs), "a moved job is a new engine job"


def test_without_moves_each_job_keeps_the_type_it_was_given(
        setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    """``kubecell-no-moves`` (the diagnostic of what moves are worth) keeps every job on its first type."""
    from kubecell.sim.elastic.engine_policy import EngineSizedPolicy

    workload, apps = setup
    watch = Watch(EngineSizedPolicy(moves=False))
    result = simulate(workload, apps, NODES, dataclasses.replace(POLICIES["kubecell-no-moves"], make=lambda: watch))
    assert all(r.completion is not None for r in result.records)
    types = _types_held(watch)
    assert all(len(set.union(*held)) == 1 for held in types.values()), types


def test_true_noise_reads_the_validation_curves_and_learns_throughput(
        setup: tuple[Workload, dict[str, ApplicationModel]]) -> None:
    """``online-true-noise`` keeps learning the throughput from reports, but its noise is the truth at the
    job's epoch, whatever the reports say."""
    pytest.importorskip("kubecell.core.elastic.goodput")
    from kubecell.core.elastic.goodput import OnlineGoodput
    from kubecell.core.elastic.types import StepReport
    from kubecell.sim.elastic.estimates import online_estimate

    _, apps = setup
    app = apps["cifar10"]
    epoch = [0]
    model = online_estimate(app, kinds_of(NODES), true_noise_epoch=lambda: epoch[0])
    assert isinstance(model, OnlineGoodput)
    for e in (0, app.epochs // 2, app.epochs - 1):
        epoch[0] = e
        for size in (app.init_bsz, (app.init_bsz + app.max_bsz) / 2, app.max_bsz):
            sqr, var = app.grad_stats(size, e)
            assert model.noise.phi_at(size) == pytest.approx(var / sqr, rel=1e-12)
    before = model.noise.phi_at(app.init_bsz)
    assert model.observe(StepReport("t4", 1, 4, 32, 0.5, 0.1, grad_sqr=1.0, grad_var=1e6))
    assert model.noise.phi_at(app.init_bsz) == before      # a report's statistics change nothing
    assert model.max_observed_replicas("t4") == 4          # its times are learned


class HandOver:
    """Round 1: ``first`` gets the whole of one T4 node; round 2: it keeps half, ``second`` gets the half it gave
    up and ``third`` the other T4 node, idle; the same from then on."""

    name = "hand-over"

    def __init__(self) -> None:
        self.rounds = 0

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        self.rounds += 1
        names = {job.name for job in jobs}
        decision: dict[str, tuple[str, ...]] = {}
        if "first" in names:
            decision["first"] = ("t4-0",) * (4 if self.rounds == 1 else 2)
        if self.rounds > 1:
            decision.update({name: nodes_ for name, nodes_ in (("second", ("t4-0",) * 2),
                                                               ("third", ("t4-1",) * 4)) if name in names})
        return decision


@pytest.mark.parametrize("handover", [45.0, 150.0])
def test_a_gpu_given_up_reaches_the_next_job_only_after_the_handover(tmp_path: Path, handover: float) -> None:
    """A cluster deletes a shrunk job's workers with their grace period: the job given those GPUs waits for
    them; a job started on idle GPUs in the same round does not, and neither does the job that gave them."""
    models = write_models(tmp_path)
    rows = "first,0,cifar10,4,4096\nsecond,0,cifar10,2,4096\nthird,0,cifar10,4,4096\n"
    workload = load_workload(write_workload(tmp_path, rows), ("cifar10",))
    apps = load_models(models, ["cifar10"], kinds_of(NODES))
    runs = {seconds: {r.name: r for r in simulate(workload, apps, NODES, spec(HandOver),
                                                  handover_seconds=seconds).records}
            for seconds in (0.0, handover)}
    at_once, later = runs[0.0], runs[handover]
    assert at_once["first"].restarts == later["first"].restarts == 1    # shrunk 4 -> 2 in round 2
    assert later["second"].restart_gpu_seconds - at_once["second"].restart_gpu_seconds == pytest.approx(2 * handover)
    assert later["third"].restart_gpu_seconds == at_once["third"].restart_gpu_seconds
    assert later["first"].restart_gpu_seconds == at_once["first"].restart_gpu_seconds
    assert later["second"].completion is not None
    assert at_once["second"].completion is not None
    assert later["second"].completion > at_once["second"].completion


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_handover_that_is_not_a_duration_is_refused(setup: tuple[Workload, dict[str, ApplicationModel]],
                                                       seconds: float) -> None:
    workload, apps = setup
    with pytest.raises(SimulationError, match="handover_seconds"):
        simulate(workload, apps, NODES, spec(HandOver), handover_seconds=seconds)
