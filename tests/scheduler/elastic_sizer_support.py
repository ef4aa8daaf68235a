"""What the ElasticJob sizer's tests share: an ElasticJob's worker pods, a sizer whose API writes are recorded
(its decisions are the real ones), and a running job whose workers write step reports."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from kubecell.core.engine.job import Job
from kubecell.kube.kept_holds import HoldStore
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.step_reports import build_step_report
from kubecell.scheduler.elastic import ElasticSizer
from kubecell.scheduler.elastic_sized import Sized
from tests.core.support import engine, make_nodes
from tests.scheduler.test_shrink_pods import Loop
from tests.scheduler.trust_support import pod_body

OWNER = {"apiVersion": "kubecell.io/v1alpha1", "kind": "ElasticJob", "name": "bert", "uid": "job-uid",
         "controller": True}


def worker(index: int, *, vc: str = "b", size: int = 2) -> dict[str, Any]:
    gang = {"kubecell.io/vc": vc, "kubecell.io/group": "bert", "kubecell.io/group-size": str(size),
            "kubecell.io/group-min": "1", "kubecell.io/group-max": "4"}
    body = pod_body("ns", f"bert-worker-{index}", {"nvidia.com/gpu": "4"}, annotations=gang)
    body["metadata"].update(uid=f"uid-{index}", creationTimestamp="1970-01-01T00:00:00Z", ownerReferences=[OWNER])
    body["status"] = {"phase": "Pending"}
    return body


class MemoryHoldStore(HoldStore):
    """The holds' ConfigMap as its data alone (what the sizer writes to it is the real thing)."""

    def __init__(self) -> None:
        super().__init__(None, "kubecell-system")  # type: ignore[arg-type]
        self.data: dict[str, str] = {}
        self.writes: list[dict[str, str | None]] = []

    def read(self) -> dict[str, Any]:
        return dict(self.data)

    def write(self, changes: Mapping[str, str | None]) -> None:
        self.writes.append(dict(changes))
        for key, value in changes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value


class RecordingSizer(ElasticSizer):
    """The sizer with its API writes recorded (the decisions are the real ones)."""

    def __init__(self, **spec: Any) -> None:
        super().__init__(None, "kubecell", pending_grace_seconds=60.0)  # type: ignore[arg-type]
        self.written: list[tuple[int, str]] = []
        self.events: list[tuple[str, str]] = []
        self.spec = spec
        self.kept: str | None = None
        """What the job's ``status.gpuModel`` holds (the API server's copy)."""
        self.pins_written: list[str] = []
        self.model_kept: Any = None
        """What the job's ``status.goodputModel`` holds."""
        self.models_written: list[dict[str, Any]] = []
        self.store = MemoryHoldStore()
        """The holds' ConfigMap."""
        self.hold_store = self.store
        self.deleted: set[str] = set()
        """Names of ElasticJobs that are gone."""
        self.conditions: list[dict[str, Any]] = []
        """What the job's ``status.conditions`` holds (the sizer's, through the real ``_say``)."""
        self.status_patches: list[dict[str, Any]] = []

    def _get(self, ref: Any) -> dict[str, Any]:
        return {"metadata": {"name": "bert", "namespace": "ns", "uid": "job-uid"},
                "spec": {"minReplicas": 1, "maxReplicas": 4, "replicas": 2, "batchSize": {"min": 64, "max": 1024},
                         "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}, **self.spec},
                "status": {"conditions": copy.deepcopy(self.conditions)}}

    def _patch_as_read(self, ref: Any, subresource: str, current: Mapping[str, Any], body: dict[str, Any]) -> None:
        if subresource != "status":  # a test that gives the sizer a Kube of its own and the real ``_write``
            super()._patch_as_read(ref, subresource, current, body)
            return
        assert set(body) == {"status"}, "only the status comes through here"
        assert set(body["status"]) == {"conditions"}, "and of it only the conditions"
        self.status_patches.append(body)
        self.conditions = copy.deepcopy(body["status"]["conditions"])

    def condition(self, kind: str) -> tuple[str, str] | None:
        """The (status, reason) of the job's condition of that type, if any."""
        found = next((c for c in self.conditions if c["type"] == kind), None)
        return None if found is None else (found["status"], found["reason"])

    def _write(self, sized: Sized, target: int, reason: str) -> bool:
        self.written.append((target, reason))
        return True

    def _read_pin(self, ref: Any) -> str | None:
        return self.kept

    def _write_pin(self, ref: Any, model: str) -> bool:
        self.pins_written.append(model)
        self.kept = model
        return True

    def _exists(self, ref: Any) -> bool | None:
        return ref.name not in self.deleted

    def _read_model(self, ref: Any) -> Any:
        return json.loads(json.dumps(self.model_kept))  # as the API server hands it back

    def _write_model(self, sized: Sized, value: dict[str, Any]) -> bool:
        self.models_written.append(value)
        self.model_kept = value
        return True

    def _event(self, involved: Any, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def running_job(loop: Loop) -> Job:
    (name,) = [name for name in loop.state.engine.running if "bert" in name]
    return loop.state.engine.jobs[name]


def hold(loop: Loop, name: str, vc: str, gpus: int) -> None:
    """A plain pod of ``vc`` asking ``gpus`` GPUs."""
    body = pod_body("ns", name, {"nvidia.com/gpu": str(gpus)}, annotations={"kubecell.io/vc": vc})
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="1970-01-01T00:00:00Z")
    body["status"] = {"phase": "Pending"}
    loop.add(body)


def report_from_both(loop: Loop, at: float, *, replicas: int, local: int, step: float, var: float,
                     most: int | None = None) -> None:
    """Both workers' pods carry a fresh report of the job at ``replicas`` x ``local`` (``most``: the largest
    micro-batch its script says it fits)."""
    text = build_step_report(time=at, replicas=replicas, nodes=1, local_batch=local, accumulation_steps=1,
                             step_seconds=step, sync_seconds=step / 8, grad_sqr=1.0, grad_var=var, steps=10,
                             max_local_batch=most)
    for uid in ("uid-0", "uid-1"):
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = text
        loop.mirror.pods[uid] = body


def reporting_job() -> Loop:
    """A running ElasticJob of two workers (their reports are written by ``report_from_both``)."""
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop = Loop(eng)
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    return loop
