"""Pods that ask for GPUs through DRA ResourceClaims, in the scheduler: read into the engine's request,
allocated in their claims before the Binding, and claims others allocated held.

A pod's claims of kubecell's device classes become the GPU part of its ``PodDemand`` (whole GPUs, one share
by ``capacity.requests``, or MIG instances) and ``PodDemand.devices``, the GPUs its selectors accept, by
UUID as the node's inventory names them. From there it is an ordinary pod: the same engine places it with
its gang, VC guarantee, borrowing and preemption, and its allocation record is written in the same order.
The claims are written after the record and before the Binding (``ClaimBroker.allocate``, in the binder's
writer threads), so a crash in between leaves a claim allocated for an unbound pod, which the next look at
that pod takes back (``take_back``) before placing it again.

Only devices the nodes publish AND the node's inventory confirms count (``Devices``): a slice that names a
UUID the node's inventory does not list, or a node another node's agent published for, gives nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube import claim_writes, pods
from kubecell.kube.actions import event_body
from kubecell.kube.dialects import DemandError, PodDemand
from kubecell.kube.dra.allocation import allocation_status
from kubecell.kube.dra.claims import (
    ClaimDemand,
    ClaimError,
    ClaimOutOfTimeError,
    claim_demand,
    claim_seconds,
    pod_claims,
)
from kubecell.kube.dra.slices import SliceDevices
from kubecell.kube.inventory import NodeView
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.claim_devices import Devices, confirmed_devices
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.foreign_claims import ForeignClaims
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")


DEMAND_CACHE = 4096
"""Claims whose reading is kept (``ClaimBroker._demand``); the cache starts over when full."""


PASS_SELECTOR_SECONDS = 0.2
"""The most time one scheduling pass spends evaluating claims' selectors it has not evaluated before
(``ClaimBroker.selector_pass``). A claim's selectors may take up to ``claim_seconds`` in all (25 s over 8,000
devices, for a selector made to run just under ``cel.DEVICE_SECONDS`` a device); spent at once, that held the
scheduler's only loop, and every other pod's placement, for the claim's whole time, once per new claim. In
slices, the loop goes on placing between them, and the claim's pods wait a few passes more."""


class ClaimsPending(KubecellError):  # noqa: N818 - a state the pod is in, like a gang still forming
    """A claim the pod names does not exist yet (made from a template by kube-controller-manager)."""

    def __init__(self, key: str, message: str, *, told: bool) -> None:
        self.key = key
        self.told = told
        """Worth telling the pod: a claim it names directly is missing (a user's mistake, perhaps). A claim
        from a template is made within moments by kube-controller-manager; like kube-scheduler, which does
        not even queue such a pod, kubecell writes nothing for it meanwhile."""
        super().__init__(message)


class ClaimsDeferred(ClaimsPending):
    """The pass's time for selectors ran out before this claim's were through: the pod is read again at the
    next pass (``started``: this claim's selectors used some of it, so others go first then)."""

    def __init__(self, key: str, message: str, *, started: bool) -> None:
        super().__init__(key, message, told=False)
        self.started = started


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """One of a pod's claims for kubecell's devices, and what it asks for."""

    key: str
    namespace: str
    name: str
    uid: str
    demand: ClaimDemand


