"""Leader election through a ``coordination.k8s.io/v1`` Lease, as kube-scheduler does it.

Only the leader schedules; replicas wait. Every write to the Lease carries the resourceVersion it read,
so two replicas racing for an expired Lease cannot both win: the API server accepts one update and
answers the other with 409. A leader that cannot renew within ``renew_deadline`` stops leading before its
Lease can expire (so no two leaders overlap in time, with clocks assumed to agree to within
``lease_duration - renew_deadline``).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.kube.clock import rfc3339_micro
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.leader")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str = "kubecell-system"
    name: str = "kubecell-scheduler"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _parse(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    text = stamp.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.UTC).timestamp()


class LeaderElector:
    """Acquire and keep the Lease for ``identity``; ``leading`` is set while this replica leads."""

    def __init__(self, kube: Kube, identity: str, config: LeaseConfig | None = None) -> None:
        self.kube = kube
        self.identity = identity
        self.config = config or LeaseConfig()
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.transitions = 0

    @property
    def path(self) -> str:
        c = self.config
        return f"/apis/coordination.k8s.io/v1/namespaces/{c.namespace}/leases"

    def _spec(self, transitions: int, acquired: str | None) -> dict[str, Any]:
        now = rfc3339_micro()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.config.lease_duration),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        c = self.config
        try:
            lease = self.kube.get(f"{self.path}/{c.name}")
        except ApiError as error:
            if not error.not_found:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": c.name, "namespace": c.namespace}, "spec": self._spec(0, None)}
            try:
                self.kube.create(self.path, body)
                return True
            except ApiError as create_error:
                if create_error.conflict:  # another replica created it first
                    return False
                raise
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or c.lease_duration)
        if holder and holder != self.identity and time.time() < renewed + duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquired = spec.get("acquireTime") if holder == self.identity else None
        lease["spec"] = self._spec(transitions, acquired)
        try:
            self.kube.replace(f"{self.path}/{c.name}", lease)  # carries the resourceVersion read above
        except ApiError as error:
            if error.conflict:
                return False
            raise
        if holder != self.identity:
            self.transitions = transitions
        return True

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew until ``stop`` or until renewal fails for ``renew_deadline`` (then ``lost``)."""
        c = self.config
        last_renewal = 0.0
        while not stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except ApiError as error:
                log.warning("lease %s/%s: %s", c.namespace, c.name, error)
                held = False
            now = time.monotonic()
            if held:
                last_renewal = now
                if not self.leading.is_set():
                    log.info("%s leads (lease %s/%s)", self.identity, c.namespace, c.name)
                    self.leading.set()
            elif self.leading.is_set() and now - last_renewal > c.renew_deadline:
                log.error("%s lost the lease %s/%s", self.identity, c.namespace, c.name)
                self.leading.clear()
                self.lost.set()
                return
            stop.wait(c.retry_period)

    def release(self) -> None:
        """Give the Lease up at a graceful shutdown, so a replica takes over at once."""
        c = self.config
        try:
            lease = self.kube.get(f"{self.path}/{c.name}")
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["leaseDurationSeconds"] = 1
                self.kube.replace(f"{self.path}/{c.name}", lease)
        except ApiError as error:
            log.warning("lease not released: %s", error)
        self.leading.clear()
