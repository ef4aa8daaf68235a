"""``kubecell elastic-controller``: run ElasticJobs (torchrun elastic workers as one kubecell gang) on a cluster.

Several replicas may run (the Deployment in ``deploy/elastic`` runs two): they elect a leader through the Lease
``kubecell-elastic-controller`` (``kubecell.kube.leader``, as the scheduler does), and only the leader watches
and acts. A standby takes over within the lease duration (15 s) when the leader dies, at once when it stops
gracefully (it releases the Lease on SIGTERM). Nothing needs handing over: all state is in the API server, and
every write is idempotent or conditional on the version read, so even a brief overlap does no harm.

The HTTP port answers ``/healthz`` while the process runs, ``/readyz`` (200) once this replica leads and has
completed a pass (a standby is alive, not ready), and ``/metrics`` (``kubecell.elastic.metrics``). A replica
that loses the Lease stops and exits non-zero, so its Pod restarts as a standby.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated

import typer
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from kubecell.cli.output import configure_logging
from kubecell.cli.scheduler import Identity, Kubeconfig, LeaderElect, Verbose, listen_address
from kubecell.cli.service import default_identity, lead, stop_on_signals
from kubecell.cli.serving import serve
from kubecell.elastic.controller import ControllerOptions, ElasticController
from kubecell.kube.leader import LeaderElector, LeaseConfig
from kubecell.kube.rest import Kube

LEASE = "kubecell-elastic-controller"
DEFAULT_LISTEN = "0.0.0.0:10261"


def controller_app(controller: ElasticController, elector: LeaderElector | None) -> Starlette:
    """The probes and the scrape of one replica."""

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def readyz(request: Request) -> Response:
        ready = controller.ready.is_set() and (elector is None or elector.leading.is_set())
        return PlainTextResponse("ok" if ready else "not leading or not synced", status_code=200 if ready else 503)

    def metrics(request: Request) -> Response:
        return Response(controller.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)])


def run_controller(kube: Kube, options: ControllerOptions, *, listen: tuple[str, int] | None, leader_elect: bool,
                   identity: str, lease: LeaseConfig | None = None, stop: threading.Event | None = None,
                   serving: Callable[[ElasticController, str | None], None] | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``): elect, run the controller while leading, stop when the Lease is
    lost (then ``SystemExit``). ``serving`` is told the controller and its HTTP port's URL once the port
    answers, before the election (tests use it)."""
    controller = ElasticController(kube, options)
    stop = stop or threading.Event()
    elector = LeaderElector(kube, identity, lease or LeaseConfig(name=LEASE)) if leader_elect else None
    controller.metrics.leading = elector.leading.is_set if elector is not None else (lambda: True)
    stop_on_signals(stop)
    server = serve(controller_app(controller, elector), *listen) if listen else None
    if serving is not None:
        serving(controller, server.url if server is not None else None)
    lead(controller, elector, stop, server)


def elastic_controller(
    kubeconfig: Kubeconfig = None,
    namespace: Annotated[str | None, typer.Option(
        help="Run the ElasticJobs of this namespace only (default: all).")] = None,
    listen: Annotated[str, typer.Option(help="HOST:PORT of /healthz, /readyz and /metrics ('' for none).")] = (
        DEFAULT_LISTEN),
    leader_elect: LeaderElect = True,
    lease_namespace: Annotated[str, typer.Option(
        help="Namespace of the Lease kubecell-elastic-controller and of the ConfigMap kubecell-elastic-finished "
        "(its record of each job: restarts, target, how it ended).")] = "kubecell-system",
    identity: Identity = "",
    verbose: Verbose = False,
) -> None:
    """Run the ElasticJob controller: workers follow spec.replicas, which the scheduler sets through /scale."""
    configure_logging(verbose)
    address = listen_address(listen)
    kube = Kube.from_kubeconfig(kubeconfig)
    try:
        run_controller(kube, ControllerOptions(namespace=namespace or None, state_namespace=lease_namespace),
                       listen=address,
                       leader_elect=leader_elect, identity=identity or default_identity(),
                       lease=LeaseConfig(namespace=lease_namespace, name=LEASE))
    finally:
        kube.close()
