"""ResourceClaims another scheduler allocated on kubecell's devices, held in the engine exactly where they are.

The stock kube-scheduler allocates claims for the pods it places, from the same ResourceSlices kubecell publishes.
kubecell must never give those GPUs (or that share of a GPU) to its own pods: each such claim is held as external
work on the devices it names, is held anew when what it takes there changes (a device published again, its shares
changed), and is freed when it is no longer allocated. Claims reserved for a pod kubecell places are that pod's
job's, not held twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube.dra.allocation import allocated_devices
from kubecell.kube.dra.claims import ClaimError
from kubecell.kube.dra.slices import PublishedDevice
from kubecell.kube.inventory import NodeView
from kubecell.scheduler.claim_devices import Devices, published_memory_mib
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")


class ForeignClaims:
    """The holds of claims others allocated (``Tracking.external_claims``) and what each was made from."""

    def __init__(self, mirror: Mirror, devices: Callable[[Mapping[str, NodeView]], Devices]) -> None:
        self.mirror = mirror
        self.devices = devices
        """The confirmed devices for the nodes' views (``ClaimBroker.devices``, which keeps them per change)."""
        self._holds: dict[str, tuple[str, str, Request, tuple[int, ...]]] = {}
        """Claim key -> what its hold in ``Tracking.external_claims`` was made from (``hold``): a claim looked at
        again is held anew when that changed (a device published again, its shares changed)."""
        self._names: tuple[Devices, dict[tuple[str, str], PublishedDevice]] | None = None
        """The last ``Devices`` and its devices by (node, device name) (``_by_name``)."""

    def hold(self, state: Tracking, keys: Mapping[str, None], ours: Callable[[Mapping[str, Any]], bool]) -> bool:
        """Hold the devices of the claims ``keys`` that someone else allocated on kubecell's devices (the stock
        kube-scheduler, for a pod it places), exactly where they are, and free them when the claim is no
        longer allocated; claims reserved for a pod kubecell places (``ours``) are held by that pod's job.
        A claim some of whose devices are not published (or not confirmed) now is held on those that are, and
        noted in ``Mirror.claims_awaiting_devices``: the next change of the slices looks at it again, and holds
        it anew when what it takes there changed. Returns whether the engine changed."""
        engine, dirty = state.engine, False
        awaiting = self.mirror.claims_awaiting_devices
        for key in keys:
            where, missing = self._foreign(key, state, ours)
            if missing:
                awaiting[key] = None
            else:
                awaiting.pop(key, None)
            held = state.external_claims.get(key)
            before = self._holds.get(key) if held is not None else None
            if held is not None and where != before:
                engine.release_external(state.external_claims.pop(key))
                dirty = True
                held = None
            if where is not None and held is None:
                try:
                    state.external_claims[key] = engine.hold_external(where[2], where[1], where[3]).name
                    self._holds[key] = where
                    dirty = True
                except InvalidInputError as error:
                    log.warning("cannot hold ResourceClaim %s allocated by another scheduler: %s", key, error)
                    if before is not None:  # what it held before still runs there: held as before
                        with contextlib.suppress(InvalidInputError):
                            state.external_claims[key] = engine.hold_external(before[2], before[1], before[3]).name
                            self._holds[key] = before
            if key not in state.external_claims:
                self._holds.pop(key, None)
        return dirty

    def _foreign(self, key: str, state: Tracking, ours: Callable[[Mapping[str, Any]], bool]
                 ) -> tuple[tuple[str, str, Request, tuple[int, ...]] | None, bool]:
        """((hold name, node, request, GPU indices) for a claim allocated by someone else on devices kubecell
        knows, None otherwise; whether a device of kubecell's driver it names is not published or not
        confirmed now).

        Several results on one GPU (shares a scheduler gave one claim, each with its own ``shareID``) are held
        as one share of their sum (a whole GPU where that reaches it); devices of several GPUs, as those GPUs,
        each whole (the engine holds one share on one GPU, and kubecell cannot see how the rest is split)."""
        claim = self.mirror.claims.get(key)
        if claim is None:
            return None, False
        status = claim.get("status") or {}
        if not status.get("allocation"):
            return None, False
        for consumer in status.get("reservedFor") or []:
            if not isinstance(consumer, Mapping):
                continue
            pod = self.mirror.pods.get(str(consumer.get("uid")))
            if pod is not None and ours(pod):
                return None, False
        try:
            taken = allocated_devices(claim)
        except ClaimError as error:
            log.warning("ResourceClaim %s: unreadable allocation (%s); not held", key, error)
            return None, False
        devices = self.devices(state.views)
        by_name = self._by_name(devices)
        node = ""
        missing = False
        per_gpu: dict[int, tuple[int, int, PublishedDevice]] = {}  # GPU index -> (milli, MiB, device), summed
        for result in taken:
            device = by_name.get((result.node, result.device))
            if device is None:
                missing = True  # not published now (a slice being written again, a GPU out for an XID)
                continue
            if node and result.node != node:
                log.warning("ResourceClaim %s: devices on several nodes; held on %s only", key, node)
                continue
            node = result.node
            slot = devices.slot[device.node, device.uuid]
            milli, memory, _ = per_gpu.get(slot, (0, 0, device))
            per_gpu[slot] = (milli + result.compute_milli, memory + result.memory_mib, device)
        if not per_gpu:
            return None, missing
        uid = str((claim.get("metadata") or {}).get("uid", ""))[:8]
        name = f"claim:{key}@{uid}"
        if len(per_gpu) == 1:
            milli, memory, device = next(iter(per_gpu.values()))
            if 0 < milli < MILLI_PER_GPU:  # a share (or shares of this one GPU): held as what they take together
                request = Request(name, gpu_count=1, gpu_milli=milli,
                                  gpu_memory_mib=min(memory, published_memory_mib(device, memory)))
                return (name, node, request, tuple(per_gpu)), missing
        # whole GPUs, each named once however many results name it (the engine holds a GPU once per hold)
        request = Request(name, gpu_count=len(per_gpu), gpu_milli=MILLI_PER_GPU)
        return (name, node, request, tuple(sorted(per_gpu))), missing

    def _by_name(self, devices: Devices) -> Mapping[tuple[str, str], PublishedDevice]:
        """The confirmed devices by (node, device name), built once per ``Devices``: every claim looked at
        after a change of the slices reads it."""
        cached = self._names
        if cached is None or cached[0] is not devices:
            cached = self._names = (devices, {(d.node, d.name): d for d in devices.listed})
        return cached[1]
