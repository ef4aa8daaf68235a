"""kubecell's elastic sizing policy: a table of situations and what it must decide."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from kubecell.core.elastic.allocator import ElasticOptions, KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from kubecell.core.elastic.valuation import GpuPool, candidate_sizes, las_level
from kubecell.core.errors import InvalidInputError
from tests.core.elastic.support import TableGoodput, known_job, view

T4 = [ClusterNode(f"t4-{i}", "t4", 4) for i in range(2)]
A100 = [ClusterNode(f"a100-{i}", "a100", 8) for i in range(2)]
MIXED = T4 + A100


def check(decision: Mapping[str, tuple[str, ...]], jobs: Sequence[ElasticJobView],
          nodes: Sequence[ClusterNode]) -> None:
    """The policy's contract: every job answered, sizes within bounds, one type, node capacity."""
    kind = {n.name: n.gpu_type for n in nodes}
    gpus = {n.name: n.gpus for n in nodes}
    assert set(decision) == {j.name for j in jobs}
    for job in jobs:
        given = decision[job.name]
        if given:
            assert max(1, job.min_replicas) <= len(given) <= job.max_replicas
            assert len({kind[n] for n in given}) == 1
            if job.gpu_types is not None:
                assert kind[given[0]] in job.gpu_types
    used = Counter(n for given in decision.values() for n in given)
    assert all(used[n] <= gpus[n] for n in used)


def test_one_job_grows_on_one_node() -> None:
    jobs = [view("a", known_job({"a100": 3.0, "t4": 1.0}))]
    policy = KubecellElasticPolicy()
    decision = policy.allocate(0.0, jobs, MIXED)
    check(decision, jobs, MIXED)
    assert set(decision["a"]) == {"a100-0"}
    assert len(decision["a"]) == 8
    assert policy.last_reasons["a"].startswith("started 8 a100")


def test_min_and_max_replicas_are_respected() -> None:
    jobs = [view("small", TableGoodput({"a100": 1.0}, 1.0), max_replicas=3),
            view("big", TableGoodput({"a100": 1.0}, 1.0), min_replicas=6, max_replicas=6)]
    decision = KubecellElasticPolicy().allocate(0.0, jobs, A100)
    check(decision, jobs, A100)
    assert len(decision["small"]) == 3
    assert len(decision["big"]) == 6


def test_too_large_a_minimum_queues_with_a_reason() -> None:
    jobs = [view("huge", TableGoodput({"a100": 1.0}), min_replicas=40)]
    policy = KubecellElasticPolicy()
    assert policy.allocate(0.0, jobs, A100) == {"huge": ()}
    assert policy.last_reasons["huge"].startswith("queued")


def test_allowed_gpu_types_are_respected() -> None:
    jobs = [view("a", TableGoodput({"a100": 3.0, "t4": 1.0}), gpu_types=frozenset({"t4"}))]
    decision = KubecellElasticPolicy().allocate(0.0, jobs, MIXED)
    check(decision, jobs, MIXED)
    assert decision["a"]
    assert all(n.startswith("t4") for n in decision["a"])


def test_comparative_advantage_sends_each_job_to_its_type() -> None:
    # Both are faster on A100, but "vision" gains 6x there and "speech" 1.2x: speech takes the T4s.
    jobs = [view("speech", TableGoodput({"a100": 1.2, "t4": 1.0}), max_replicas=4),
            view("vision", TableGoodput({"a100": 6.0, "t4": 1.0}), max_replicas=8)]
    nodes = [ClusterNode("t4-0", "t4", 4), ClusterNode("a100-0", "a100", 8)]
    decision = KubecellElasticPolicy().allocate(0.0, jobs, nodes)
    check(decision, jobs, nodes)
    assert set(decision["speech"]) == {"t4-0"}
    assert set(decision["vision"]) == {"a100-0"}


def test_unchanged_world_keeps_allocations_without_restart() -> None:
    jobs = [view(f"j{i}", known_job({"a100": 3.0, "t4": 1.0}), submitted=float(i)) for i in range(5)]
    policy = KubecellElasticPolicy()
    first = policy.allocate(0.0, jobs, MIXED)
    check(first, jobs, MIXED)
    later = [view(j.name, j.estimate, current=first[j.name], submitted=j.submitted, last_resize=0.0,
                  attained=600.0 * len(first[j.name])) for j in jobs]
    for now in (600.0, 1200.0):
        again = policy.allocate(now, later, MIXED)
        assert again == first
        assert all(r.startswith("kept") for r in policy.last_reasons.values())