class ClaimBroker:
    """Reads pods' claims for the engine, and writes and takes back the claims' allocations."""

    def __init__(self, mirror: Mirror, kube: Kube) -> None:
        self.mirror = mirror
        self.kube = kube
        self._devices: tuple[int, Mapping[str, NodeView], Devices] | None = None
        """(devices version, the views they were confirmed against, the devices): the views are held, not their
        id, so a new engine's views are never mistaken for the old."""
        self.problems_told: set[str] = set()
        self._demands: dict[tuple[bytes, int], ClaimDemand | ClaimError] = {}
        """Each claim spec's reading (by a digest of the spec: a spec may be as large as an object may), per
        devices version."""
        self._spent: dict[tuple[bytes, int], float] = {}
        """Seconds the selectors of a claim spec not through yet have run, over the passes so far."""
        self._slice_reads: dict[tuple[str, str], SliceDevices] = {}
        """Each slice's devices as read, by (uid, resourceVersion): a slice event reads the changed slice again,
        not every device of every node."""
        self._pass: tuple[int, float] | None = None
        """(the thread, the deadline) of the open ``selector_pass``."""
        self._allowed_sets: dict[tuple[frozenset[str] | None, ...], frozenset[tuple[str, int]]] = {}
        """The GPUs claims accept, kept per their accepted UUIDs (one object per claim spec, so the pods of one
        template share one set, and the engine one mask for it)."""
        self.foreign = ForeignClaims(mirror, self.devices)

    # ------------------------------------------------------------------ reading
    def devices(self, views: Mapping[str, NodeView]) -> Devices:
        """The confirmed devices, read again after a change of the slices or of the nodes' views."""
        cached = self._devices
        if cached is None or cached[0] != self.mirror.devices_version or cached[1] is not views:
            devices = confirmed_devices(list(self.mirror.slices.values()), views, self._slice_reads)
            self._demands.clear()  # what was read against the devices before is read again
            self._spent.clear()
            self._allowed_sets.clear()
            for problem in devices.problems:
                if problem not in self.problems_told:
                    if len(self.problems_told) >= DEMAND_CACHE:
                        self.problems_told.clear()
                    self.problems_told.add(problem)
                    log.warning("%s", problem)
                    self._warn_on_slice(problem)
            self._devices = (self.mirror.devices_version, views, devices)
            return devices
        return cached[2]

    def _demand(self, claim: Mapping[str, Any], devices: Devices) -> ClaimDemand:
        """``claim_demand``, kept per claim spec and devices version: the selectors are evaluated over every
        published device, which the claims of one template (all alike) should not pay for each pod."""
        meta = claim.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            spec = json.dumps(claim.get("spec"), sort_keys=True, default=str)
        except RecursionError:  # free-form opaque parameters nested as deep as the API server lets them
            raise ClaimError("is nested deeper than kubecell reads (opaque parameters, most likely)", "spec",
                             claim=f"ResourceClaim {name}") from None
        key = (hashlib.sha256(spec.encode("utf-8", "surrogatepass")).digest(), self.mirror.devices_version)
        found = self._demands.get(key)
        if found is None:
            found = self._evaluate(key, claim, devices, name)
            if len(self._demands) >= DEMAND_CACHE:
                self._demands.clear()
            self._demands[key] = found
        if isinstance(found, ClaimError):
            # Made again for this claim: the one it was kept for may be another namespace's, whose name is not
            # this pod's to see (and a kept exception would gather a traceback at each raise).
            raise ClaimError(found.reason, found.field, claim=f"ResourceClaim {name}", accepted=found.accepted)
        return found if found.claim == name else dataclasses.replace(found, claim=name)

    def _evaluate(self, key: tuple[bytes, int], claim: Mapping[str, Any], devices: Devices,
                  name: str) -> ClaimDemand | ClaimError:
        """``claim_demand`` within what is left of the claim's time and of the open pass's; raises
        ``ClaimsDeferred`` where the pass's ran out first. A refusal is returned, to be kept: a selector that
        ran out of the claim's time is not paid for again until the claim or the devices change."""
        allowed = claim_seconds(len(devices.listed))
        spent = self._spent.get(key, 0.0)
        start = time.monotonic()
        deadline = start + max(allowed - spent, 0.0)
        open_pass = self._pass if self._pass is not None and self._pass[0] == threading.get_ident() else None
        # (a claim whose selectors and results are all kept is read even past the pass's end: they take no time)
        try:
            found: ClaimDemand | ClaimError = claim_demand(
                claim, self.mirror.deviceclasses, devices.listed, deadline=deadline,
                pause_at=open_pass[1] if open_pass is not None else None)
        except ClaimOutOfTimeError as error:
            spent += time.monotonic() - start
            if open_pass is not None and spent < allowed:
                self._spent[key] = spent
                if len(self._spent) > DEMAND_CACHE:
                    self._spent.pop(next(iter(self._spent)))
                raise ClaimsDeferred(name, f"ResourceClaim {name}: its selectors ran {spent:.1f} "
                                     f"s of the {allowed:.1f} s a claim is given; they go on at the next scheduling "
                                     "pass", started=start < open_pass[1]) from None
            found = error
        except ClaimError as error:
            found = error
        self._spent.pop(key, None)
        return found

    @contextlib.contextmanager
    def selector_pass(self, seconds: float | None = None) -> Iterator[None]:
        """Within it, on this thread, claims' selectors run for ``seconds`` in all (None:
        ``PASS_SELECTOR_SECONDS``); a claim not through by then raises ``ClaimsDeferred`` (its progress is kept:
        the per-device results are cached)."""
        self._pass = (threading.get_ident(), time.monotonic() + (PASS_SELECTOR_SECONDS if seconds is None
                                                                  else seconds))
        try:
            yield
        finally:
            self._pass = None

    def _warn_on_slice(self, problem: str) -> None:
        """A Warning Event on the ResourceSlice a problem names (``UntrustedResourceSlice``), once: whoever
        publishes slices sees why kubecell leaves theirs out. Problems of no one slice are logged only."""
        named = re.match(r"ResourceSlice (\S+): ", problem)
        found = self.mirror.slices.get(named.group(1)) if named else None
        if found is None:
            return
        meta = found.get("metadata") or {}
        involved = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "name": meta.get("name"),
                    "uid": meta.get("uid")}
        body = event_body(involved, "default", event_type="Warning", reason="UntrustedResourceSlice",
                          message=problem[:1000], component="kubecell", action="Scheduling")
        try:
            self.kube.create("/api/v1/namespaces/default/events", body)
        except ApiError as error:
            log.warning("cannot record the Event on ResourceSlice %s: %s", meta.get("name"), error)

    def uses(self, pod: Mapping[str, Any], views: Mapping[str, NodeView]) -> list[ClaimUse]:
        """The pod's claims with what each asks for; raises ``ClaimsPending`` for a claim not created yet and
        ``DemandError`` for one kubecell cannot allocate (the reason is the pod's Event)."""
        where = pods.key(pod)
        try:
            named = pod_claims(pod, self.mirror.claims)
        except ClaimError as error:
            raise DemandError(where, "spec.resourceClaims", str(error), field="resourceClaims") from None
        uses = []
        devices = self.devices(views)
        direct = {e.get("name") for e in (pod.get("spec") or {}).get("resourceClaims") or []
                  if isinstance(e, Mapping) and e.get("resourceClaimName")}
        for entry in named:
            if entry.claim is None:
                raise ClaimsPending(entry.key, f"waiting for ResourceClaim {entry.key} ({entry.reason})",
                                    told=entry.pod_claim in direct)
            claim = entry.claim
            meta = claim.get("metadata") or {}
            try:
                demand = self._demand(claim, devices)
            except ClaimError as error:
                raise DemandError(where, f"spec.resourceClaims[{entry.pod_claim}]", str(error),
                                  field="resourceClaims") from None
            uses.append(ClaimUse(entry.key, str(meta.get("namespace", "")), str(meta.get("name", "")),
                                 str(meta.get("uid", "")), demand))
        return uses

    def apply(self, pod: Mapping[str, Any], demand: PodDemand, views: Mapping[str, NodeView]) -> PodDemand:
        """The pod's demand with the GPUs its claims ask for; the demand itself for a pod without claims.
        For a pod not bound yet, a claim allocated for it is taken back first (kubecell's own write whose
        Binding never came). Raises ``ClaimsPending`` or ``DemandError``."""
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return demand
        where = pods.key(pod)
        uses = self.uses(pod, views)
        if not uses:
            return demand
        if demand.request.wants_gpu:
            raise DemandError(where, "spec.resourceClaims", "asks for GPUs both by ResourceClaim and by extended "
                              "resource or annotation", field="resourceClaims",
                              accepted="one way: claims of kubecell's device classes, or resources")
        if not pods.node_of(pod):
            self._take_back_stale(pod, uses)
        count = sum(use.demand.count for use in uses)
        shares = [use for use in uses if use.demand.milli < MILLI_PER_GPU or use.demand.memory_mib]
        migs = {use.demand.mig for use in uses}
        if shares and (len(shares) > 1 or count > 1):
            raise DemandError(where, "spec.resourceClaims", f"asks for {count} devices of which {len(shares)} "
                              "by capacity", field="resourceClaims",
                              accepted="whole GPUs (no capacity requests), or one share of one GPU")
        if len(migs) > 1:
            raise DemandError(where, "spec.resourceClaims", "asks for MIG instances and whole GPUs at once",
                              field="resourceClaims", accepted="claims of one kind of device per pod")
        base = demand.request
        milli = shares[0].demand.milli if shares else MILLI_PER_GPU
        memory = shares[0].demand.memory_mib if shares else 0
        try:
            request = Request(base.name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib, gpu_count=count,
                              gpu_milli=milli, gpu_memory_mib=memory, topology=base.topology)
        except Exception as error:
            raise DemandError(where, "spec.resourceClaims", str(error), field="resourceClaims") from None
        allowed = self._allowed(uses, views)
        isolation = "mig" if True in migs else demand.isolation
        return dataclasses.replace(demand, request=request, isolation=isolation, devices=allowed,
                                   dialects=(*demand.dialects, "dra"))

    def _allowed(self, uses: Sequence[ClaimUse], views: Mapping[str, NodeView]) -> frozenset[tuple[str, int]]:
        """The GPUs (node, index) every claim of the pod accepts, among the confirmed devices (the engine keeps
        one GPU restriction per pod, so each GPU it gives must suit every claim)."""
        devices = self.devices(views)
        key = tuple(use.demand.allowed for use in uses)
        known = self._allowed_sets.get(key)
        if known is not None:
            return known
        accepted = None
        for use in uses:
            mine = {(d.node, devices.slot[d.node, d.uuid]) for d in devices.listed
                    if use.demand.allowed is None or d.uuid in use.demand.allowed}
            accepted = mine if accepted is None else accepted & mine
        if len(self._allowed_sets) >= DEMAND_CACHE:
            self._allowed_sets.clear()
        found = self._allowed_sets[key] = frozenset(accepted or ())
        return found

    def _take_back_stale(self, pod: Mapping[str, Any], uses: Sequence[ClaimUse]) -> None:
        """A claim allocated for this very pod while it is unbound: kubecell's own write whose Binding never
        came (a crash in between, or a failed Binding). Taken back, so the pod is placed afresh. A claim
        allocated for another pod is not this pod's to use: refused (a claim is given to one pod)."""
        uid = pods.uid(pod)
        for use in uses:
            claim = self.mirror.claims.get(use.key) or {}
            status = claim.get("status") or {}
            if not status.get("allocation"):
                continue
            consumers = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping)]
            others = [r for r in consumers if r.get("uid") != uid]
            if others:
                names = ", ".join(str(r.get("name")) for r in others[:3])
                raise DemandError(pods.key(pod), f"ResourceClaim {use.key}", f"is allocated and reserved for pod(s) "
                                  f"{names}; kubecell gives a claim to one pod", field="resourceClaims",
                                  accepted="a claim (or claim template) per pod")
            claim_writes.release(self.kube, use.namespace, use.name, use.uid, uid)
            log.info("%s: took back ResourceClaim %s, allocated for it but never bound", pods.key(pod), use.key)

    # ------------------------------------------------------------------ writing
    def plan(self, pod: Mapping[str, Any], record: AllocationRecord,
             views: Mapping[str, NodeView]) -> list[tuple[ClaimUse, dict[str, Any]]]:
        """Each claim's ``status.allocation`` for the GPUs the record gives the pod (in the record's order:
        the first claim takes the first GPUs). Raises ``DemandError`` when the devices are no longer
        published as the pod was placed (the decision goes back to the queue)."""
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return []
        uses = self.uses(pod, views)
        devices = self.devices(views)
        grants = list(record.gpus)
        plans = []
        for use in uses:
            taken, grants = grants[:use.demand.count], grants[use.demand.count:]
            picks = []
            for grant in taken:
                device = devices.by_uuid.get((record.node, grant.uuid))
                if device is None:
                    raise DemandError(pods.key(pod), f"ResourceClaim {use.key}", f"GPU {grant.uuid} of node "
                                      f"{record.node} is no longer published", field="resourceClaims")
                picks.append(device)
            plans.append((use, allocation_status(use.demand, record.node, picks)))
        return plans

    def allocate(self, pod: Mapping[str, Any], plans: Sequence[tuple[ClaimUse, dict[str, Any]]]) -> None:
        """Write the planned allocations (a writer thread, before the pod's Binding)."""
        for use, allocation in plans:
            claim_writes.allocate(self.kube, use.namespace, use.name, use.uid, allocation, pod,
                                  seen=self.mirror.claims.get(use.key))

    def take_back(self, pod: Mapping[str, Any], plans: Sequence[tuple[ClaimUse, dict[str, Any]]]) -> None:
        """Take back what ``allocate`` wrote for a pod whose Binding failed."""
        for use, _ in plans:
            claim_writes.release(self.kube, use.namespace, use.name, use.uid, pods.uid(pod))
    # ------------------------------------------------------------------ claims others allocated
    def hold_foreign(self, state: Tracking, keys: Mapping[str, None],
                     ours: Callable[[Mapping[str, Any]], bool]) -> bool:
        """Hold the devices of the claims ``keys`` someone else allocated (``ForeignClaims.hold``). Returns
        whether the engine changed."""
        return self.foreign.hold(state, keys, ours)
