"""The scheduler as a process: leader election, the loop, health endpoints, metrics, graceful shutdown.

``/healthz`` answers while the process runs; ``/readyz`` answers 200 once this replica leads and has
completed a cycle (a standby replica is alive but not ready); ``/metrics`` is Prometheus' text format.
SIGTERM stops scheduling, releases the Lease so a standby takes over at once, and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from kubecell.k8s.leader import LeaderElector, LeaseConfig
from kubecell.k8s.observe.metrics import Metrics
from kubecell.k8s.rest import Kube
from kubecell.k8s.scheduler.scheduler import Scheduler, SchedulerOptions

log = logging.getLogger("kubecell.scheduler")


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def serve(address: tuple[str, int], scheduler: Scheduler, elector: LeaderElector | None) -> ThreadingHTTPServer:
    metrics = Metrics(scheduler, elector)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._answer(200, b"ok")
            elif self.path == "/readyz":
                ready = scheduler.ready.is_set() and (elector is None or elector.leading.is_set())
                self._answer(200 if ready else 503, b"ok" if ready else b"not leading or not synced")
            elif self.path == "/metrics":
                self._answer(200, metrics.render(), CONTENT_TYPE_LATEST)
            else:
                self._answer(404, b"not found")

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    server = ThreadingHTTPServer(address, Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def _relay(source: threading.Event, scheduler: Scheduler) -> None:
    """Stop ``scheduler`` when ``source`` is set (a lost lease or a signal)."""

    def wait() -> None:
        source.wait()
        scheduler.shutdown()

    threading.Thread(target=wait, daemon=True).start()


def run(kube: Kube, options: SchedulerOptions, *, listen: tuple[str, int] | None, leader_elect: bool,
        identity: str, lease: LeaseConfig | None = None, stop: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``): elect, schedule while leading, exit when the lease is lost."""
    scheduler = Scheduler(kube, options)
    stop = stop or threading.Event()
    elector = LeaderElector(kube, identity, lease) if leader_elect else None
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    server = serve(listen, scheduler, elector) if listen else None
    try:
        if elector is not None:
            threading.Thread(target=elector.run, args=(stop,), name="leader", daemon=True).start()
            while not stop.is_set() and not elector.leading.wait(0.5):
                pass
            _relay(elector.lost, scheduler)
        if not stop.is_set():
            _relay(stop, scheduler)
            scheduler.run()
    finally:
        scheduler.shutdown()
        if elector is not None and not elector.lost.is_set():
            elector.release()
        if server is not None:
            server.shutdown()
    if elector is not None and elector.lost.is_set():
        raise SystemExit("lost the leader lease")
