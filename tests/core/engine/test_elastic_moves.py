"""``Engine.queries.room_on``: how many members an elastic gang could run with on another GPU model if it started there
now, giving up what it holds. Its driver moves a job to another model (or starts a waiting one there) only
into that room, so the count must be what a start there could really take: free GPUs of that model on the
nodes the job may use, within its class's budget counting its own members as given back; nothing inside
its resize interval, nothing for the model it already runs on, nothing for a gang a node or rack must hold."""

from __future__ import annotations

from collections import Counter

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.topology import CellForest
from tests.core.support import check_engine, engine, make_nodes, tenants

V100, A100 = "V100M32", "A100"


def two_models(*, guaranteed_nodes: dict[str, int] | None = None, interval: float = 0.0) -> Engine:
    """One 8-GPU V100 node and one 8-GPU A100 node; VC ``a`` guaranteed both nodes (or the given ones)."""
    nodes = make_nodes(1, model=V100, prefix="v") + make_nodes(1, model=A100, prefix="a")
    forest = CellForest(nodes)
    chain_of = {chain.model: name for name, chain in forest.chains.items()}
    counts = guaranteed_nodes if guaranteed_nodes is not None else {V100: 1, A100: 1}
    cells = {f"{chain_of[model]}/node": count for model, count in counts.items() if count}
    eng = engine(nodes, {}, resize_min_interval_seconds=interval)
    return Engine(nodes, tenants(forest, {"a": {"cells": cells}}), eng.options, forest=forest)


def elastic(name: str, model: str, *, maximum: int = 8, minimum: int = 1,
            topology: TopologyLevel | None = None) -> JobSpec:
    member = Request(name=name, gpu_count=1, gpu_milli=MILLI_PER_GPU, gpu_models=frozenset({model}))
    return JobSpec(name=name, vc="a", member=member, members=maximum, min_members=minimum, topology=topology)


def rigid(name: str, model: str, gpus: int) -> JobSpec:
    member = Request(name=name, gpu_count=gpus, gpu_milli=MILLI_PER_GPU, gpu_models=frozenset({model}))
    return JobSpec(name=name, vc="a", member=member)


def running(eng: Engine, spec: JobSpec, members: int, now: float = 0.0) -> None:
    eng.submit(spec, now)
    eng.limit_growth(spec.name, (members,))
    eng.schedule(now)
    assert eng.jobs[spec.name].size == members


def test_it_counts_the_free_gpus_of_the_other_model() -> None:
    eng = two_models()
    running(eng, elastic("job", V100), 4)
    running(eng, rigid("blocker", A100, 6), 1)
    assert eng.queries.room_on("job", A100, 10.0) == 2
    eng.finish("blocker", 20.0)
    assert eng.queries.room_on("job", A100, 20.0) == 8
    check_engine(eng)


def test_never_more_than_its_headcount() -> None:
    eng = two_models()
    running(eng, elastic("job", V100, maximum=5), 2)
    assert eng.queries.room_on("job", A100, 10.0) == 5


def test_nothing_for_the_model_it_runs_on_nor_inside_its_resize_interval() -> None:
    eng = two_models(interval=300.0)
    running(eng, elastic("job", V100), 2)
    assert eng.queries.room_on("job", V100, 10.0) == 0
    assert eng.queries.room_on("job", A100, 10.0) == 8, "a start is no resize"
    eng.release_members("job", ["job/1"], 50.0, "its controller deleted a worker")
    assert eng.queries.room_on("job", A100, 100.0) == 0, "resized at t=50, interval 300 s"
    assert eng.queries.room_on("job", A100, 350.0) == 8


def test_its_own_members_come_back_to_its_budget() -> None:
    """VC a is guaranteed both nodes but may borrow only 6 GPUs beyond: a job of 4 guaranteed members on the
    V100 node may move to all 8 A100s (its own 4 come back to the guarantee's room). On a VC guaranteed the
    V100 node alone the A100s are borrowed capacity: the job could run there with as many as the borrowing
    limit allows, its guaranteed members not counting against it."""
    eng = two_models()
    running(eng, elastic("job", V100), 4)
    running(eng, rigid("other", V100, 2), 1)
    assert eng.queries.room_on("job", A100, 10.0) == 8
    nodes = make_nodes(1, model=V100, prefix="v") + make_nodes(1, model=A100, prefix="a")
    forest = CellForest(nodes)
    v100 = next(name for name, chain in forest.chains.items() if chain.model == V100)
    small = Engine(nodes, tenants(forest, {"a": {"cells": {f"{v100}/node": 1}, "borrowLimitGpus": 6}}),
                   eng.options, forest=forest)
    running(small, elastic("job", V100), 4)
    assert small.queries.room_on("job", A100, 10.0) == 6


def test_a_waiting_job_is_counted_as_its_start_would_be() -> None:
    eng = two_models()
    running(eng, rigid("blocker", A100, 5), 1)
    eng.submit(elastic("late", V100, minimum=4), 10.0)
    assert eng.jobs["late"].phase == JobPhase.PENDING
    assert eng.queries.room_on("late", A100, 10.0) == 3, "the driver compares it with the minimum"
    assert eng.queries.room_on("late", V100, 10.0) == 8


def test_a_gang_a_node_must_hold_gets_nothing() -> None:
    """A sum over nodes says nothing about one node's room: such a gang is not moved."""
    eng = two_models()
    running(eng, elastic("job", V100, topology=TopologyLevel.NODE), 2)
    assert eng.queries.room_on("job", A100, 10.0) == 0


def test_an_unknown_model_gets_nothing() -> None:
    eng = two_models()
    running(eng, elastic("job", V100), 2)
    assert eng.queries.room_on("job", "H100", 10.0) == 0


def test_asking_changes_nothing() -> None:
    eng = two_models()
    running(eng, elastic("job", V100), 4)
    before = Counter((a.node, a.gpu_indices) for a in eng.book.allocations.values())
    for model in (V100, A100):
        eng.queries.room_on("job", model, 10.0)
    assert Counter((a.node, a.gpu_indices) for a in eng.book.allocations.values()) == before
    check_engine(eng)
