"""``metav1.Condition`` as kubecell writes it on the objects whose status it shares with others: the
VirtualClusters' ``Accepted`` verdict, the ElasticJob controller's ``Accepted`` and ``Available``, the scheduler's
``StepReports`` and ``MaxReplicasReachable`` on the same ElasticJobs.

One builder, because the rule is the API's, not any one writer's: ``lastTransitionTime`` moves only when the
status does (``metav1.Condition``: "the last time the condition transitioned from one status to another"), and
what is carried over from the object as read must be a time the CRDs' schema accepts (``format: date-time``).
Whatever the object held there was written by whoever may write its status, or stored under an older CRD
without the schema; carried over unchecked, it made the API server refuse kubecell's write at every attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kubecell.kube.clock import is_api_time

MAX_MESSAGE: Final = 32768
"""``metav1.Condition``'s message limit."""


def condition(kind: str, true: bool, reason: str, message: str, now: str, *,
              previous: Mapping[str, Any] | None = None, generation: int | None = None) -> dict[str, Any]:
    """The condition ``kind`` as ``true`` or false, ``previous`` its last version as read (None: none yet);
    ``observedGeneration`` written where ``generation`` is given."""
    status = "True" if true else "False"
    since = previous.get("lastTransitionTime") if previous is not None and previous.get("status") == status else None
    body: dict[str, Any] = {"type": kind, "status": status}
    if generation is not None:
        body["observedGeneration"] = generation
    body.update(lastTransitionTime=since if is_api_time(since) else now, reason=reason, message=message[:MAX_MESSAGE])
    return body
