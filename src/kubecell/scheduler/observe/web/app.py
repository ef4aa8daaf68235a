"""The scheduler's HTTP port as one ASGI app: health, readiness, metrics, the live dashboard, and room for more.

Everything a replica answers over HTTP lives here so that one port, one server and one set of middleware serve
it all: the probes Kubernetes sends, Prometheus' scrape, the operators' dashboard, and the kube-scheduler
extender's endpoints (``extra_routes``, added by the extender mode). Readers never touch the scheduler's
engine: the dashboard reads the immutable ``Snapshot`` the scheduler thread publishes, and the metrics read
what ``Metrics`` reads. The composition root serves it (``kubecell.cli.serving.serve``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

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