def test_recently_resized_job_is_locked() -> None:
    estimate = TableGoodput({"a100": 1.0}, 1.0)
    running = view("old", estimate, current=["a100-0"] * 8 + ["a100-1"] * 8, last_resize=100.0, attained=1e6)
    waiting = view("new", estimate, submitted=150.0)
    policy = KubecellElasticPolicy(ElasticOptions(min_resize_seconds=300.0))
    decision = policy.allocate(200.0, [running, waiting], A100)
    assert decision["old"] == running.current
    assert decision["new"] == ()
    assert "minimum interval 300 s" in policy.last_reasons["old"]
    later = policy.allocate(500.0, [running, waiting], A100)
    assert later["new"]
    assert 0 < len(later["old"]) < 16


def test_large_job_shrinks_to_admit_a_waiting_one() -> None:
    estimate = TableGoodput({"a100": 1.0}, 0.9)
    running = view("old", estimate, current=["a100-0"] * 8 + ["a100-1"] * 8, last_resize=0.0, attained=3600.0)
    waiting = view("new", estimate, submitted=1000.0)
    policy = KubecellElasticPolicy()
    decision = policy.allocate(2000.0, [running, waiting], A100)
    check(decision, [running, waiting], A100)
    assert decision["new"]
    assert 0 < len(decision["old"]) < 16
    assert policy.last_reasons["old"].startswith("shrunk 16->")


def test_small_gain_is_not_worth_a_restart() -> None:
    # Going from 8 to 16 GPUs adds 2 %: not worth a 300 s restart over a 1800 s horizon.
    class Flat(TableGoodput):
        def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
            return min(num_replicas, 8) + 0.02 * max(num_replicas - 8, 0) / 8 * 8 if num_replicas else 0.0

    job = view("a", Flat({"a100": 1.0}), current=["a100-0"] * 8, last_resize=0.0, restart=300.0)
    policy = KubecellElasticPolicy(ElasticOptions(min_marginal_efficiency=0.0))
    decision = policy.allocate(5000.0, [job], A100)
    assert decision["a"] == job.current
    assert "restart would cost 300 s" in policy.last_reasons["a"]


def test_least_attained_service_goes_first_when_full() -> None:
    estimate = TableGoodput({"a100": 1.0}, 1.0)
    jobs = [view(f"j{i}", estimate, min_replicas=8, max_replicas=8, attained=float(1000 * (3 - i)),
                 submitted=float(i)) for i in range(3)]
    decision = KubecellElasticPolicy().allocate(0.0, jobs, A100)
    assert decision["j0"] == ()
    assert decision["j1"]
    assert decision["j2"]


def test_running_job_is_not_preempted_by_one_that_merely_caught_up() -> None:
    estimate = TableGoodput({"a100": 1.0}, 1.0)
    running = view("run", estimate, min_replicas=16, max_replicas=16, current=["a100-0"] * 8 + ["a100-1"] * 8,
                   last_resize=0.0, attained=2000.0)
    waiting = view("wait", estimate, min_replicas=16, max_replicas=16, attained=1000.0)
    decision = KubecellElasticPolicy(ElasticOptions(keep_bias=4.0)).allocate(5000.0, [running, waiting], A100)
    assert decision["run"] == running.current
    assert decision["wait"] == ()


def test_lost_node_forces_a_new_allocation() -> None:
    estimate = TableGoodput({"a100": 1.0}, 1.0)
    job = view("a", estimate, current=["gone"] * 4, last_resize=100.0)
    decision = KubecellElasticPolicy().allocate(150.0, [job], A100)
    check(decision, [job], A100)
    assert decision["a"]
    assert "gone" not in decision["a"]


def test_job_with_unknown_goodput_is_still_started() -> None:
    jobs = [view("blank", TableGoodput({}))]
    policy = KubecellElasticPolicy()
    decision = policy.allocate(0.0, jobs, MIXED)
    assert len(decision["blank"]) == 1
    assert "exploring" in policy.last_reasons["blank"]


