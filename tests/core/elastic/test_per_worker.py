"""The goodput model asked in workers: a worker of ``nprocPerNode`` GPUs is that many of the model's replicas, so
2 workers of 8 GPUs are priced as the world of 16 processes their step reports state."""

from __future__ import annotations

import numpy as np
import pytest

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.per_worker import PerWorker, in_workers
from tests.core.elastic.support import TRUE, reports


def measured() -> OnlineGoodput:
    model = OnlineGoodput(initial_bsz=64, max_bsz=4096)
    for item in reports(TRUE, "A100", ((1, 8), (2, 16), (4, 32))):
        model.observe(item)
    return model


def test_workers_are_priced_as_the_processes_they_run() -> None:
    model = measured()
    workers = PerWorker(model, 8)
    for nodes, count in ((1, 1), (2, 2), (4, 4)):
        assert workers.goodput("A100", nodes, count) == model.goodput("A100", nodes, count * 8)
        assert workers.best_batch("A100", nodes, count) == model.best_batch("A100", nodes, count * 8)
    shapes = [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert np.array_equal(workers.goodput_many("A100", shapes),
                          model.goodput_many("A100", [(n, r * 8) for n, r in shapes]))
    # one worker priced as one process (before): 2 workers read as a world of 2, which the job never formed, and
    # the exploration limit (8 x the 32 processes it ran at) read as 256 workers, 8 times looser than meant
    assert workers.goodput("A100", 2, 2) != model.goodput("A100", 2, 2)
    assert model.replica_limit("A100") == 256
    assert workers.goodput("A100", 32, 32) > 0.0
    assert workers.goodput("A100", 64, 64) == 0.0, "512 processes: beyond what its reports let it explore"
    assert model.goodput("A100", 64, 64) > 0.0


def test_one_process_per_worker_asks_the_model_as_it_is() -> None:
    model = measured()
    assert in_workers(model, 1) is model
    assert in_workers(model, None) is model
    assert isinstance(in_workers(model, 4), PerWorker)
    with pytest.raises(ValueError, match="at least one process"):
        PerWorker(model, 0)
