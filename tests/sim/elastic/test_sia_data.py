"""Data-backed checks on the Sia artifact's tables and workloads (skipped with a message where the shared
data set is absent): values by hand from the real tables, Sia's own completion times, and a rigid run."""

from __future__ import annotations

import pytest

from kubecell.sim.elastic.applications import ApplicationModel, Batch
from kubecell.sim.elastic.cluster import kinds_of, sia64
from kubecell.sim.elastic.job import SimJob
from kubecell.sim.elastic.metrics import run_metrics
from kubecell.sim.elastic.policies import POLICIES
from kubecell.sim.elastic.runner import load_inputs, load_models
from kubecell.sim.elastic.simulator import simulate
from kubecell.sim.elastic.workload import WorkloadJob
from tests.sim.elastic.support import sia_file

pytestmark = pytest.mark.shared_data

APPS = ("cifar10", "bert", "deepspeech2", "yolov3", "imagenet")


@pytest.fixture(scope="module")
def apps() -> dict[str, ApplicationModel]:
    return load_models(sia_file("models"), APPS, kinds_of(sia64()))


def test_values_by_hand_from_the_tables(apps: dict[str, ApplicationModel]) -> None:
    cifar = apps["cifar10"]
    # placements-aws.csv: "1,32,0.0427886962890625,0.0004995360016822816" and "1,45,0.05048525333404541,..."
    step = 0.0427886962890625 + (40 - 32) / (45 - 32) * (0.05048525333404541 - 0.0427886962890625)
    assert cifar.throughput["t4"].times((1,), 40) == pytest.approx((step, pytest.approx(0.000502, abs=1e-5)))
    # "44,64,0.17055258750915528,0.11094823989868166": the same placement written (4, 4)
    assert cifar.throughput["t4"].times((4, 4), 64) == pytest.approx((0.17055258750915528, 0.11094823989868166))
    # validation-128.csv and -256.csv, first rows: B = 192 is halfway
    sqr, var = cifar.grad_stats(192, 0)
    assert sqr == pytest.approx((8.947307535897329 + 17.379458169870425) / 2)
    assert var == pytest.approx((5.066593295150894 + 13.937760473946334) / 2)
    # the end of training: the smallest last-row progress of the six curves (validation-256.csv's)
    assert (cifar.epochs, cifar.target_progress) == (100, pytest.approx(39062.90816659533))
    assert [apps[a].epochs for a in APPS] == [100, 2, 80, 50, 90]  # Sia's max_epochs
    assert [apps[a].restart_seconds for a in APPS] == [50, 120, 25, 80, 250]
    assert apps["deepspeech2"].max_local_bsz["rtx2080ti"] == 57  # Sia's override


SIA_JOB_STEP = [
    # (application, replicas, global batch, GPU type, placement, completion (s), batch) as Sia's own code
    # computes them: sia-simulator/job.py ``Job`` with batch-size tuning off, ``reallocate(placement)`` at t=0,
    # then ``step(60)`` until done (run against the same tables with scipy and pandas).
    ("cifar10", 6, 2048, "t4", (4, 2), 1666, Batch(342, 0, 6)),
    ("cifar10", 6, 2048, "rtx2080ti", (6,), 854, Batch(342, 0, 6)),
    ("cifar10", 6, 2048, "a100", (6,), 383, Batch(342, 0, 6)),
    ("cifar10", 16, 4096, "t4", (4, 4, 4, 4), 913, Batch(256, 0, 16)),
    ("cifar10", 16, 4096, "rtx2080ti", (8, 8), 574, Batch(256, 0, 16)),
    ("cifar10", 16, 4096, "a100", (8, 8), 227, Batch(256, 0, 16)),
    ("cifar10", 8, 2048, "t4", (4, 4), 1626, Batch(256, 0, 8)),
    ("bert", 6, 384, "t4", (4, 2), 3832, Batch(10, 5, 6)),
    ("bert", 6, 384, "a100", (6,), 415, Batch(32, 1, 6)),
    ("bert", 12, 384, "rtx2080ti", (8, 4), 1131, Batch(10, 2, 12)),
    ("deepspeech2", 6, 320, "rtx2080ti", (6,), 3201, Batch(54, 0, 6)),
    ("deepspeech2", 12, 640, "t4", (4, 4, 4), 3000, Batch(53, 0, 12)),
    ("deepspeech2", 12, 640, "rtx2080ti", (8, 4), 2688, Batch(26, 1, 12)),
    ("yolov3", 4, 64, "t4", (4,), 14651, Batch(16, 0, 4)),
    ("yolov3", 4, 64, "rtx2080ti", (4,), 22815, Batch(8, 1, 4)),
    ("imagenet", 10, 1600, "t4", (4, 4, 2), 74945, Batch(160, 0, 10)),
    ("imagenet", 14, 3200, "rtx2080ti", (8, 6), 36887, Batch(115, 1, 14)),
    ("imagenet", 14, 3200, "a100", (8, 6), 19645, Batch(229, 0, 14)),
]


