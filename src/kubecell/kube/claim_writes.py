"""Writing a ResourceClaim's allocation, and taking it back, the way kube-scheduler's DRA plugin does.

kube-scheduler allocates a claim in two writes before the pod's Binding: the claim gets the finalizer
``resource.kubernetes.io/delete-protection`` (so it cannot vanish while allocated), then its status gets
``allocation`` and ``reservedFor`` (the pod). When the last consumer is gone, kube-controller-manager's
resourceclaim controller removes it from ``reservedFor``, clears ``allocation`` and drops the finalizer,
for claims allocated by any scheduler; kubecell relies on that for pods that ended, and takes back itself
only what it wrote for a pod that was never bound (a failed Binding, or a crash between the claim's write
and the Binding, found after a restart).

Every write is a PUT with the resourceVersion just read: a claim someone else changed in between makes the
write fail with a conflict instead of overwriting their allocation, so a device is never allocated twice.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.kube.dra.allocation import reserved_for
from kubecell.kube.dra_names import claim_path
from kubecell.kube.rest import ApiError, Kube

FINALIZER = "resource.kubernetes.io/delete-protection"
"""``k8s.io/api/resource/v1.Finalizer``: set on every claim a scheduler allocates."""


class ClaimConflict(KubecellError):  # noqa: N818 - a state the claim is in, as ApiError.conflict
    """The claim is not as the decision found it: replaced, deleted, or allocated by someone else."""


def _devices(allocation: Mapping[str, Any] | None) -> list[tuple[str, str, str, str]]:
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return sorted((str(r.get("request")), str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                  for r in results if isinstance(r, Mapping))


def allocate(kube: Kube, namespace: str, name: str, uid: str, allocation: Mapping[str, Any],
             pod: Mapping[str, Any], *, seen: Mapping[str, Any] | None = None) -> None:
    """Allocate the claim to the pod: the finalizer, then ``status.allocation`` and ``reservedFor``.

    ``seen``: the claim as the caller's watch last saw it, written against without reading it first (two
    writes instead of three); when it turns out stale (a 409), the claim is read and the writes made once
    more. Idempotent for the same decision (a retry after a lost answer finds the claim allocated to these
    devices and reserved for this pod, and writes nothing). Raises ``ClaimConflict`` for a claim replaced
    (other uid), deleted, or allocated otherwise; ``ApiError`` for the API server's own errors."""
    if seen is not None:
        try:
            _allocate(kube, namespace, name, uid, allocation, pod, seen)
            return
        except ApiError as error:
            if not error.conflict:
                raise
    path = claim_path(namespace, name)
    try:
        current = kube.get(path)
    except ApiError as error:
        if error.not_found:
            raise ClaimConflict(f"ResourceClaim {namespace}/{name} is gone") from None
        raise
    _allocate(kube, namespace, name, uid, allocation, pod, current)


def _allocate(kube: Kube, namespace: str, name: str, uid: str, allocation: Mapping[str, Any],
              pod: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    path = claim_path(namespace, name)
    meta = current.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimConflict(f"ResourceClaim {namespace}/{name} was replaced (uid {meta.get('uid')}, decided "
                            f"for {uid})")
    if meta.get("deletionTimestamp"):
        raise ClaimConflict(f"ResourceClaim {namespace}/{name} is being deleted")
    status = current.get("status") or {}
    me = reserved_for(pod)
    if status.get("allocation"):
        reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
        if _devices(status["allocation"]) == _devices(allocation) and any(r.get("uid") == me["uid"] for r in reserved):
            return
        raise ClaimConflict(f"ResourceClaim {namespace}/{name} is already allocated "
                            f"({', '.join(d[3] for d in _devices(status['allocation']))})")
    written: dict[str, Any] = copy.deepcopy(dict(current))
    if FINALIZER not in (meta.get("finalizers") or []):
        written["metadata"]["finalizers"] = [*(meta.get("finalizers") or []), FINALIZER]
        written = kube.replace(path, written)
    written["status"] = {**(written.get("status") or {}), "allocation": dict(allocation), "reservedFor": [me]}
    kube.replace(f"{path}/status", written)


def release(kube: Kube, namespace: str, name: str, uid: str, pod_uid: str) -> bool:
    """Take back the claim's reservation for pod ``pod_uid`` (a pod kubecell allocated it for but never
    bound); with no consumer left the allocation is cleared and the finalizer dropped, as the resourceclaim
    controller does. Returns whether anything was written; a claim gone or replaced needs nothing."""
    path = claim_path(namespace, name)
    try:
        current = kube.get(path)
    except ApiError as error:
        if error.not_found:
            return False
        raise
    meta = current.get("metadata") or {}
    status = current.get("status") or {}
    reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
    if meta.get("uid") != uid or not status.get("allocation"):
        return False
    remaining = [r for r in reserved if r.get("uid") != pod_uid]
    if len(remaining) == len(reserved) and reserved:
        return False  # reserved for others only: not ours to take back
    current = copy.deepcopy(current)
    current["status"] = {**status, "reservedFor": remaining}
    if not remaining:
        current["status"].pop("allocation", None)
        current["status"].pop("reservedFor", None)
    current = kube.replace(f"{path}/status", current)
    finalizers = (current.get("metadata") or {}).get("finalizers") or []
    if not remaining and FINALIZER in finalizers:
        current = copy.deepcopy(current)
        current["metadata"]["finalizers"] = [f for f in finalizers if f != FINALIZER]
        kube.replace(path, current)
    return True
