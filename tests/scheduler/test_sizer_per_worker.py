"""The sizer prices an ElasticJob's workers as the processes they run: with ``nprocPerNode: 4``, a report of 8
processes is the world of its 2 workers, and the allocator is handed the model asked in workers
(``core.elastic.per_worker``): 3 workers are the model's 12 processes, not 3."""

from __future__ import annotations

import time

from kubecell.core.elastic.per_worker import PerWorker
from kubecell.core.elastic.targets import GrowthCandidate
from kubecell.kube.elasticjobs import ElasticRef
from tests.scheduler.elastic_sizer_support import RecordingSizer, report_from_both, reporting_job, running_job

BERT = ElasticRef("ns", "bert", "job-uid")


def test_a_job_of_four_process_workers_is_priced_in_workers() -> None:
    sizer, loop = RecordingSizer(nprocPerNode=4), reporting_job()
    now = time.time()
    report_from_both(loop, now, replicas=8, local=32, step=0.4, var=50.0)  # 2 workers x 4 processes
    sizer.grow(loop.state, loop.mirror, now)
    sized = sizer.jobs[BERT]
    model = sized.model
    assert model is not None, "the report of 8 processes is the world of its 2 workers: taken"
    estimate = sized.estimate()
    assert isinstance(estimate, PerWorker)
    assert estimate.processes == 4
    job = running_job(loop)
    gpu_type, nodes = sizer._feed(loop.state, loop.mirror, job, sized, now)
    assert gpu_type is not None
    decided = sizer.decide(loop.state, job, sized, gpu_type, nodes, now)
    assert isinstance(decided, GrowthCandidate), decided
    for workers in (1, 2, 3, 4):
        assert decided.estimate.goodput(gpu_type, 1, workers) == model.goodput(gpu_type, 1, 4 * workers)


def test_a_job_of_one_process_workers_is_priced_by_its_model_as_it_is() -> None:
    sizer, loop = RecordingSizer(), reporting_job()
    now = time.time()
    report_from_both(loop, now, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, now)
    sized = sizer.jobs[BERT]
    assert sized.model is not None
    assert sized.estimate() is sized.model
