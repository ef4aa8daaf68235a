"""The dynamic simulator follows the engine's resizes exactly and work-conservingly: an elastic job that is
shrunk for a guarantee keeps its progress and runs on at the rate of its new size, and speeds up again when
it grows back (after the resize interval), losing no GPU-time."""

from __future__ import annotations

import pytest

from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.topology import CellForest
from kubecell.sim.dynamic.simulator import DynamicSimulation
from tests.core.support import make_nodes, tenants


def gpus(name: str, vc: str, count: int, *, members: int, minimum: int | None, submit: float,
         work: float) -> JobSpec:
    member = Request(name, gpu_count=count, gpu_milli=MILLI_PER_GPU)
    return JobSpec(name=name, vc=vc, member=member, members=members, min_members=minimum, submit_time=submit,
                   work=work)


@pytest.mark.parametrize(("interval", "finish"), [
    (300.0, 1150.0),  # 100 s at 8/8, 300 s at 4/8 (the interval holds growth until t=400), then 750 s at 8/8
    (0.0, 1100.0),    # grows back when the guaranteed job ends at t=300: 100 + 200 at 4/8 + 800
])
def test_a_shrunk_job_runs_on_at_its_new_size_and_keeps_its_work(interval: float, finish: float) -> None:
    nodes = make_nodes(4)
    forest = CellForest(nodes)
    jobs = [gpus("elastic", "b", 4, members=8, minimum=4, submit=0.0, work=1000.0),
            gpus("g", "a", 8, members=2, minimum=None, submit=100.0, work=200.0)]
    simulation = DynamicSimulation(nodes, tenants(forest, {"a": {"gpus": 16}, "b": {"gpus": 8}}),
                                   PRESETS["kubecell"].with_(resize_min_interval_seconds=interval), jobs,
                                   sample_seconds=0, checkpoint_seconds=60.0)
    result = simulation.run()
    records = {record.name: record for record in result.records}
    assert records["g"].first_start == 100.0
    assert records["g"].finish == 300.0
    assert records["elastic"].finish == pytest.approx(finish)
    assert records["elastic"].preemptions == 0
    assert records["elastic"].lost_gpu_seconds == 0.0
    assert result.gangs_broken == 0
