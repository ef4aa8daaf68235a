"""The conditions the scheduler's sizer keeps on an ElasticJob, beside the two its controller writes.

An Event says what happened, once. A condition says what is true now, where ``kubectl describe`` and
``kubectl wait`` look. Some bad input only the sizer sees: a job whose ``maxReplicas`` no VC could ever hold,
workers that report nonsense, or workers that never report. Until this module such a job got a Warning Event
and nothing in its status, so nothing showed later that it was sized by capacity alone. The controller writes
other writers' conditions back (``elastic.status.foreign_conditions``), so the sizer's two types live in the
same list:

* ``MaxReplicasReachable``: False (``MaxReplicasUnreachable``) where the cluster could never hold
  ``maxReplicas`` workers of the job's shape at once. The job grows only as far as capacity allows.
* ``StepReports``: False, with the problem's reason (``UntrustedReport``, ``MalformedReport``, ``StaleReport``
  ...), while a report of the job has been refused within the last ``report_max_age_seconds``. False
  (``NoStepReports``) once its gang has run that long without a report the goodput model took. True
  (``Trusted``) once the model takes its reports again.

A condition is written only when its status or reason changes. A True is written only in place of a False: a
job that reports well and fits the cluster carries neither condition, and its status is never written for
them. How the write is made, a GET and then a merge patch carrying the resourceVersion read, so that a
controller's write in between is never lost, is ``SizerStatus._say``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubecell.kube import conditions as built

CONDITION_STEP_REPORTS: Final = "StepReports"
CONDITION_MAX_REACHABLE: Final = "MaxReplicasReachable"
REASON_NO_REPORTS: Final = "NoStepReports"
REASON_TRUSTED: Final = "Trusted"
REASON_REACHABLE: Final = "Reachable"
REASON_UNREACHABLE: Final = "MaxReplicasUnreachable"
MAX_CONDITIONS: Final = 16
"""The CRD's ``maxItems`` for ``status.conditions``: a condition that would make the list longer is not added."""


@dataclass(frozen=True)
class Said:
    """One of the sizer's conditions as it should stand on the job."""

    kind: str
    true: bool
    reason: str
    message: str

    @property
    def key(self) -> tuple[bool, str]:
        """What a change of the condition is: its status or its reason (a new message alone is not written)."""
        return self.true, self.reason


def merged(listed: object, said: Said, stamp: str) -> list[dict[str, Any]] | None:
    """The job's ``status.conditions`` (``listed``, as read) with ``said`` in place of the condition of its type,
    or None where there is nothing to write: that status and reason are there already, ``said`` is True and no
    condition of its type is there, or the list is full. The transition time moves only when the status does,
    as ``metav1.Condition`` asks."""
    conditions = [dict(c) for c in (listed if isinstance(listed, list) else []) if isinstance(c, Mapping)]
    index = next((i for i, c in enumerate(conditions) if c.get("type") == said.kind), None)
    before = conditions[index] if index is not None else None
    status = "True" if said.true else "False"
    if before is None and said.true:
        return None
    if before is not None and (before.get("status"), before.get("reason")) == (status, said.reason):
        return None
    condition = built.condition(said.kind, said.true, said.reason, said.message, stamp, previous=before)
    if index is not None:
        conditions[index] = condition
    elif len(conditions) >= MAX_CONDITIONS:
        return None
    else:
        conditions.append(condition)
    return conditions


def reach(members: int, reachable: bool) -> Said:
    """``MaxReplicasReachable`` for a job of at most ``members`` workers."""
    if reachable:
        return Said(CONDITION_MAX_REACHABLE, True, REASON_REACHABLE,
                    f"the cluster could hold maxReplicas {members} workers of this shape")
    return Said(CONDITION_MAX_REACHABLE, False, REASON_UNREACHABLE,
                f"maxReplicas {members}: the cluster could never hold that many workers of this shape at once; "
                "the job grows only as far as capacity allows")


@dataclass
class ReportsSeen:
    """What the sizer saw of one job's step reports, for its ``StepReports`` condition."""

    refused_at: float = float("-inf")
    refused_reason: str = ""
    refused_message: str = ""
    taken: bool = False
    """Whether its goodput model took a report (or was kept in its status by an earlier scheduler)."""

    def refused(self, now: float, reason: str, pod: str, message: str) -> None:
        self.refused_at, self.refused_reason = now, reason
        self.refused_message = f"pod {pod}: {message}"

    def condition(self, running_since: float | None, now: float, window: float) -> Said | None:
        """The ``StepReports`` condition for a job whose gang runs since ``running_since`` (None: it does not
        run), with reports refused within ``window`` seconds counting; None where there is nothing to say
        yet (a new job's reports may still come)."""
        if now - self.refused_at <= window:
            return Said(CONDITION_STEP_REPORTS, False, self.refused_reason,
                        f"a step report was refused ({self.refused_message}); kubecell's goodput model ignores "
                        f"such reports and sizes the job on the ones it trusts (said until {window:g} s pass "
                        "without a refusal)")
        if self.taken:
            return Said(CONDITION_STEP_REPORTS, True, REASON_TRUSTED,
                        "kubecell's goodput model takes the workers' step reports")
        if running_since is not None and now - running_since >= window:
            return Said(CONDITION_STEP_REPORTS, False, REASON_NO_REPORTS,
                        f"no step report that kubecell could use in {now - running_since:.0f} s of running: the job "
                        "is sized by capacity alone, not by goodput (a training script reports its steps with "
                        "kubecell.elastic.report.StepReporter)")
        return None
