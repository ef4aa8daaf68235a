"""What the scheduler's ElasticJob sizer tells: Events on jobs and pods, logs told once, and its counters.

Why apart from ``scheduler.elastic``: deciding sizes and telling about them change for different reasons (a new
Event, a metric, a log policy), and every problem the sizer meets is told the same way: once per job (or pod) and
kind of problem, as a Warning Event where a user can act on it, and as debug lines after that, since the sizer
decides again at every pass and a lasting problem would otherwise be told at every pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubecell.kube import elasticjobs, pods
from kubecell.kube.actions import event_body
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.observe.recorder import Recorder

log = logging.getLogger("kubecell.scheduler.elastic")


class SizerTelling:
    """The sizer's telling (a base of ``ElasticSizer``, which sets the attributes below)."""

    kube: Kube
    component: str
    recorder: Recorder | None

    def _count_report(self, outcome: str) -> None:
        if self.recorder is not None:
            self.recorder.step_reports.labels(outcome).inc()

    def _mixed(self, sized: Sized, models: Sequence[str]) -> None:
        """One Warning Event on the ElasticJob whose workers run on several GPU models: data-parallel training
        steps at the pace of its slowest GPU, and no goodput model prices such a placement, so the job only
        takes idle capacity from then on."""
        key = ("", "MixedGpuModels")
        if key in sized.told:
            return
        sized.told.add(key)
        self._event(job_involved(sized.ref), "Warning", "MixedGpuModels",
                    f"workers run on several GPU models ({', '.join(models)}): the training steps at the pace of "
                    "the slowest, and kubecell cannot price its growth. kubecell keeps a gang of whole-GPU "
                    "workers on one model (its gang was placed otherwise before, or its workers ask for GPU "
                    "shares); name one model in the template (kubecell.io/gpu-models, a nodeSelector) to have it "
                    "sized on goodput")

    def _tell(self, sized: Sized, pod: Mapping[str, Any], reason: str, message: str, now: float) -> None:
        """A step report refused: kept for the job's ``StepReports`` condition every time, told in a Warning
        Event on the pod once per pod and kind of problem."""
        meta = pod.get("metadata") or {}
        sized.reports.refused(now, reason, str(meta.get("name", "")), message)
        key = (pods.uid(pod), reason)
        if key in sized.told:
            return
        sized.told.add(key)
        involved = {"apiVersion": "v1", "kind": "Pod", "name": str(meta.get("name", "")),
                    "namespace": str(meta.get("namespace", "default")), "uid": pods.uid(pod)}
        self._event(involved, "Warning", reason, f"{message}; the report is ignored by kubecell's goodput model")

    def _unreadable(self, sized: Sized, error: ApiError) -> None:
        """The job could not be read to make its model: logged once per kind of error, then as debug lines."""
        key = ("", f"unreadable:{error.status}")
        if key in sized.told:
            log.debug("ElasticJob %s/%s unreadable: %s", sized.ref.namespace, sized.ref.name, error)
            return
        sized.told.add(key)
        log.warning("ElasticJob %s/%s unreadable (%s): its goodput model is made at a later report, once the API "
                    "answers (told once)", sized.ref.namespace, sized.ref.name, error)

    def _refused(self, sized: Sized, what: str, error: Exception) -> None:
        """A write the API refused: logged and told in a Warning Event on the job once per kind of refusal
        (the sizer decides again at every pass, so a lasting refusal, such as RBAC without
        ``deploy/elastic/rbac.yaml``, would otherwise be logged at every pass); later ones are debug lines."""
        kind = f"{type(error).__name__}:{getattr(error, 'status', '')}"
        key = ("", f"refused:{kind}")
        if key in sized.told:
            log.debug("%s: %s", what, error)
            return
        sized.told.add(key)
        log.warning("%s: %s (told once per kind of refusal)", what, error)
        self._event(job_involved(sized.ref), "Warning", "ResizeRefused",
                    f"{what}: {str(error)[:400]}; kubecell keeps deciding and will write once the API accepts")

    def _count_move(self) -> None:
        if self.recorder is not None:
            self.recorder.elastic_moves.inc()

    def _count_start(self, after: str) -> None:
        if self.recorder is not None:
            self.recorder.elastic_starts.labels(after).inc()

    def _event(self, involved: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        namespace = str(involved.get("namespace") or "default")
        body = event_body(involved, namespace, event_type=kind, reason=reason, message=message,
                          component=self.component, action="Schedule")
        try:
            self.kube.create(f"/api/v1/namespaces/{namespace}/events", body)
        except ApiError as error:
            log.warning("cannot write Event %s: %s", reason, error)


def job_involved(ref: ElasticRef) -> dict[str, str]:
    """The ElasticJob an Event is about, from what its pods name (no GET needed)."""
    return {"apiVersion": elasticjobs.API_VERSION, "kind": elasticjobs.KIND, "name": ref.name,
            "namespace": ref.namespace, "uid": ref.uid}
