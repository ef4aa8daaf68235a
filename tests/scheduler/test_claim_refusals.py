"""A claim kubecell refuses is refused once per spec and devices (a selector that ran out of its time is not
paid for again by every pod of a template), and each pod is told of its own claim: the claim the refusal was
first kept for may be another namespace's."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kubecell.kube.dra.claims import ClaimError
from kubecell.kube.dra.slices import published_devices
from kubecell.kube.rest import Kube
from kubecell.scheduler.claim_devices import Devices
from kubecell.scheduler.claims import ClaimBroker
from kubecell.scheduler.cluster import Mirror
from tests.kube.dra import CLASSES, claim, gpu_device, node_slice, request


def named(body: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    return {**body, "metadata": {"namespace": namespace, "name": name}}


def test_a_refusal_is_kept_per_spec_and_told_with_the_asking_claims_name(monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = Mirror()
    mirror.deviceclasses = dict(CLASSES)
    broker = ClaimBroker(mirror, cast(Kube, None))
    listed, _ = published_devices([node_slice("node-a", [gpu_device(0)])])
    devices = Devices({}, {}, (), tuple(listed))
    runs: list[str] = []

    def refusing(body: Any, classes: Any, found: Any, **clock: float | None) -> Any:
        runs.append(body["metadata"]["name"])
        raise ClaimError("ran out of the time a claim is given", "spec.devices.requests",
                         claim=f"ResourceClaim {body['metadata']['namespace']}/{body['metadata']['name']}")

    monkeypatch.setattr("kubecell.scheduler.claims.claim_demand", refusing)
    body = claim(request(selectors=("true",)))
    with pytest.raises(ClaimError, match="team-a/first"):
        broker._demand(named(body, "team-a", "first"), devices)
    with pytest.raises(ClaimError) as refused:
        broker._demand(named(body, "team-b", "second"), devices)
    assert "team-b/second" in str(refused.value)
    assert "team-a" not in str(refused.value), "another namespace's claim is not named to this pod"
    assert runs == ["first"], "the same spec against the same devices is refused once"
