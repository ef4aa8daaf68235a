"""Claims the kubelet never unprepares: found in the API, and released after a grace period.

The kubelet unprepares a claim when the last pod using it on the node is gone, and keeps its own checkpoint
so that it does so after a restart too. Some claims are never unprepared all the same: a node whose kubelet
state was wiped (``/var/lib/kubelet`` reset, a node re-imaged with the agent's state kept), a pod force-deleted
while the kubelet was down and its claim deleted before the kubelet came back. Each such claim stayed in the
checkpoint for good, with its CDI spec and, for a share under MPS, the hold that keeps its GPU's MPS daemon
running: the checkpoint grew without bound on a long-lived node, and a GPU kept a daemon nobody used.

The sweeper lists the pods bound to this node (one LIST, by field selector): a claim one of them that is
running names (in ``status.resourceClaimStatuses`` or ``spec.resourceClaims``) is in use, and the kubelet
unprepares it when that pod is done. Only the others (none, on a healthy node) are asked about, one GET each, so
that a node of many shares costs the API server one LIST per sweep, not a GET per claim. (A pod names a claim by
name only, so an old claim deleted and its name taken again must not pass for the new one: the claims of pods
still Pending, whose prepare may be failing on the old claim's devices, are asked about, and so are two prepared
claims of one name.) A claim is unused when it is gone (404), when another claim has its name (another UID), or
when it holds none of this driver's devices in this node's pool any more (deallocated, or allocated elsewhere):
no pod can be running with it then, since a claim stays allocated while a pod reserves it. An unused claim is
released only once it has been seen unused for ``grace_seconds`` without a break (ten minutes by default: the
kubelet's own unprepare has that long, and a claim deallocated and allocated here again is seen in use in
between). Where the API server cannot be asked (unreachable, forbidden), nothing is released: the sweeper never
releases on an answer it did not get.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubecell.kube import dra_names as names
from kubecell.kube.pods import TERMINAL_PHASES
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra.checkpoint import ClaimRef
from kubecell.node.dra.prepared import ClaimPreparer
from kubecell.node.overuse import api_pods

log = logging.getLogger("kubecell.node.dra")

DEFAULT_GRACE_SECONDS = 600.0


class ClaimSweeper:
    """Releases prepared claims that the API says are no longer in use on this node (see the module)."""

    def __init__(self, kube: Kube, node: str, preparer: ClaimPreparer, *,
                 grace_seconds: float = DEFAULT_GRACE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.node = node
        self.asked = 0
        """Claims asked about (GETs), for the tests and the log."""
        self.preparer = preparer
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.unused_since: dict[str, float] = {}
        """Claim UID -> when it was first seen unused (in this run of unbroken sightings)."""

    def sweep(self) -> list[ClaimRef]:
        """Ask about every prepared claim (outside the preparer's lock); release those unused for the grace
        period. The claims released."""
        released: list[ClaimRef] = []
        prepared = self.preparer.prepared_claims()
        if not prepared:
            return released
        try:
            named = claims_named(api_pods(self.kube, self.node)())
        except (ApiError, KeyError, TypeError) as error:
            log.debug("sweeping prepared claims: the node's pods cannot be listed (%s); next time", error)
            return released
        # A pod names a claim by name, not UID: where this node prepared two claims of one name (one deleted
        # and made again while the kubelet could not unprepare it), a pod naming it vouches for neither.
        crowded = {key for key, count in Counter((ref.namespace, ref.name) for ref in prepared).items() if count > 1}
        for ref in prepared:
            key = (ref.namespace, ref.name)
            why = None if key in named and key not in crowded else self._unused(ref)
            if why is None:
                self.unused_since.pop(ref.uid, None)
                continue
            if not why:  # no answer: nothing learnt either way
                continue
            now = self.clock()
            since = self.unused_since.setdefault(ref.uid, now)
            if now - since < self.grace_seconds:
                continue
            if self.preparer.release_unused(ref):
                log.warning("released ResourceClaim %s/%s (%s), prepared on this node and never unprepared by the "
                            "kubelet: %s for %.0f s", ref.namespace, ref.name, ref.uid, why, now - since)
                released.append(ref)
            self.unused_since.pop(ref.uid, None)
        known = {ref.uid for ref in prepared}
        for uid in [uid for uid in self.unused_since if uid not in known]:  # unprepared by the kubelet meanwhile
            del self.unused_since[uid]
        return released

    def _unused(self, ref: ClaimRef) -> str | None:
        """Why the claim is unused on this node; None when it is in use; "" when the API did not answer."""
        self.asked += 1
        try:
            claim = self.kube.get(names.claim_path(ref.namespace, ref.name))
        except ApiError as error:
            if error.not_found:
                return "the claim is gone"
            log.debug("sweeping ResourceClaim %s/%s: %s; asked again next time", ref.namespace, ref.name, error)
            return ""
        if _field(claim, "metadata").get("uid") != ref.uid:
            return "the claim is gone (another claim has its name)"
        results = _field(_field(_field(claim, "status"), "allocation"), "devices").get("results")
        if not isinstance(results, list) or not any(
                isinstance(r, Mapping) and r.get("driver") == names.DRIVER and r.get("pool") == self.node
                for r in results):
            return f"the claim holds no {names.DRIVER} device of this node any more"
        return None


def _field(obj: Any, key: str) -> Mapping[str, Any]:
    """``obj[key]`` where both are mappings, else empty: a claim read as it is, whatever its shape."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def claims_named(pods: Iterable[Any]) -> set[tuple[str, str]]:
    """(namespace, claim name) of every ResourceClaim the pods that have started name: the claims made for them
    from templates (``status.resourceClaimStatuses``) and those they name directly (``spec.resourceClaims``).
    A pod still Pending (or without a phase) vouches for nothing: its claim may be the one whose prepare fails
    because an old claim of the same name still holds the devices, and that old one must not be kept for it. Nor
    does a pod that has finished (Succeeded, Failed): it runs nothing on its claim, and its object may be kept
    for as long as its Job, while a kubelet that lost its state never unprepares the claim."""
    named: set[tuple[str, str]] = set()
    for pod in pods:
        if not isinstance(pod, Mapping) or _field(pod, "status").get("phase") in (None, "Pending", *TERMINAL_PHASES):
            continue
        namespace = str((pod.get("metadata") or {}).get("namespace", ""))
        listed = [*((pod.get("status") or {}).get("resourceClaimStatuses") or []),
                  *((pod.get("spec") or {}).get("resourceClaims") or [])]
        named |= {(namespace, str(entry["resourceClaimName"])) for entry in listed
                  if isinstance(entry, Mapping) and entry.get("resourceClaimName")}
    return named
