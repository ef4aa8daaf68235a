"""``kubecell elasticjobs`` against the real API server: a row per ElasticJob, the kept goodput model of one
job in full (written through the CRD's schema as the scheduler writes it), a forged one shown as dropped, and
a job or an API that is not there one line on stderr with exit status 1."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from kubecell.cli.main import app
from kubecell.kube import elasticjobs as ej
from kubecell.kube.actions import event_body
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import create_job
from tests.elastic.test_inspect_view import learned


def elasticjobs(testbed: ControlPlaneState, *args: str) -> Any:
    return CliRunner().invoke(app, ["elasticjobs", "--kubeconfig", testbed.admin_kubeconfig, *args])


def test_it_lists_the_jobs_and_shows_one_jobs_model(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                    elastic_crd: None) -> None:
    create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=16, replicas=4,
               batchSize={"min": 64, "max": 2048})
    create_job(kube, namespace, "forged", minReplicas=1, maxReplicas=4)
    kube.patch(f"{ej.job_path(namespace, 'bert')}/status",
               {"status": {"gpuModel": "A100", "goodputModel": learned()}})
    forged = {"version": 1, "batchSize": {"min": 64, "max": 2048},
              "types": [{"gpuType": "A100", "shapes": [[1, 2, 32, 0.1, 0.5]]}]}  # passes the schema, not the checks
    kube.patch(f"{ej.job_path(namespace, 'forged')}/status", {"status": {"goodputModel": forged}})

    listed = elasticjobs(testbed, "-n", namespace, "-o", "json")
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert sorted(rows) == ["bert", "forged"]
    assert (rows["bert"]["minReplicas"], rows["bert"]["maxReplicas"], rows["bert"]["gpuModel"]) == (1, 16, "A100")
    model = rows["bert"]["goodputModel"]
    assert model["state"] == "kept"
    assert [t["gpuType"] for t in model["types"]] == ["A100", "T4"]
    assert model["types"][0]["speedup"]["1"] == 1.0
    assert rows["forged"]["goodputModel"]["state"] == "dropped"
    assert "sync_time" in rows["forged"]["goodputModel"]["reason"]

    table = elasticjobs(testbed, "-n", namespace)
    assert table.exit_code == 0, table.output
    assert "A100: x" in table.stdout, "the summary cell gives the speed-up at the largest size priced"
    assert "dropped" in table.stdout

    one = elasticjobs(testbed, "bert", "-n", namespace)
    assert one.exit_code == 0, one.output
    assert "goodput per size over one worker of its best GPU model" in one.stdout
    assert "not priced" in one.stdout, "16 workers is beyond 8 x the 4 it ran at"
    assert "gradient noise ratio" in one.stdout
    assert "No decision of the scheduler on it yet." in one.stdout

    job = kube.get(ej.job_path(namespace, "bert"))
    for reason, message in (("Resize", "target 2 -> 4 workers: grown 2->4 A100: goodput +60% (+15.0%/GPU)"),
                            ("Started", "not one of the scheduler's decisions")):
        kube.create(f"/api/v1/namespaces/{namespace}/events",
                    event_body(ej.involved(job), namespace, event_type="Normal", reason=reason, message=message,
                               component="kubecell", action="Schedule"))
    told = elasticjobs(testbed, "bert", "-n", namespace, "-o", "json")
    assert told.exit_code == 0, told.output
    (row,) = json.loads(told.stdout)
    assert len(row["decisions"]) == 1, "the sizer's Events only"
    assert "Resize: target 2 -> 4 workers: grown 2->4 A100" in row["decisions"][0]
    assert "grown 2->4 A100" in elasticjobs(testbed, "bert", "-n", namespace).stdout


def test_a_missing_job_or_api_is_one_line_and_status_1(testbed: ControlPlaneState, namespace: str,
                                                       elastic_crd: None) -> None:
    missing = elasticjobs(testbed, "nobody", "-n", namespace)
    assert missing.exit_code == 1
    assert "cannot read ElasticJobs" in missing.stderr
    assert "404" in missing.stderr or "not found" in missing.stderr.lower()
    unnamed = elasticjobs(testbed, "bert")
    assert unnamed.exit_code == 1
    assert "--namespace" in unnamed.stderr
