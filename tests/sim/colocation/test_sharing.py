"""The dynamic simulator with a speed model: jobs sharing a GPU are re-rated, keeping their progress, when a
partner joins and again when it leaves; without a model (or with one that never slows anyone) nothing changes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.interference import AdmissionRule, BlindSharing, JobKey, NoSharing, SharedRun, SoloProfile
from kubecell.core.interference.history import HistoryInformed, PairHistory
from kubecell.core.topology import CellForest
from kubecell.sim.colocation.experiment import AsMeasured, reading_shortfalls
from kubecell.sim.colocation.workload import share_job
from kubecell.sim.dynamic.sharing import SpeedModel
from kubecell.sim.dynamic.simulator import DynamicSimulation, SimulationResult
from tests.core.support import make_nodes, tenants

PROFILE = SoloProfile(JobKey("m"), 50.0, 20.0, 1000.0)


class Halves:
    """Every job beside another on one of its GPUs runs at half speed."""

    def speed(self, job: JobSpec, partners: Sequence[Sequence[JobSpec]]) -> float:
        return 0.5 if any(partners) else 1.0


class Unchanged:
    def speed(self, job: JobSpec, partners: Sequence[Sequence[JobSpec]]) -> float:
        return 1.0


def simulate(jobs: list[JobSpec], model: SpeedModel | None, *, gpus: int = 1, rule: AdmissionRule | None = None,
             history: PairHistory | None = None) -> tuple[DynamicSimulation, SimulationResult]:
    """One node of ``gpus`` GPUs; blind sharing unless ``rule`` says otherwise."""
    nodes = make_nodes(1, gpus=gpus)
    simulation = DynamicSimulation(nodes, tenants(CellForest(nodes), {"shared": {"gpus": gpus}}),
                                   PRESETS["kubecell"].with_(colocation=rule or BlindSharing()), jobs, sample_seconds=0,
                                   speed_model=model, pair_history=history)
    return simulation, simulation.run()


def finishes(result: SimulationResult) -> dict[str, float | None]:
    return {record.name: record.finish for record in result.records}


def test_both_jobs_are_rerated_when_a_partner_joins_and_when_it_leaves() -> None:
    # x alone 0-50 (50 done); together at 0.5 from 50: x's last 50 take 100 s -> x ends at 150, y has 50 done;
    # y alone at 1.0 from 150: its last 50 -> 200.
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", PROFILE, 50.0, 100.0)]
    simulation, result = simulate(jobs, Halves())
    assert finishes(result) == {"x": pytest.approx(150.0), "y": pytest.approx(200.0)}
    assert simulation.sharing is not None
    segments = [(s.job, s.partners, s.speed, s.start, s.end) for s in simulation.sharing.segments]
    assert sorted(segments) == sorted([("x", ((),), 1.0, 0.0, 50.0), ("x", (("y",),), 0.5, 50.0, 150.0),
                                       ("y", (("x",),), 0.5, 50.0, 150.0), ("y", ((),), 1.0, 150.0, 200.0)])
    assert simulation.sharing.gpu_seconds_occupied == pytest.approx(200.0), "one GPU held from 0 to 200"


def test_two_jobs_starting_together_share_from_the_start() -> None:
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", PROFILE, 0.0, 100.0)]
    _, result = simulate(jobs, Halves())
    assert finishes(result) == {"x": pytest.approx(200.0), "y": pytest.approx(200.0)}


def test_jobs_on_separate_gpus_are_not_slowed() -> None:
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", PROFILE, 0.0, 100.0)]
    simulation, result = simulate(jobs, Halves(), gpus=2, rule=NoSharing())
    assert finishes(result) == {"x": pytest.approx(100.0), "y": pytest.approx(100.0)}
    assert simulation.sharing is not None
    assert simulation.sharing.gpu_seconds_occupied == pytest.approx(200.0)


@pytest.mark.parametrize("model", [None, Unchanged()])
def test_without_slowdown_a_share_runs_as_fast_as_alone(model: SpeedModel | None) -> None:
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", PROFILE, 50.0, 100.0)]
    simulation, result = simulate(jobs, model)
    assert finishes(result) == {"x": 100.0, "y": 150.0}
    assert (simulation.sharing is None) == (model is None)


def test_what_a_pair_did_is_kept_in_the_history_when_its_segment_ends() -> None:
    other = SoloProfile(JobKey("n"), 50.0, 20.0, 1000.0)
    history = PairHistory()
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", other, 50.0, 100.0)]
    simulate(jobs, Halves(), history=history)
    assert history.speed(JobKey("m"), JobKey("n")) == 0.5
    assert history.seconds(JobKey("m"), JobKey("n")) == pytest.approx(100.0), "x beside y from 50 to 150"
    assert history.seconds(JobKey("n"), JobKey("m")) == pytest.approx(100.0)
    assert len(history) == 2, "nothing of the time each ran alone"


def test_a_pair_that_slowed_each_other_does_not_share_again_under_a_history_informed_rule() -> None:
    history = PairHistory()
    history.observe(JobKey("m"), JobKey("m"), 0.5, 100.0)  # two jobs of family m halved each other before
    jobs = [share_job("x", PROFILE, 0.0, 100.0), share_job("y", PROFILE, 50.0, 100.0)]
    _, result = simulate(jobs, Halves(), history=history, rule=HistoryInformed(BlindSharing(), history, 1.0))
    assert finishes(result) == {"x": pytest.approx(100.0), "y": pytest.approx(200.0)}, "y waited for the GPU"


def test_a_history_as_measured_caps_speeds_at_one_and_stays_near_the_truth() -> None:
    measured = AsMeasured(seed=7)
    a, b = JobKey("a"), JobKey("b")
    for _ in range(200):
        assert measured.observe(a, b, 1.3, 60.0), "faster beside b is read as at most solo speed"
        assert measured.observe(b, a, 0.5, 60.0)
    speed_a, speed_b = measured.speed(a, b), measured.speed(b, a)
    assert speed_a is not None
    assert speed_b is not None
    assert speed_a <= 1.0
    # 200 observations average the noise away; what is left is b's solo-baseline error (3 %)
    assert speed_a == pytest.approx(1.0, abs=0.1)
    assert speed_b == pytest.approx(0.5, rel=0.1)
    assert not measured.observe(a, b, float("nan"), 60.0), "what is not a speed is still refused"


def test_short_readings_lower_what_the_history_is_told_pair_by_pair() -> None:
    """Two jobs busy 30 % alone, both at full speed beside each other, on a GPU that read 45 % (not 60 %): a
    reading-based speed would be 0.75, and the history hears that of this pair only, in both orders."""
    a, b, c = JobKey("a"), JobKey("b"), JobKey("c")
    solos = {key: SoloProfile(key, 30.0, 5.0, 100.0) for key in (a, b, c)}
    runs = [SharedRun((a, b), (1.0, 1.0), gpu_util=45.0), SharedRun((b, a), (1.0, 1.0), gpu_util=75.0),
            SharedRun((a, c), (1.0, 1.0))]
    shortfall = reading_shortfalls(runs, solos)
    assert shortfall == {(a, b): pytest.approx(0.875), (b, a): pytest.approx(0.875)}, "a reading above is capped"
    measured = AsMeasured(seed=3, shortfall={(a, b): 0.75})
    for _ in range(200):
        measured.observe(a, b, 1.0, 60.0)
        measured.observe(a, c, 1.0, 60.0)
    beside_b, beside_c = measured.speed(a, b), measured.speed(a, c)
    assert beside_b is not None
    assert beside_c is not None
    assert beside_b == pytest.approx(0.75 * beside_c, rel=0.02)