@pytest.mark.parametrize(("name", "replicas", "batch_size", "gpu", "placement", "completion", "batch"),
                         SIA_JOB_STEP)
def test_a_lone_job_finishes_when_sias_job_step_says(apps: dict[str, ApplicationModel], name: str, replicas: int,
                                                      batch_size: int, gpu: str, placement: tuple[int, ...],
                                                      completion: int, batch: Batch) -> None:
    app = apps[name]
    assert app.fixed_batch(gpu, placement, batch_size) == batch
    job = SimJob(WorkloadJob(f"{name}-0", 0.0, name, replicas, batch_size), app)
    job.reallocate(0.0, gpu, ("n",) * replicas, placement)
    job.set_batch(batch)
    now = 0.0
    while not job.done:
        job.advance(now, 60.0)
        now += 60.0
    assert job.completion == pytest.approx(completion, abs=0.5)


def test_rigid_completes_philly_workload_1() -> None:
    inputs = load_inputs(sia_file("philly", "workload-1.csv"))
    (workload,) = inputs.workloads
    assert len(workload.jobs) == 160
    result = simulate(workload, inputs.apps, inputs.nodes, POLICIES["rigid"])
    assert all(r.completion is not None for r in result.records)
    for record in result.records:
        assert record.restarts == 0
        assert record.max_gpus == record.num_replicas
        assert record.first_start is not None
        assert record.first_start >= record.submitted
    figures = run_metrics(result)
    assert figures["completed"] == 160
    for sample in result.samples:
        assert 0 <= sample.allocated_gpus <= 64
    avg = figures["avg_jct_hours"]
    assert isinstance(avg, float)
    assert 0.3 < avg < 10  # Sia's Gavel+TunedJobs: 1.9 h on Philly


def test_oracle_answers_follow_the_epoch(apps: dict[str, ApplicationModel]) -> None:
    """The oracle keeps its answers for the epoch a job is in (a policy asks the same shapes every round) and
    answers afresh once the job has moved on, as an oracle that never saw the earlier epoch would."""
    from kubecell.sim.elastic.estimates import OracleGoodput

    app = apps["yolov3"]
    epoch = [0]
    oracle = OracleGoodput(app, epoch=lambda: epoch[0])
    shapes = [("t4", 1, 1), ("t4", 2, 8), ("a100", 1, 8), ("rtx2080ti", 2, 16)]
    answers = []
    for e in (0, app.epochs // 2, 0):
        epoch[0] = e
        fresh = OracleGoodput(app, epoch=lambda e=e: e)  # type: ignore[misc]
        answers.append([oracle.goodput(*shape) for shape in shapes])
        assert answers[-1] == [fresh.goodput(*shape) for shape in shapes]
        assert [oracle.best_batch(*shape) for shape in shapes] == [fresh.best_batch(*shape) for shape in shapes]
    assert answers[0] != answers[1]
    assert answers[0] == answers[2]