def test_duplicate_names_are_refused() -> None:
    estimate = TableGoodput({"a100": 1.0})
    with pytest.raises(InvalidInputError, match="share a name"):
        KubecellElasticPolicy().allocate(0.0, [view("a", estimate), view("a", estimate)], A100)
    with pytest.raises(InvalidInputError, match="listed twice"):
        KubecellElasticPolicy().allocate(0.0, [view("a", estimate)], A100 + A100[:1])


@pytest.mark.parametrize("field", ["restart_horizon", "keep_bias", "las_halving_gpu_seconds"])
def test_options_out_of_range_are_refused(field: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        ElasticOptions(**{field: 0.0})  # type: ignore[arg-type]
    assert error.value.field == field


def test_decides_160_jobs_on_64_gpus() -> None:
    """Its contract holds at Sia's scale, round after round (how long a round takes: bench/elastic_allocator.py)."""
    nodes = ([ClusterNode(f"t4-{i}", "t4", 4) for i in range(6)] + [ClusterNode(f"rtx-{i}", "rtx", 8) for i in range(3)]
             + A100)
    models = [known_job({"t4": 1.0, "rtx": 1.5, "a100": 3.0 + i % 3}) for i in range(6)]
    jobs = [view(f"j{i}", models[i % 6], submitted=float(i), attained=float(37 * i)) for i in range(160)]
    policy = KubecellElasticPolicy()
    first = policy.allocate(0.0, jobs, nodes)
    check(first, jobs, nodes)
    assert sum(1 for placed in first.values() if placed) > 0
    for round_ in range(1, 4):
        check(policy.allocate(60.0 * round_, jobs, nodes), jobs, nodes)


def test_las_levels_double_and_stop_at_the_last() -> None:
    assert [las_level(h * 3600.0, 3600.0, 4) for h in (0, 0.9, 1, 2.9, 3, 7, 100)] == [0, 0, 1, 1, 2, 3, 3]
    assert las_level(1e9, 3600.0, 1) == 0


def test_candidate_sizes_pack_onto_nodes() -> None:
    pool = GpuPool("a100", [], per_node=8, capacity=24)
    assert candidate_sizes(pool, 1, 64, 0).tolist() == [1, 2, 4, 8, 16, 24]
    assert candidate_sizes(pool, 3, 20, 6).tolist() == [3, 4, 6, 8, 16, 20]
    assert candidate_sizes(pool, 30, 64, 0).size == 0


def test_fifo_among_long_jobs() -> None:
    nodes = [ClusterNode(f"t4-{i}", "t4", 4) for i in range(6)]
    old = [view(f"big{i}", TableGoodput({"t4": 1.0}, 0.9), submitted=float(i), attained=1e6) for i in range(2)]
    decision = KubecellElasticPolicy().allocate(0.0, old, nodes)
    assert len(decision["big0"]) > len(decision["big1"]) > 0
    fair = KubecellElasticPolicy(ElasticOptions(fifo_decay=1.0)).allocate(0.0, old, nodes)
    assert len(fair["big0"]) == len(fair["big1"])


def test_restarts_are_counted_and_make_changes_dearer() -> None:
    estimate = TableGoodput({"a100": 1.0}, 0.9)
    policy = KubecellElasticPolicy()
    holdings = [["a100-0"] * 2, ["a100-0"] * 4, ["a100-1"] * 4, ["a100-1"] * 8]
    for step, held in enumerate(holdings):
        policy.allocate(600.0 * step, [view("a", estimate, current=held, last_resize=0.0)], A100)
    assert policy.restarts("a") == 3
    young = policy._restart_discount(600.0, view("b", estimate, restart=100.0))
    worn = policy._restart_discount(1800.0, view("a", estimate, restart=100.0))
    assert worn < young


def test_a_full_cluster_puts_a_price_on_gpus() -> None:
    estimate = TableGoodput({"a100": 1.0}, 0.9)
    policy = KubecellElasticPolicy()
    policy.allocate(0.0, [view(f"j{i}", estimate, max_replicas=16) for i in range(4)], A100)
    assert policy.prices["a100"] > 0
    idle = KubecellElasticPolicy()
    idle.allocate(0.0, [view("j", estimate, max_replicas=2)], A100)
    assert idle.prices["a100"] == 0
