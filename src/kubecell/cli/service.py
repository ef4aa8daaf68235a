"""The scheduler as a process: leader election, the loop, its HTTP port, graceful shutdown.

The port (``kubecell.scheduler.observe.web``): ``/healthz`` answers while the process runs; ``/readyz`` answers 200 once
this replica leads and has completed a cycle (a standby replica is alive but not ready); ``/metrics`` is
Prometheus' text format; ``/`` is the live dashboard; in extender mode ``/extender/<verb>`` answers
kube-scheduler (a standby replica answers 503 there; kube-scheduler retries the pod).
When the replica knows its Pod (``pod``: the Downward API), the leader labels that Pod ``kubecell.io/leader``
(``kubecell.kube.leader_label``), which the Service ``kubecell-extender`` selects, so kube-scheduler's calls
reach the leader alone.
SIGTERM stops scheduling, takes the label off, releases the Lease so a standby takes over at once, and exits.

``lead`` is that lifecycle (elect, run while leading, stop, release) for any loop with ``run`` and ``shutdown``:
the ElasticJob controller's process (``kubecell.cli.elastic_controller``) runs through it too.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from kubecell.cli.serving import Served, serve
from kubecell.kube.leader import LeaderElector, LeaseConfig
from kubecell.kube.leader_label import LeaderLabel, PodRef
from kubecell.kube.rest import Kube
from kubecell.scheduler.observe.web.app import build_app
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler

log = logging.getLogger("kubecell.scheduler")


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Work(Protocol):
    """A loop the process runs while this replica leads: the scheduler, the ElasticJob controller."""

    def run(self) -> None: ...

    def shutdown(self) -> None: ...


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (only the main thread may install handlers; elsewhere: nothing)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())


def _relay(source: threading.Event, work: Work) -> None:
    """Stop ``work`` when ``source`` is set (a lost lease or a signal)."""

    def wait() -> None:
        source.wait()
        work.shutdown()

    threading.Thread(target=wait, daemon=True).start()


def lead(work: Work, elector: LeaderElector | None, stop: threading.Event, server: Served | None, *,
         on_start: Callable[[], object] | None = None, on_leading: Callable[[], object] | None = None,
         on_stop: Callable[[], object] | None = None) -> None:
    """Call ``on_start``, elect (without ``elector``: lead at once), call ``on_leading`` and run ``work`` while
    leading, until ``stop`` or a lost lease; then stop it, call ``on_stop``, give the Lease up (a graceful stop:
    a standby takes over at once) and the HTTP ``server``. A lost lease raises ``SystemExit``: the process
    ends, and its Pod restarts as a standby."""
    try:
        if on_start is not None:
            on_start()
        if elector is not None:
            threading.Thread(target=elector.run, args=(stop,), name="leader", daemon=True).start()
            while not stop.is_set() and not elector.leading.wait(0.5):
                pass
            _relay(elector.lost, work)
        if on_leading is not None and not stop.is_set():
            on_leading()
        if not stop.is_set():
            _relay(stop, work)
            work.run()
    finally:
        work.shutdown()
        if on_stop is not None:
            on_stop()
        if elector is not None and not elector.lost.is_set():
            elector.release()
        if server is not None:
            server.stop()
    if elector is not None and elector.lost.is_set():
        raise SystemExit("lost the leader lease")


def answering(ready: threading.Event, leading: threading.Event | None) -> Callable[[], bool]:
    """Whether the extender's verbs are answered: once the loop finished a cycle, and only while this replica
    leads (``leading``: the elector's; None: no election). The loop's ``ready`` stays set after the Lease is
    lost, and a filter or bind answered then would be decided on a book the new leader no longer shares."""
    if leading is None:
        return ready.is_set
    return lambda: ready.is_set() and leading.is_set()


def run(kube: Kube, options: SchedulerOptions, *, listen: tuple[str, int] | None, leader_elect: bool,
        identity: str, lease: LeaseConfig | None = None, stop: threading.Event | None = None,
        pod: PodRef | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``): elect, schedule while leading, exit when the lease is lost.
    With ``pod`` (this replica's own Pod), label it while leading (checked again every lease duration)."""
    scheduler = Scheduler(kube, options)
    stop = stop or threading.Event()
    elector = LeaderElector(kube, identity, lease) if leader_elect else None
    lease_config = elector.config if elector is not None else LeaseConfig()
    label = LeaderLabel(kube, pod, resync=lease_config.lease_duration) if pod is not None else None
    labelling: list[threading.Thread] = []
    finished = threading.Event()
    stop_on_signals(stop)
    extra = []
    if options.extender:  # kube-scheduler's extender verbs on the same port (imported here: a mode apart)
        from kubecell.scheduler.extender.http import routes
        from kubecell.scheduler.extender.verbs import Extender
        extra = routes(Extender(scheduler), ready=answering(scheduler.ready, elector.leading if elector else None))
        # (``Extender`` attaches its holds to the scheduler, before the loop runs)
    server = serve(build_app(scheduler, elector, extra_routes=extra), *listen) if listen else None

    def start_labelling() -> None:
        if label is None:
            return
        leading = elector.leading.is_set if elector is not None else lambda: True
        labelling.append(threading.Thread(target=label.run, args=(leading, finished), name="leader-label",
                                          daemon=True))
        labelling[0].start()

    def stop_labelling() -> None:
        finished.set()
        if label is not None and labelling:
            labelling[0].join(timeout=10)  # a write in flight lands before the label is taken off
            label.unmark()

    lead(scheduler, elector, stop, server, on_start=label.unmark if label is not None else None,  # a replica
         on_leading=start_labelling, on_stop=stop_labelling)  # restarted in a Pod that led is a standby now
