"""The scheduler's HTTP port as one ASGI app: health, readiness, metrics, the live dashboard, and room for more.

Everything a replica answers over HTTP lives here so that one port, one server and one set of middleware serve
it all: the probes Kubernetes sends, Prometheus' scrape, the operators' dashboard, and the kube-scheduler
extender's endpoints (``extra_routes``, added by the extender mode). Readers never touch the scheduler's
engine: the dashboard reads the immutable ``Snapshot`` the scheduler thread publishes, and the metrics read
what ``Metrics`` reads. ``serve`` runs the app under uvicorn in a daemon thread, so the scheduler's own loop
keeps the main thread (and its signal handling).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from kubecell.kube.leader import LeaderElector
from kubecell.scheduler.observe.metrics import Metrics
from kubecell.scheduler.observe.web.dashboard import Dashboard
from kubecell.scheduler.scheduler import Scheduler

log = logging.getLogger("kubecell.web")


def build_app(scheduler: Scheduler, elector: LeaderElector | None, *,
              extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The app of one replica. ``extra_routes`` come first, so a later mode can add endpoints (the extender's)
    without this module knowing them; they must not reuse the paths below."""
    metrics: list[Metrics] = []  # made at the first scrape: a probe or a page never pays for it
    metrics_lock = threading.Lock()

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def readyz(request: Request) -> Response:
        """Ready = leads (or runs without election) and has completed a cycle: a standby is alive, not ready."""
        ready = scheduler.ready.is_set() and (elector is None or elector.leading.is_set())
        return PlainTextResponse("ok" if ready else "not leading or not synced", status_code=200 if ready else 503)

    def metrics_text(request: Request) -> Response:  # sync: rendering reads the scheduler, off the event loop
        with metrics_lock:
            if not metrics:
                metrics.append(Metrics(scheduler, elector))
        return Response(metrics[0].render(), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [
        *extra_routes,
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_text),
        *Dashboard(scheduler).routes(),
    ]
    # Compresses the page, its script and small JSON answers; the snapshot payload and plotly.js come
    # compressed already (once per snapshot, once per process), and the event stream is never buffered.
    return Starlette(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=1024, compresslevel=6)])


@dataclass
class Served:
    """A running server: ``port`` is the one bound (useful when asked for port 0); ``stop`` ends it."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener, end open event streams (within ~1 s) and wait for the thread (bounded)."""
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout)
            log.warning("the HTTP server did not stop within %.0f s", 2 * timeout)


def serve(app: Starlette, host: str, port: int, *, started_timeout: float = 10.0,
          tls: tuple[str, str] | None = None) -> Served:
    """Serve ``app`` on ``host``:``port`` (0: any free port) from a daemon thread; over HTTPS with ``tls``
    (certificate and key files, PEM), as an admission webhook must be.

    The socket is bound here, in the caller's thread, so a port in use fails the caller at once with the
    usual ``OSError`` instead of dying silently in the server thread.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes a response's head and body apart, and with Nagle on,
    # the body waits for the client's delayed ACK of the head (~40 ms per request on Linux), which would
    # put 40 ms on every extender call kube-scheduler makes.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound = int(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=1, ws="none",
                            ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http", daemon=True)
    thread.start()
    deadline = time.monotonic() + started_timeout
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        with contextlib.suppress(OSError):
            sock.close()
        raise RuntimeError(f"the HTTP server on {host}:{bound} did not start within {started_timeout:.0f} s")
    return Served(server, thread, host, bound, tls is not None)
