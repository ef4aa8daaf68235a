"""What the job history told the scheduler survives its restart, on the real testbed: a share placed by its
family's use (``--place-by-use``: a smaller grant than the pod asked) is restored as granted, never distrusted
as a forgery, and the shares running on a GPU are judged by their families' profiles again, so the co-location
rule keeps holding after the restart what it held before."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from kubecell.core.interference import JobKey, SoloProfile, SummedUtilThreshold
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.pods import record_of
from kubecell.kube.rest import Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.restore import UNTRUSTED
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.trust_support import create_pod, held_on, pod, warnings_of, write_record
from tests.support import wait_for


class Families:
    """The history's answers by the pod name's first word (its family): a light family that needs 150 milli and
    uses 20 % of a GPU alone, a heavy one that uses 85 %."""

    USE: ClassVar[dict[str, tuple[float, int | None]]] = {"light": (20.0, 150), "heavy": (85.0, None)}

    def _family(self, pod: Mapping[str, Any]) -> str:
        return str(pod["metadata"]["name"]).split("-")[0]

    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        return None

    def profile(self, pod: Mapping[str, Any]) -> SoloProfile | None:
        family = self._family(pod)
        if family not in self.USE:
            return None
        util = self.USE[family][0]
        return SoloProfile(JobKey(f"{pod['metadata']['namespace']}/{family}"), util, util, 1000.0)

    def share_milli(self, pod: Mapping[str, Any]) -> int | None:
        family = self._family(pod)
        return self.USE[family][1] if family in self.USE else None

    def family(self, pod: Mapping[str, Any]) -> JobKey | None:
        return None


def node_and_gpus(kube: Kube, namespace: str, name: str) -> str:
    return str(pod(kube, namespace, name)["spec"].get("nodeName") or "")


def gpu_of(body: Mapping[str, Any]) -> tuple[str, int]:
    """(node, GPU index) the pod's allocation record gives it."""
    record = record_of(body)
    assert record is not None
    (gpu,) = record.gpus
    return record.node, gpu.index


def test_a_share_placed_by_use_is_restored_as_granted_and_its_profile_still_rules(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    options = SchedulerOptions(knowledge=Families(), place_by_use=True, colocation=SummedUtilThreshold(100))
    first = start_scheduler(testbed, options)
    # asked by KubeShare's labels: a share only kubecell counts, so one placed by use may get less than it asks
    create_pod(kube, namespace, "light-0", {}, labels={"sharedgpu/gpu_request": "0.4",
                                                      "sharedgpu/gpu_mem": str(1000 * 1024 * 1024)})
    node = wait_for("the light share to be bound", lambda: node_and_gpus(kube, namespace, "light-0"))
    before = [held for held in held_on(first.scheduler, node) if held[0].startswith(f"{namespace}/light-0")]
    assert [milli for _, _, milli in before] == [150], "placed at its family's need, below the 400 it asked"
    first.close()

    second = start_scheduler(testbed, options)
    after = [held for held in held_on(second.scheduler, node) if held[0].startswith(f"{namespace}/light-0")]
    assert [(gpus, milli) for _, gpus, milli in after] == [(gpus, milli) for _, gpus, milli in before]
    assert not warnings_of(kube, namespace, "light-0", UNTRUSTED), "its own record is no forgery"
    engine = second.scheduler.engine
    assert engine is not None
    (restored,) = [a for a in engine.book.allocations.values() if a.name.startswith(f"{namespace}/light-0")]
    assert restored.request.profile is not None
    assert restored.request.profile.key == JobKey(f"{namespace}/light"), "judged by its family's use again"
    # by what light-0 was granted (15 %), heavy-0's 85 % would fit the 100 % rule beside it; by light's use (20 %)
    # it does not, before the restart or after
    create_pod(kube, namespace, "heavy-0", {"kubecell.io/gpu-milli": "850", "kubecell.io/gpu-memory": "1000"})
    wait_for("the heavy share to be bound", lambda: node_and_gpus(kube, namespace, "heavy-0"))
    light, heavy = (gpu_of(pod(kube, namespace, name)) for name in ("light-0", "heavy-0"))
    assert light == (node, before[0][1][0])
    assert heavy != light, "20 % + 85 % is above the limit"
    assert not warnings_of(kube, namespace, "light-0", UNTRUSTED)


def test_a_record_edited_below_its_familys_need_is_counted_at_what_the_pod_asks(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """On a cluster without deploy/admission a pod's owner can edit its record. A lower grant is believed for a
    share kubecell alone counts, but a restarted scheduler counts it no lower than its family needs: an edit to
    1 milli is counted at the 400 the pod asks (else its VC would be charged nothing and its GPU packed past
    what it runs with); an edit to 200, above the family's 150, is what kubecell could have granted itself."""
    options = SchedulerOptions(knowledge=Families(), place_by_use=True)
    first = start_scheduler(testbed, options)
    share = {"sharedgpu/gpu_request": "0.4", "sharedgpu/gpu_mem": str(1000 * 1024 * 1024)}
    for name in ("light-0", "light-1"):
        create_pod(kube, namespace, name, {}, labels=share)
    nodes: dict[str, str] = {}
    for name in ("light-0", "light-1"):
        nodes[name] = wait_for(f"{name} to be bound", functools.partial(node_and_gpus, kube, namespace, name))
    first.close()
    for name, milli in (("light-0", 1), ("light-1", 200)):
        record = json.loads(pod(kube, namespace, name)["metadata"]["annotations"][ANNOTATION_ALLOCATION])
        for gpu in record["gpus"]:
            gpu["milli"] = milli
        write_record(kube, namespace, name, json.dumps(record))

    second = start_scheduler(testbed, options)
    held = {name: [milli for held_name, _, milli in held_on(second.scheduler, node)
                   if held_name.startswith(f"{namespace}/{name}")] for name, node in nodes.items()}
    assert held == {"light-0": [400], "light-1": [200]}
