"""What ``kubecell elasticjobs`` makes of an ElasticJob, without a cluster: the kept goodput model read as the
scheduler reads it (speed-ups per GPU model and size, where it stops pricing, the batch), a forged one shown as
dropped, and objects that are not ElasticJobs never raising."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.saved_model import restore_model, saved_model
from kubecell.elastic.inspect import job_view, job_views
from tests.core.elastic.support import TRUE, report, reports, scaled


def learned() -> dict[str, Any]:
    """A job measured at 1, 2 and 4 workers on A100s and at 1 on T4s, with noisy gradients."""
    model = OnlineGoodput(initial_bsz=64, max_bsz=2048)
    for item in reports(TRUE, "A100", ((1, 1), (1, 2), (1, 4))) + reports(scaled(TRUE, 0.3), "T4", ((1, 1),)):
        model.observe(item)
    model.observe(report(TRUE, "A100", 1, 4, 64, grad=(1.0, 300.0)))
    kept: dict[str, Any] = json.loads(json.dumps(saved_model(model)))  # as the API server hands it back
    return kept


def job(kept: Any = None, **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "replicas": 4, "readyReplicas": 4, "targetReplicas": 4,
                              "gpuModel": "A100", "restarts": 1}
    if kept is not None:
        status["goodputModel"] = kept
    return {"metadata": {"name": "bert", "namespace": "ml", "uid": "u"},
            "spec": {"minReplicas": 1, "maxReplicas": 64, "replicas": 4, "batchSize": {"min": 64, "max": 2048},
                     "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}, **spec},
            "status": status}


def test_a_kept_model_is_shown_per_gpu_model_and_size() -> None:
    view = job_view(job(learned()))
    assert (view.phase, view.minimum, view.maximum, view.target, view.ready, view.gpu_model, view.restarts) == \
        ("Running", 1, 64, 4, 4, "A100", 1)
    model = view.model
    assert model.state == "kept"
    assert model.batch_range == (64, 2048)
    assert model.noise_ratio is not None
    assert model.noise_ratio > 1, "noisy gradients: a larger batch is worth more"
    a100, t4 = model.types
    assert (a100.gpu_type, a100.shapes, t4.gpu_type, t4.shapes) == ("A100", 12, "T4", 4)
    assert a100.speedup[1] == 1.0, "one worker of its best GPU model"
    assert t4.speedup[1] is not None
    assert t4.speedup[1] < 0.5, "a T4 does 0.3 of an A100's compute"
    assert a100.speedup[2] is not None
    assert a100.speedup[8] is not None
    assert 1.0 < a100.speedup[2] < a100.speedup[8], "more workers, more goodput, less than linearly"
    assert a100.speedup[64] is None, "beyond 8 x the 4 it ran at: not priced until a report confirms it"
    assert a100.batch[8] is not None
    local, steps = a100.batch[8]
    assert 64 <= 8 * local * steps <= 2048
    assert json.loads(json.dumps(view.to_data()))["goodputModel"]["types"][0]["speedup"]["1"] == 1.0


@pytest.mark.parametrize(("kept", "state", "fragment"), [
    (None, "none", "no model yet"),
    ("a string", "dropped", "a str, not a mapping"),
    ({"version": 1, "batchSize": {"min": 0, "max": 2048}, "types": []}, "dropped", "not a range"),
    ({"version": 1, "batchSize": {"min": 64, "max": 2048},
      "types": [{"gpuType": "A100", "shapes": [[1, 2, 32, 0.1, 0.5]]}]}, "dropped", "sync_time"),
    ({"version": 7, "batchSize": {"min": 64, "max": 2048}, "types": []}, "dropped", "version 7"),
])
def test_what_is_not_a_kept_model_is_shown_as_such(kept: Any, state: str, fragment: str) -> None:
    model = job_view(job(kept)).model
    assert model.state == state
    assert fragment in model.reason
    assert model.types == ()


def test_a_kept_model_of_a_world_the_job_can_never_form_is_shown_dropped_as_the_scheduler_drops_it() -> None:
    """Measured at 4 workers, kept on a job of at most 2 (one process each): the scheduler would not take it up
    (a forged status would lift its exploration limit), so the inspector does not show it as kept."""
    model = job_view(job(learned(), maxReplicas=2, replicas=2)).model
    assert model.state == "dropped"
    assert "never form" in model.reason
    assert job_view(job(learned(), maxReplicas=4)).model.state == "kept"


def test_sizes_are_workers_of_the_jobs_processes_as_the_scheduler_prices_them() -> None:
    """With ``nprocPerNode: 4`` one worker is the model's 4 processes (``core.elastic.per_worker``)."""
    kept = learned()
    view = job_view(job(kept, nprocPerNode=4, maxReplicas=16)).model
    assert view.state == "kept"
    model = OnlineGoodput(initial_bsz=64, max_bsz=2048)
    assert restore_model(model, kept) is None
    a100 = view.types[0]
    assert a100.speedup[1] == 1.0
    assert a100.speedup[2] == round(model.goodput("A100", 1, 8) / model.goodput("A100", 1, 4), 3)
    assert a100.batch[2] == model.best_batch("A100", 1, 8)


@pytest.mark.parametrize("obj", [{}, {"metadata": "x", "spec": 3, "status": []},
                                 {"metadata": {"name": "j", "namespace": "n"}, "spec": {"minReplicas": 5,
                                                                                       "maxReplicas": 2}}])
def test_objects_that_are_not_runnable_elastic_jobs_never_raise(obj: dict[str, Any]) -> None:
    (view,) = job_views([obj, "not a mapping"])
    assert view.problem, "the spec's problem is shown"
    assert (view.minimum, view.maximum, view.target) == (None, None, None)
    assert view.model.state == "none"
