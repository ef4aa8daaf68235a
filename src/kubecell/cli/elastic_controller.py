"""``kubecell elastic-controller``: run ElasticJobs (torchrun elastic workers as one kubecell gang) on a cluster.

One replica (the Deployment in ``deploy/elastic`` uses the Recreate strategy): every write it makes is
idempotent or conditional on the version it read, so two briefly running side by side do no harm, but one
is enough. SIGTERM (or SIGINT) stops the loop after the job being reconciled; nothing needs handing over,
since all state is in the API server.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from kubecell.elastic.controller import ControllerOptions, ElasticController
from kubecell.kube.rest import Kube


def elastic_controller(
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: the pod's service account).")] = None,
    namespace: Annotated[str | None, typer.Option(
        help="Run the ElasticJobs of this namespace only (default: all).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every decision.")] = False,
) -> None:
    """Run the ElasticJob controller: workers follow spec.replicas, which the scheduler sets through /scale."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    kube = Kube.from_kubeconfig(kubeconfig)
    controller = ElasticController(kube, ControllerOptions(namespace=namespace or None))
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: controller.shutdown())
    try:
        controller.run()
    finally:
        kube.close()
