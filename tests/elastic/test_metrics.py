"""The ElasticJob controller's Prometheus metrics, from the objects its cache holds (no cluster needed): what a
scrape shows of each job's status, read defensively, and the counters the loop bumps."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kubecell.elastic.metrics import ControllerMetrics, job_rows


def job(name: str, status: Any, namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "status": status}


def samples(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_each_job_is_shown_as_its_status_states_it() -> None:
    metrics = ControllerMetrics()
    metrics.publish([
        job("bert", {"phase": "Running", "targetReplicas": 4, "replicas": 4, "readyReplicas": 3, "restarts": 2}),
        job("yolo", {"phase": "Resizing", "targetReplicas": 2, "replicas": 3, "readyReplicas": 2}),
        job("new", None),
    ])
    seen = samples(metrics)
    bert = (("elasticjob", "bert"), ("namespace", "team-a"))
    assert seen["kubecell_elastic_job_target_replicas", bert] == 4
    assert seen["kubecell_elastic_job_replicas", bert] == 4
    assert seen["kubecell_elastic_job_ready_replicas", bert] == 3
    assert seen["kubecell_elastic_job_restarts", bert] == 2
    phases = {labels[0][1]: value for (name, labels), value in seen.items() if name == "kubecell_elastic_jobs"}
    assert (phases["Running"], phases["Resizing"], phases["Pending"]) == (1, 1, 1)
    assert (phases["Succeeded"], phases["Failed"]) == (0, 0), "every phase is a series, 0 included"
    assert seen["kubecell_elastic_synced", ()] == 1


def test_a_status_anyone_edited_cannot_break_a_scrape() -> None:
    metrics = ControllerMetrics()
    metrics.publish([
        job("edited", {"phase": "Exploded", "targetReplicas": "many", "replicas": -3, "readyReplicas": True,
                       "restarts": 2**80}),
        job("not-a-map", ["Running"]),
        {"metadata": {"namespace": "team-a"}},  # no name: not a job anyone can see
        {"metadata": None, "status": None},
    ])
    rows = job_rows([job("edited", {"phase": "Exploded", "replicas": -3, "readyReplicas": True})])
    assert (rows[0].phase, rows[0].workers, rows[0].ready) == ("Pending", 0, 0)
    seen = samples(metrics)
    names = {dict(labels).get("elasticjob") for (name, labels) in seen if name == "kubecell_elastic_job_replicas"}
    assert names == {"edited", "not-a-map"}
    edited = (("elasticjob", "edited"), ("namespace", "team-a"))
    assert seen["kubecell_elastic_job_target_replicas", edited] == 0
    assert seen["kubecell_elastic_job_restarts", edited] == 0


def test_a_deleted_job_leaves_no_series_and_counters_keep_counting() -> None:
    metrics = ControllerMetrics()
    assert samples(metrics)["kubecell_elastic_synced", ()] == 0, "nothing published: not synced"
    metrics.publish([job("gone", {"phase": "Running", "targetReplicas": 2})])
    metrics.reconciles.labels("ok").inc()
    metrics.pod_writes.labels("create", "ok").inc(3)
    metrics.events.labels("Normal", "Resizing").inc()
    metrics.publish([])
    seen = samples(metrics)
    assert not [key for key in seen if key[0] == "kubecell_elastic_job_target_replicas"]
    assert seen["kubecell_elastic_reconciles_total", (("outcome", "ok"),)] == 1
    assert seen["kubecell_elastic_reconciles_total", (("outcome", "error"),)] == 0
    assert seen["kubecell_elastic_pod_writes_total", (("outcome", "ok"), ("verb", "create"))] == 3
    assert seen["kubecell_elastic_events_total", (("reason", "Resizing"), ("type", "Normal"))] == 1


def test_the_leader_flag_follows_the_elector() -> None:
    metrics = ControllerMetrics()
    leading = [False]
    metrics.leading = lambda: leading[0]
    assert samples(metrics)["kubecell_elastic_leader", ()] == 0
    leading[0] = True
    assert samples(metrics)["kubecell_elastic_leader", ()] == 1
