"""The right-sizing patch (``kube.rightsize``) and the webhook's answer to an AdmissionReview
(``profiler.webhook``): only a lower share, only one container's ``kubecell.io/gpu-milli``, never memory, never
a pod that opted out or that cannot be read; a body that is not a review gets a clear refusal."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from kubecell.kube.rightsize import ANNOTATION_ASKED, right_sized
from kubecell.profiler.webhook import ReviewError, answer


def share_pod(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, containers: int = 1) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits or {"kubecell.io/gpu-milli": "400", "kubecell.io/gpu-memory": "1000"}}
    if requests is not None:
        resources["requests"] = requests
    pod: dict[str, Any] = {"metadata": {"name": "light-1-x", "namespace": "ns"},
                           "spec": {"containers": [{"name": f"c{i}", "resources": copy.deepcopy(resources)}
                                                   for i in range(containers)]}}
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


def test_a_share_is_lowered_to_its_familys_need_and_what_it_asked_is_kept() -> None:
    resize = right_sized(share_pod(requests={"kubecell.io/gpu-milli": "400"}, annotations={"a": "b"}), lambda: 150)
    assert list(resize.patch) == [
        {"op": "replace", "path": "/spec/containers/0/resources/limits/kubecell.io~1gpu-milli", "value": "150"},
        {"op": "replace", "path": "/spec/containers/0/resources/requests/kubecell.io~1gpu-milli", "value": "150"},
        {"op": "add", "path": "/metadata/annotations/kubecell.io~1asked-gpu-milli", "value": "400"}]
    assert "needs 150 milli-GPU of the 400" in resize.why
    without = right_sized(share_pod(), lambda: 150)
    assert without.patch[-1] == {"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_ASKED: "400"}}


@pytest.mark.parametrize(("pod", "advice", "why"), [
    (share_pod(), None, "no advice"),
    (share_pod(), 400, "not less than the 400"),
    (share_pod(), 900, "not less than the 400"),
    (share_pod(), 0, "not less than"),
    (share_pod(annotations={"kubecell.io/right-size": "False"}), 150, "right-size: false"),
    (share_pod(containers=2), 150, "2 containers"),
    (share_pod(limits={"nvidia.com/gpu": "1"}), 150, "0 containers"),
    (share_pod(limits={"kubecell.io/gpu-milli": "1000"}), 150, "whole GPUs"),
    (share_pod(limits={"kubecell.io/gpu-milli": "0.5"}), 150, "not one whole number"),
    (share_pod(limits={"kubecell.io/gpu-milli": "lots"}), 150, "not one whole number"),
    (share_pod(requests={"kubecell.io/gpu-milli": "300"}), 150, "not one whole number"),
], ids=["no advice", "advice equal", "advice higher", "advice 0", "opted out", "two containers", "no share",
        "a whole GPU", "a fraction of a milli", "not a quantity", "request unlike limit"])
def test_nothing_is_changed_where_it_must_not_be(pod: dict[str, Any], advice: int | None, why: str) -> None:
    resize = right_sized(pod, lambda: advice)
    assert resize.patch == ()
    assert why in resize.why


def test_an_init_container_asking_a_share_leaves_the_pod_as_it_is() -> None:
    pod = share_pod()
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"kubecell.io/gpu-milli": "100"}}}]
    assert right_sized(pod, lambda: 150).patch == ()


def review(pod: Any, operation: str = "CREATE", kind: str = "Pod") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r-1", "kind": {"group": "", "version": "v1", "kind": kind}, "operation": operation,
        "namespace": "team-a", "object": pod}}).encode()


def test_the_answer_allows_every_pod_and_patches_only_a_new_share() -> None:
    asked: list[Any] = []

    def advice(pod: Any) -> int | None:
        asked.append(pod)
        return 150

    pod = share_pod()
    del pod["metadata"]["namespace"]  # a pod created without one: the review names the namespace
    reply = answer(review(pod), advice)
    assert reply["apiVersion"] == "admission.k8s.io/v1"
    response = reply["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == ("r-1", True, "JSONPatch")
    assert json.loads(base64.b64decode(response["patch"]))[0]["value"] == "150"
    assert "right-sized kubecell.io/gpu-milli" in response["warnings"][0]
    assert asked[0]["metadata"]["namespace"] == "team-a"
    for body in (review(pod, operation="UPDATE"), review(pod, kind="Service"), review("not a pod")):
        assert answer(body, advice)["response"] == {"uid": "r-1", "allowed": True}


def test_a_broken_history_lets_the_pod_through_as_it_asks() -> None:
    def broken(_: Any) -> int | None:
        raise RuntimeError("database gone")

    assert answer(review(share_pod()), broken)["response"] == {"uid": "r-1", "allowed": True}


def test_the_history_is_asked_only_for_a_pod_with_a_share_to_lower() -> None:
    """Every pod created in a selected namespace reaches the webhook (dry runs too, and names a user chooses):
    the cheap checks come first, so the history (and its cache) is asked only where there is a share to lower."""
    asked: list[str] = []

    def advice(pod: Any) -> int | None:
        asked.append(pod["metadata"]["name"])
        return 150

    opted_out = share_pod(annotations={"kubecell.io/right-size": "false"})
    whole = share_pod({"kubecell.io/gpu-milli": "1000"})
    for pod in (opted_out, whole, share_pod({"cpu": "1"})):
        assert answer(review(pod), advice)["response"] == {"uid": "r-1", "allowed": True}
    assert asked == []
    assert "patch" in answer(review(share_pod()), advice)["response"]
    assert len(asked) == 1


@pytest.mark.parametrize("pod", [
    {"metadata": {"annotations": ["kubecell.io/right-size"]}, "spec": {}},
    {"metadata": {}, "spec": {"containers": ["main"]}},
    {"metadata": {}, "spec": {"containers": [{"name": "main", "resources": "a lot"}]}},
    {"metadata": {}, "spec": {"containers": [{"name": "main", "resources": {"limits": ["kubecell.io/gpu-milli"]}}]}},
    {"metadata": {}, "spec": "nothing"},
])
def test_a_pod_of_a_shape_no_api_server_sends_goes_through_unchanged(pod: dict[str, Any]) -> None:
    assert answer(review(pod), lambda _: 150)["response"] == {"uid": "r-1", "allowed": True}


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"[]", "not an admission.k8s.io/v1 AdmissionReview"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), "v1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(),
     "request.uid"),
])
def test_a_body_that_is_not_a_review_is_refused_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(ReviewError, match=message):
        answer(body, lambda _: 150)


def test_the_app_answers_a_review_and_refuses_a_body_over_its_bound() -> None:
    from starlette.testclient import TestClient

    from kubecell.profiler.webhook import MAX_BODY_BYTES, webhook_app

    with TestClient(webhook_app(lambda _: 150)) as client:
        reply = client.post("/mutate", content=review(share_pod()))
        assert reply.status_code == 200
        assert reply.json()["response"]["patchType"] == "JSONPatch"
        assert client.post("/mutate", content=b" " * (MAX_BODY_BYTES + 1)).status_code == 413
        streamed = client.post("/mutate", content=iter([b" " * MAX_BODY_BYTES, b"{"]))  # no length given
        assert streamed.status_code == 413
        assert client.post("/mutate", content=b"{").status_code == 400
        assert client.get("/healthz").text == "ok"
