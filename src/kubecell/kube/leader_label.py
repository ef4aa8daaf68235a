"""The leader's label on its own Pod, so that a Service sends kube-scheduler's extender calls to it alone.

Both replicas are Ready (readiness is ``/healthz``: a leader-only readiness would stall rollouts under the
PodDisruptionBudget, see ``deploy/base/deployment.yaml``), so a Service selecting both sends about half of
kube-scheduler's calls to the standby, which answers 503. Instead the leader labels its own Pod
``kubecell.io/leader=true`` and the Service ``kubecell-extender`` (``deploy/extender``) selects that label
too: its endpoints are the leader's Pod alone.

The label follows the Lease and never leads it. A replica labels its Pod only while it holds the Lease,
and then takes the label off every other Pod of its namespace (a leader that crashed, or a replica that
restarted in a Pod that once led); it takes its own label off when it stops leading, and at start. While
it leads it checks the labels again every ``resync`` seconds (one LIST by label selector), so a write lost
to an API outage, or a label edited by hand, is repaired. Every write is a JSON merge patch retried a few
times on an unavailable API server; a failure is logged and the scheduler goes on: all it costs is the
503s the label is there to avoid.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kubecell.kube.actions import retry
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.leader")

LABEL = "kubecell.io/leader"
VALUE = "true"
SELECTOR = f"{LABEL}={VALUE}"
"""The label selector of the leader's Pod (``kubecell-extender`` selects it with the app's name)."""
ATTEMPTS = 3
"""Tries of one write when the API server is unavailable (0.2 s, then 0.4 s apart)."""


@dataclass(frozen=True)
class PodRef:
    """This replica's own Pod, as the Downward API names it (``POD_NAMESPACE``, ``POD_NAME``)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class LeaderLabel:
    """Keep ``kubecell.io/leader=true`` on ``pod`` while this replica leads, and on no other Pod beside it."""

    def __init__(self, kube: Kube, pod: PodRef, *, resync: float = 15.0) -> None:
        self.kube = kube
        self.pod = pod
        self.resync = resync

    def _pods(self) -> str:
        return f"/api/v1/namespaces/{self.pod.namespace}/pods"

    def _set(self, name: str, value: str | None) -> bool:
        """Label the Pod ``name`` (``value``) or take the label off (``None``); False when that failed."""
        what = f"{'label' if value else 'unlabel'} pod {self.pod.namespace}/{name} {LABEL}"
        body = {"metadata": {"labels": {LABEL: value}}}  # a merge patch: null deletes the key
        try:
            retry(what, lambda: self.kube.patch(f"{self._pods()}/{name}", body, kind="merge"), attempts=ATTEMPTS)
        except ApiError as error:
            if error.not_found and value is None:
                return True  # the Pod is gone, and its label with it
            hint = (" (is POD_NAME/POD_NAMESPACE this replica's Pod?)" if error.not_found and name == self.pod.name
                    else " (the ServiceAccount needs patch on pods)" if error.status == 403 else "")
            log.warning("%s: %s%s", what, error, hint)
            return False
        log.info("%s", what)
        return True

    def mark(self, leading: Callable[[], bool] = lambda: True) -> bool:
        """Label this replica's Pod and take the label off any other Pod of its namespace; True when the
        labels are as they should be. Writes nothing once ``leading()`` turns false."""
        try:
            labelled = retry(f"list pods {self.pod.namespace} {SELECTOR}",
                             lambda: self.kube.get(self._pods(), labelSelector=SELECTOR), attempts=ATTEMPTS)
        except ApiError as error:
            log.warning("list pods %s labelled %s: %s", self.pod.namespace, SELECTOR, error)
            return False
        names = {pod["metadata"]["name"] for pod in labelled.get("items") or []}
        done = True
        if self.pod.name not in names and leading():
            done = self._set(self.pod.name, VALUE)
        for stale in sorted(names - {self.pod.name}):  # a former leader that did not take its label off
            if leading():
                done = self._set(stale, None) and done
        return done and leading()

    def unmark(self) -> bool:
        """Take the label off this replica's Pod (best effort: logged when it fails)."""
        return self._set(self.pod.name, None)

    def run(self, leading: Callable[[], bool], done: threading.Event) -> None:
        """While ``leading()``: mark at once, then again every ``resync`` seconds, until ``done``."""
        while not done.is_set():
            if leading():
                self.mark(leading)
            done.wait(self.resync)
