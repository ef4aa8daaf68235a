"""The rigid baseline (packing, FIFO with backfill, heterogeneity-aware type choice), the registry, and a knob of
kubecell's policies replaced for a measurement."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.cluster import kinds_of
from kubecell.sim.elastic.policies import POLICIES, RigidPolicy, pack, parse_policies, policy_spec, with_options
from kubecell.sim.elastic.runner import load_models
from kubecell.sim.elastic.simulator import ElasticSimulator
from kubecell.sim.elastic.workload import load_workload
from tests.sim.elastic.support import write_models, write_workload

NAMES = ("t4-0", "t4-1", "t4-2", "t4-3")
ORDER = {name: index for index, name in enumerate(NAMES)}

PACK_CASES = [
    # free GPUs per node, size, expected replicas' nodes
    ((4, 4, 4, 4), 6, ("t4-0",) * 4 + ("t4-1",) * 2),   # a whole node, the rest on the tightest fit
    ((4, 2, 3, 4), 3, ("t4-2",) * 3),                   # one node, the tightest that fits
    ((1, 1, 1, 1), 3, ("t4-0", "t4-1", "t4-2")),        # spread only when it must be
    ((2, 4, 1, 3), 6, ("t4-0",) * 2 + ("t4-1",) * 4),   # fullest first (t4-1), then the tightest fit for 2
    ((4, 4, 0, 0), 9, None),                            # not enough free GPUs
    ((4, 4, 4, 4), 0, None),
]


@pytest.mark.parametrize(("free", "size", "expected"), PACK_CASES)
def test_pack(free: tuple[int, ...], size: int, expected: tuple[str, ...] | None) -> None:
    assert pack(size, NAMES, dict(zip(NAMES, free, strict=True)), ORDER) == expected


class Speed:
    """A goodput estimate that only knows a speed per GPU type."""

    def __init__(self, speeds: Mapping[str, float]) -> None:
        self.speeds = speeds

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return self.speeds.get(gpu_type, 0.0) * num_replicas


def view(name: str, size: int, submitted: float, current: tuple[str, ...] = (),
         speeds: Mapping[str, float] | None = None) -> ElasticJobView:
    return ElasticJobView(name=name, submitted=submitted, min_replicas=size, max_replicas=size, current=current,
                          last_resize=None, attained_gpu_seconds=0.0, restart_seconds=30.0,
                          estimate=Speed(speeds or {"t4": 1.0, "a100": 3.0}))


CLUSTER = (ClusterNode("t4-0", "t4", 4), ClusterNode("t4-1", "t4", 4), ClusterNode("a100-0", "a100", 8))


def test_fifo_with_backfill_and_running_jobs_untouched() -> None:
    jobs = [
        view("running", 8, 0.0, current=("a100-0",) * 8),
        view("big", 8, 1.0),      # the A100 node is taken; all 8 T4 GPUs are free
        view("small", 4, 2.0),
    ]
    assert RigidPolicy().allocate(60.0, jobs, CLUSTER) == {"big": ("t4-0",) * 4 + ("t4-1",) * 4}
    jobs = [
        view("running", 8, 0.0, current=("a100-0",) * 8),
        view("holder", 2, 0.5, current=("t4-0",) * 2),
        view("big", 8, 1.0),      # 6 free on t4: waits
        view("mid", 4, 2.0),      # backfills: 4 on t4-1
        view("four", 4, 3.0),     # 2 left: waits
        view("two", 2, 4.0),      # backfills on t4-0
    ]
    decision = RigidPolicy().allocate(60.0, jobs, CLUSTER)
    assert decision == {"mid": ("t4-1",) * 4, "two": ("t4-0",) * 2}


def test_takes_the_type_where_the_job_is_fastest() -> None:
    assert RigidPolicy().allocate(0.0, [view("j", 4, 0.0)], CLUSTER) == {"j": ("a100-0",) * 4}
    slow_a100 = view("j", 4, 0.0, speeds={"t4": 2.0, "a100": 1.0})
    assert RigidPolicy().allocate(0.0, [slow_a100], CLUSTER) == {"j": ("t4-0",) * 4}
    only_t4 = ElasticJobView(name="j", submitted=0.0, min_replicas=4, max_replicas=4, current=(), last_resize=None,
                             attained_gpu_seconds=0.0, restart_seconds=30.0, estimate=Speed({"a100": 9.0}),
                             gpu_types=frozenset({"t4"}))
    assert RigidPolicy().allocate(0.0, [only_t4], CLUSTER) == {"j": ("t4-0",) * 4}


def test_registry() -> None:
    assert [spec.name for spec in parse_policies(" rigid,RIGID ")] == ["rigid"]
    assert policy_spec("rigid").tuned_jobs
    assert policy_spec("rigid").estimate == "oracle"
    assert not POLICIES["kubecell"].tuned_jobs
    assert POLICIES["kubecell"].estimate == "online"
    accepted = ("kubecell, kubecell-no-moves, kubecell-allocator, kubecell-true-noise, kubecell-oracle, rigid, "
                "gavel")
    with pytest.raises(InvalidInputError, match=rf"unknown elastic policy 'pollux' .*accepted: {accepted}"):
        parse_policies("rigid,pollux")
    with pytest.raises(InvalidInputError, match="no policy given"):
        parse_policies(" , ")


def test_a_knob_replaced_reaches_every_allocator_of_the_run(tmp_path: Path) -> None:
    """``bench/elastic_noise.py --option`` measures a knob on the path a cluster runs: every per-VC allocator the
    run makes holds the replaced value, the rest stay defaults, and the run is reported under its own name."""
    spec = with_options(POLICIES["kubecell"], ["fifo_decay=0.85", " restart_age_rule = false"])
    assert spec.name == "kubecell fifo_decay=0.85 restart_age_rule=False"
    assert spec.estimate == "online"
    nodes = (ClusterNode("t4-0", "t4", 4), ClusterNode("a100-0", "a100", 8))
    models = write_models(tmp_path)
    rows = "".join(f"cifar10-{i},{i * 30},cifar10,2,64\n" for i in range(4))
    workload = load_workload(write_workload(tmp_path, rows), ("cifar10",))
    simulator = ElasticSimulator(workload, load_models(models, ["cifar10"], kinds_of(nodes)), nodes, spec)
    result = simulator.run()
    assert all(record.completion is not None for record in result.records)
    sizers = getattr(simulator.policy, "sizers", {})
    assert sizers, "the cluster's path sized the jobs"
    for sizer in sizers.values():
        assert (sizer.options.fifo_decay, sizer.options.restart_age_rule) == (0.85, False)
        assert sizer.options.las_levels == 4, "the other knobs keep their defaults"
    allocator = with_options(POLICIES["kubecell-allocator"], ["las_levels=6"]).make()
    assert isinstance(allocator, KubecellElasticPolicy)
    assert allocator.options.las_levels == 6
    assert with_options(POLICIES["kubecell"], []) is POLICIES["kubecell"]


@pytest.mark.parametrize(("policy", "option", "message"), [
    ("kubecell", "nonsense=1", r"option 'nonsense=1' is not KEY=VALUE of a known knob \(accepted: explore_value"),
    ("kubecell", "fifo_decay", "is not KEY=VALUE"),
    ("kubecell", "fifo_decay=abc", r"option fifo_decay='abc' is not a number"),
    ("kubecell", "las_levels=2.5", r"option las_levels='2.5' is not an integer"),
    ("kubecell", "restart_age_rule=yes", "is not true or false"),
    ("kubecell", "fifo_decay=2", r"fifo_decay = 2.0 out of range"),
    ("kubecell", "fifo_decay=nan", "out of range"),
    ("rigid", "fifo_decay=0.5", r"policy 'rigid' has no ElasticOptions to set \(accepted: kubecell,"),
])
def test_a_knob_that_cannot_be_set_is_refused(policy: str, option: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        with_options(POLICIES[policy], [option])
