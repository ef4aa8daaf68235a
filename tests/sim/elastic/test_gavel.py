"""Gavel+TunedJobs as Sia runs it: the max-sum-throughput allocation, its round-based time-slicing, placement
on GPU slots, the simulator's 6-minute rounds and Sia's restart charging, and a data-backed run."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from kubecell.core.elastic.types import ClusterNode, ElasticJobView, ElasticPolicy
from kubecell.sim.elastic.cluster import kinds_of, sia64
from kubecell.sim.elastic.gavel import GavelPolicy, max_sum_throughput, packed
from kubecell.sim.elastic.metrics import run_metrics
from kubecell.sim.elastic.policies import POLICIES, PolicySpec, parse_policies
from kubecell.sim.elastic.runner import load_inputs, load_models
from kubecell.sim.elastic.simulator import simulate
from kubecell.sim.elastic.workload import load_workload
from tests.sim.elastic.support import sia_file, write_models, write_workload


class Speed:
    """A goodput estimate that only knows a speed per GPU type (what the policy falls back on outside the
    simulator's oracle)."""

    def __init__(self, speeds: Mapping[str, float]) -> None:
        self.speeds = speeds

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return self.speeds.get(gpu_type, 0.0)


def view(name: str, size: int, current: tuple[str, ...] = (), speeds: Mapping[str, float] | None = None,
         submitted: float = 0.0) -> ElasticJobView:
    return ElasticJobView(name=name, submitted=submitted, min_replicas=size, max_replicas=size, current=current,
                          last_resize=None, attained_gpu_seconds=0.0, restart_seconds=30.0,
                          estimate=Speed(speeds or {"a100": 1.0, "t4": 1.0}))


# ---------------------------------------------------------------------------------------------------- the LP

def test_max_sum_throughput_hand_case() -> None:
    # Two types of 8 GPUs. Per GPU, job 0 is worth 0.5 on A and 0.125 on B, job 1 0.25 / 0.1875, job 2 (4 GPUs)
    # 0.25 / 0.25. Job 0 gains most from A and takes all of it; B goes to job 2 (4 GPUs) and half of job 1.
    table = np.array([[4.0, 1.0], [2.0, 1.5], [1.0, 1.0]])
    x = max_sum_throughput(table, np.array([8.0, 8.0, 4.0]), np.array([8.0, 8.0]))
    assert x.tolist() == [[1.0, 0.0], [0.0, 0.5], [0.0, 1.0]]
    assert float((table * x).sum()) == pytest.approx(5.75)


def test_identical_jobs_get_identical_shares() -> None:
    # Three identical jobs that each need the whole 8-GPU type (and would crawl on the other): a third each,
    # rounded to 5 decimals as Sia rounds ECOS's answer; the fourth job is alone on its best type.
    table = np.array([[3.0, 0.1], [3.0, 0.1], [3.0, 0.1], [0.5, 2.0]])
    x = max_sum_throughput(table, np.array([8.0, 8.0, 8.0, 4.0]), np.array([8.0, 4.0]))
    assert x[:3, 0].tolist() == [0.33333] * 3
    assert x[3].tolist() == [0.0, 1.0]
    assert x[:3, 1].tolist() == [0.0] * 3


@pytest.mark.parametrize("seed", range(12))
def test_max_sum_throughput_is_optimal_on_small_cases(seed: int) -> None:
    """Feasible, and at least as good as every point of a fine grid (two jobs, two types)."""
    rnd = np.random.default_rng(seed)
    table = rnd.uniform(0.1, 5.0, size=(2, 2))
    sizes = rnd.choice([1.0, 2.0, 4.0, 8.0], size=2)
    capacity = rnd.choice([2.0, 4.0, 8.0], size=2)
    x = max_sum_throughput(table, sizes, capacity)
    assert (x >= 0).all()
    assert (x.sum(axis=1) <= 1 + 1e-9).all()
    assert ((sizes[:, None] * x).sum(axis=0) <= capacity + 1e-4).all()
    steps = np.linspace(0.0, 1.0, 41)
    grid = np.array(list(itertools.product(steps, repeat=4))).reshape(-1, 2, 2)
    ok = (grid.sum(axis=2) <= 1 + 1e-12).all(axis=1) & \
         ((sizes[None, :, None] * grid).sum(axis=1) <= capacity[None, :] + 1e-12).all(axis=1)
    best = float((grid[ok] * table[None]).sum(axis=(1, 2)).max())
    assert float((table * x).sum()) >= best - 1e-3


# ---------------------------------------------------------------------------------------------------- rounds

def run_rounds(policy: GavelPolicy, jobs: list[ElasticJobView], nodes: Sequence[ClusterNode],
               rounds: int) -> list[dict[str, tuple[str, ...]]]:
    """Call the policy round after round, each time with what it decided the round before."""
    held: dict[str, tuple[str, ...]] = {job.name: job.current for job in jobs}
    seen = []
    for index in range(rounds):
        views = [ElasticJobView(name=j.name, submitted=j.submitted, min_replicas=j.min_replicas,
                                max_replicas=j.max_replicas, current=held[j.name], last_resize=None,
                                attained_gpu_seconds=0.0, restart_seconds=j.restart_seconds, estimate=j.estimate)
                 for j in jobs]
        decision = dict(policy.allocate(360.0 * index, views, nodes))
        used = Counter(node for nodes_ in decision.values() for node in nodes_)
        gpus = {node.name: node.gpus for node in nodes}
        assert all(count <= gpus[node] for node, count in used.items()), used
        held.update(decision)
        seen.append(decision)
    return seen


def test_jobs_are_time_sliced_round_robin() -> None:
    nodes = (ClusterNode("a100-0", "a100", 8),)
    jobs = [view(f"j{i}", 8) for i in range(3)]
    seen = run_rounds(GavelPolicy(), jobs, nodes, 6)
    running = [[name for name, given in decision.items() if given] for decision in seen]
    assert running == [["j0"], ["j1"], ["j2"], ["j0"], ["j1"], ["j2"]]
    assert seen[0]["j0"] == ("a100-0",) * 8


def test_fast_iterating_jobs_take_the_fast_type() -> None:
    # Max *sum* of iterations per second: the job with the larger gain from A100 gets it, whatever its age.
    nodes = (ClusterNode("t4-0", "t4", 4), ClusterNode("a100-0", "a100", 8))
    old = view("old", 4, speeds={"t4": 1.0, "a100": 2.0}, submitted=0.0)
    fast = view("fast", 4, speeds={"t4": 1.0, "a100": 9.0}, submitted=100.0)
    other = view("other", 8, speeds={"t4": 0.5, "a100": 3.0}, submitted=50.0)
    decision = GavelPolicy().allocate(360.0, [old, other, fast], nodes)
    assert decision["fast"] == ("a100-0",) * 4
    assert {decision["old"], decision["other"]} == {("t4-0",) * 4, ()}


def test_keeps_its_gpus_or_takes_the_next_free_ones() -> None:
    # A running 4-GPU job keeps its very GPUs; a new one takes the next free ones in node order.
    nodes = (ClusterNode("t4-0", "t4", 4), ClusterNode("t4-1", "t4", 4))
    jobs = [view("a", 4, current=("t4-1",) * 4), view("b", 4)]
    decision = GavelPolicy().allocate(0.0, jobs, nodes)
    assert decision == {"a": ("t4-1",) * 4, "b": ("t4-0",) * 4}


def test_random_rounds_never_overfill_a_node() -> None:
    nodes = sia64()
    rnd = random.Random(5)
    policy = GavelPolicy()
    held: dict[str, tuple[str, ...]] = {}
    jobs: dict[str, ElasticJobView] = {}
    gpus = {node.name: node.gpus for node in nodes}
    kinds = {node.name: node.gpu_type for node in nodes}
    for index in range(80):
        for _ in range(rnd.randint(0, 3)):
            name = f"j{len(jobs)}"
            speeds = {"t4": rnd.uniform(0.2, 1), "rtx2080ti": rnd.uniform(0.5, 2), "a100": rnd.uniform(1, 4)}
            jobs[name] = view(name, rnd.choice([1, 2, 3, 4, 6, 8, 12, 16]), speeds=speeds)
            held[name] = ()
        for name in [n for n in jobs if rnd.random() < 0.08]:
            del jobs[name], held[name]
        views = [ElasticJobView(name=j.name, submitted=j.submitted, min_replicas=j.min_replicas,
                                max_replicas=j.max_replicas, current=held[j.name], last_resize=None,
                                attained_gpu_seconds=0.0, restart_seconds=30.0, estimate=j.estimate)
                 for j in jobs.values()]
        decision = policy.allocate(360.0 * index, views, nodes)
        assert set(decision) == set(jobs)
        used = Counter(node for given in decision.values() for node in given)
        assert all(count <= gpus[node] for node, count in used.items())
        for name, given in decision.items():
            assert not given or (len(given) == jobs[name].max_replicas and len({kinds[n] for n in given}) == 1)
        free = {kind: sum(gpus[n] for n in gpus if kinds[n] == kind) for kind in set(kinds.values())}
        for given in decision.values():
            if given:
                free[kinds[given[0]]] -= len(given)
        waiting = [jobs[name].max_replicas for name, given in decision.items() if not given]
        assert all(size > max(free.values()) for size in waiting), "a job waits where its type has room"
        held.update(decision)


def test_packed() -> None:
    assert packed(10, 4) == (4, 4, 2)
    assert packed(8, 8) == (8,)
    assert packed(6, 8) == (6,)


# ---------------------------------------------------------------------------------------------------- simulator

def test_registry() -> None:
    spec = POLICIES["gavel"]
    assert (spec.tuned_jobs, spec.estimate, spec.round_seconds, spec.restart_on_move) == (True, "oracle", 360.0,
                                                                                          False)
    assert [s.name for s in parse_policies("rigid,GAVEL")] == ["rigid", "gavel"]
    assert POLICIES["rigid"].round_seconds is None
    assert POLICIES["rigid"].restart_on_move


LONG_VALIDATION = {  # the synthetic curves of support.py, 20 times the progress: jobs of several rounds
    "validation-32.csv": "progress,iteration,metric,grad_sqr,grad_var\n2000,100,0.5,1.0,3.0\n4000,200,0.9,1.0,1.0\n",
    "validation-128.csv": "progress,iteration,metric,grad_sqr,grad_var\n2020,30,0.5,1.0,5.0\n4040,60,0.9,1.0,1.0\n",
}
NODES = (ClusterNode("t4-0", "t4", 4), ClusterNode("t4-1", "t4", 4), ClusterNode("a100-0", "a100", 8))


def test_simulated_gavel_time_slices_and_restarts(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    for name, text in LONG_VALIDATION.items():
        (models / "cifar10" / name).write_text(text)
    rows = "".join(f"cifar10-{i},{i * 30},cifar10,{(2, 4)[i % 2]},128\n" for i in range(12))
    workload = load_workload(write_workload(tmp_path, rows), ("cifar10",))
    apps = load_models(models, ["cifar10"], kinds_of(NODES))
    result = simulate(workload, apps, NODES, POLICIES["gavel"])
    assert all(r.completion is not None for r in result.records)
    assert all(sample.time % 360.0 == 0 for sample in result.samples)   # Gavel's 6-minute rounds
    assert all(0 <= sample.allocated_gpus <= 16 for sample in result.samples)
    assert any(sample.waiting_jobs > 0 and sample.running_jobs > 0 for sample in result.samples)
    assert sum(r.restarts for r in result.records) > 0                  # preempted and resumed
    for record in result.records:
        assert record.max_gpus == record.num_replicas                    # TunedJobs: never resized
        assert record.restart_gpu_seconds > 0


class Mover:
    """Puts its one job on t4-0, then on t4-1 (same type, same shape), then on both (another shape)."""

    name = "mover"

    def __init__(self) -> None:
        self.calls = 0

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        self.calls += 1
        where = {1: ("t4-0",) * 4, 2: ("t4-1",) * 4}.get(self.calls, ("t4-0", "t4-0", "t4-1", "t4-1"))
        return {job.name: where for job in jobs}


@pytest.mark.parametrize(("restart_on_move", "restarts"), [(True, 2), (False, 1)])
def test_same_shape_moves_restart_unless_the_policy_says_otherwise(tmp_path: Path, restart_on_move: bool,
                                                                    restarts: int) -> None:
    models = write_models(tmp_path)
    for name, text in LONG_VALIDATION.items():
        (models / "cifar10" / name).write_text(text)
    workload = load_workload(write_workload(tmp_path, "cifar10-0,0,cifar10,4,128\n"), ("cifar10",))
    apps = load_models(models, ["cifar10"], kinds_of(NODES))

    def make() -> ElasticPolicy:
        return Mover()

    spec = PolicySpec("mover", "moves", make, tuned_jobs=True, estimate="oracle", restart_on_move=restart_on_move)
    (record,) = simulate(workload, apps, NODES, spec).records
    assert record.restarts == restarts


# ---------------------------------------------------------------------------------------------------- data

@pytest.mark.shared_data
def test_gavel_on_philly_workload_1() -> None:
    inputs = load_inputs(sia_file("philly", "workload-1.csv"))
    (workload,) = inputs.workloads
    result = simulate(workload, inputs.apps, inputs.nodes, POLICIES["gavel"])
    assert all(r.completion is not None for r in result.records)
    assert all(r.max_gpus == r.num_replicas for r in result.records)
    assert all(0 <= sample.allocated_gpus <= 64 for sample in result.samples)
    imagenet = [r.restarts for r in result.records if r.application == "imagenet"]
    assert len(imagenet) == 4
    assert min(imagenet) > 100      # time-sliced (Sia's README: ~205 restarts per ImageNet job)
    figures = run_metrics(result)
    # measured when written (docs/elastic.md): 1.67 h avg JCT, 35.6 h makespan, 10.27 GPU h per job
    assert figures["avg_jct_hours"] == pytest.approx(1.67, abs=0.05)
    assert figures["makespan_hours"] == pytest.approx(35.6, abs=0.5)
    assert figures["gpu_hours_per_job"] == pytest.approx(10.27, abs=0.1)
