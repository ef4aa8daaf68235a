"""Leader election through a ``coordination.k8s.io/v1`` Lease, as kube-scheduler does it.

Only the leader schedules; replicas wait. Every write to the Lease carries the resourceVersion it read,
so two replicas racing for an expired Lease cannot both win: the API server accepts one update and
answers the other with 409. A leader that cannot renew within ``renew_deadline`` stops leading before its
Lease can expire, even while an attempt hangs on an API server that stopped answering.

No clock is compared with another machine's. As client-go's elector does, a standby never reads the holder's
``renewTime`` against its own wall clock: it counts the lease duration on its own monotonic clock from when it
last saw the Lease record change. The leader counts its renew deadline on its monotonic clock from the start of
the attempt that renewed, which is before the standby can have seen that renewal; so with ``renew_deadline <
lease_duration`` no two lead, whatever the wall clocks say. The price is client-go's too: a replica that starts
beside a Lease its holder abandoned (killed, not released) waits one lease duration before taking it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
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


class LeaderElector:
    """Acquire and keep the Lease for ``identity``; ``leading`` is set while this replica leads."""

    def __init__(self, kube: Kube, identity: str, config: LeaseConfig | None = None) -> None:
        self.kube = kube
        self.identity = identity
        self.config = config or LeaseConfig()
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.transitions = 0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._observing = threading.Lock()

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
        duration = float(spec.get("leaseDurationSeconds") or c.lease_duration)
        if holder and holder != self.identity and not self._expired(spec, duration):
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

    def _expired(self, spec: Mapping[str, Any], duration: float) -> bool:
        """Whether ``duration`` seconds of this replica's monotonic clock have passed since it first saw the
        Lease as ``spec`` is: any change of holder, renewal, acquisition or transitions restarts the count."""
        record = tuple(spec.get(key) for key in ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions",
                                                 "leaseDurationSeconds"))
        now = time.monotonic()
        with self._observing:
            if record != self._observed:
                self._observed, self._observed_at = record, now
            return now >= self._observed_at + duration

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew until ``stop`` or until renewal fails for ``renew_deadline`` (then ``lost``).

        The deadline counts from the start of the last attempt that renewed (the renewTime it wrote is no
        earlier) and holds while an attempt is in flight. Before, it was checked only once an attempt returned,
        counted from its end: an API server that stopped answering held a leader's attempt for the client's
        timeout (30 s, sent up to four times by urllib3) while it went on leading, and the standby took the
        Lease after 15 s."""
        c = self.config
        renewed = 0.0
        while not stop.is_set():
            started = time.monotonic()
            leading = self.leading.is_set()
            if leading and started - renewed >= c.renew_deadline:
                log.error("%s lost the lease %s/%s", self.identity, c.namespace, c.name)
                self.leading.clear()
                self.lost.set()
                return
            if self._attempt(renewed + c.renew_deadline - started if leading else None):
                renewed = started
                if not leading:
                    log.info("%s leads (lease %s/%s)", self.identity, c.namespace, c.name)
                    self.leading.set()
            left = renewed + c.renew_deadline - time.monotonic()
            stop.wait(min(c.retry_period, max(0.0, left)) if self.leading.is_set() else c.retry_period)

    def _attempt(self, timeout: float | None) -> bool:
        """``try_acquire_or_renew`` on a thread of its own, awaited for ``timeout`` s at most (None: until it
        ends); False when it failed or had not ended. A leader's attempt left running past its deadline may
        still renew the Lease later: the standby then waits one more lease duration, and no two lead."""
        c = self.config
        outcome: Future[bool] = Future()

        def attempt() -> None:
            try:
                outcome.set_result(self.try_acquire_or_renew())
            except BaseException as error:  # handed to the waiting thread
                outcome.set_exception(error)

        threading.Thread(target=attempt, name="lease-attempt", daemon=True).start()
        try:
            return outcome.result(timeout)
        except FutureTimeout:
            log.warning("lease %s/%s: the API server did not answer within the renew deadline", c.namespace, c.name)
        except ApiError as error:
            log.warning("lease %s/%s: %s", c.namespace, c.name, error)
        except Exception:  # never the end of the thread that keeps ``leading`` true to the Lease
            log.exception("lease %s/%s: the attempt failed", c.namespace, c.name)
        return False

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
