"""The ElasticJob sizer's writes on the real API server (the testbed) when the job is deleted and made again
under its name between the sizer's GET and its PATCH: what the API server checks of a patch of a custom
resource's ``/status`` and ``/scale`` (not the uid, only the resourceVersion), and that the sizer writes nothing
on the job made again. And its conditions, written through the CRD's schema beside the controller's."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube import elasticjobs as ej
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.elastic import ElasticSizer
from kubecell.scheduler.elastic_conditions import CONDITION_STEP_REPORTS, Said
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import create_job, get_job, install_crd


@pytest.fixture(scope="module")
def elastic_crd(testbed: ControlPlaneState) -> None:
    install_crd(testbed)


def made_again(kube: Kube, namespace: str) -> dict[str, Any]:
    kube.delete(ej.job_path(namespace, "bert"))
    return create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4)


def test_a_custom_resources_status_and_scale_check_the_resource_version_not_the_uid(
        kube: Kube, elastic_crd: None, namespace: str) -> None:
    """Why the sizer's patches carry the resourceVersion its GET read: a uid in the patch is no precondition."""
    old = create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4)
    new = made_again(kube, namespace)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    path = ej.job_path(namespace, "bert")
    kube.patch(f"{path}/status", {"metadata": {"uid": old["metadata"]["uid"]}, "status": {"gpuModel": "A100"}})
    kube.patch(f"{path}/scale", {"metadata": {"uid": old["metadata"]["uid"]}, "spec": {"replicas": 3}})
    written = get_job(kube, namespace, "bert")
    assert (written["status"]["gpuModel"], written["spec"]["replicas"]) == ("A100", 3), \
        "the old job's uid in the patch: written on the new job all the same"
    for subresource, body in (("status", {"status": {"gpuModel": "V100M32"}}), ("scale", {"spec": {"replicas": 4}})):
        with pytest.raises(ApiError) as refused:
            kube.patch(f"{path}/{subresource}", {"metadata": {"resourceVersion": old["metadata"]["resourceVersion"]},
                                                 **body})
        assert refused.value.conflict, subresource
    assert get_job(kube, namespace, "bert")["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


class RacedSizer(ElasticSizer):
    """The real sizer, whose job is deleted and made again by its tenant right after the sizer's first GET."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, "kubecell")
        self.namespace = namespace
        self.raced = False

    def _own(self, ref: ElasticRef) -> dict[str, Any] | None:
        current = super()._own(ref)
        if not self.raced:
            self.raced = True
            made_again(self.kube, self.namespace)
        return current


UNTRUSTED = Said(CONDITION_STEP_REPORTS, False, "UntrustedReport", "pod bert-worker-1: stepSeconds -1")


@pytest.mark.parametrize("write", ["scale", "gpuModel", "goodputModel", "condition"])
def test_the_sizer_writes_nothing_on_a_job_made_again_after_its_get(
        kube: Kube, elastic_crd: None, namespace: str, write: str) -> None:
    old = create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4)
    ref = ElasticRef(namespace, "bert", old["metadata"]["uid"])
    sizer = RacedSizer(kube, namespace)
    sized = sizer._sized(ref)
    if write == "scale":
        assert not sizer._write(sized, 4, "grown")
    elif write == "gpuModel":
        assert not sizer._write_pin(ref, "A100")
    elif write == "goodputModel":
        assert not sizer._write_model(sized, {"version": 1, "batchSize": {"min": 1, "max": 1}, "types": []})
    else:
        sizer._say(sized, [UNTRUSTED], 0.0)
    new = get_job(kube, namespace, "bert")
    assert new["metadata"]["uid"] != ref.uid
    assert new["spec"].get("replicas") is None, "the new job's own target (none stated)"
    status = new.get("status") or {}
    assert "gpuModel" not in status, "nor its status"
    assert "goodputModel" not in status
    assert "conditions" not in status


def test_the_sizers_conditions_are_written_through_the_crd_beside_the_controllers(
        kube: Kube, elastic_crd: None, namespace: str) -> None:
    job = create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4)
    ref = ElasticRef(namespace, "bert", job["metadata"]["uid"])
    path = ej.job_path(namespace, "bert")
    controllers = [{"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": "Accepted", "message": "the spec can be run", "observedGeneration": 1},
                   {"type": "Available", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": "Running", "message": "2 workers ready", "observedGeneration": 1}]
    kube.patch(f"{path}/status", {"status": {"phase": "Running", "conditions": controllers}})
    sizer = ElasticSizer(kube, "kubecell")
    sizer._say(sizer._sized(ref), [UNTRUSTED], 0.0)
    written = get_job(kube, namespace, "bert")
    conditions = written["status"]["conditions"]
    assert conditions[:2] == controllers, "the controller's conditions are kept as they were"
    assert [(c["type"], c["status"], c["reason"]) for c in conditions[2:]] == [
        ("StepReports", "False", "UntrustedReport")]
    assert written["status"]["phase"] == "Running", "and the rest of the status"

    restarted = ElasticSizer(kube, "kubecell")  # knows nothing of what the last one wrote
    restarted._say(restarted._sized(ref), [UNTRUSTED], 0.0)
    assert get_job(kube, namespace, "bert")["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"], \
        "the same condition is not written again"
    restarted._say(restarted._sized(ref), [Said(CONDITION_STEP_REPORTS, True, "Trusted", "taken")], 0.0)
    after = get_job(kube, namespace, "bert")["status"]["conditions"]
    assert after[:2] == controllers
    assert [(c["type"], c["status"], c["reason"]) for c in after[2:]] == [("StepReports", "True", "Trusted")]
