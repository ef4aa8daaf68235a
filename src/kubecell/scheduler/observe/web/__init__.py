"""The scheduler's HTTP port: health, metrics and the live dashboard as one Starlette app (``build_app``), served
by uvicorn from a thread (``kubecell.cli.serving.serve``)."""

from kubecell.scheduler.observe.web.app import build_app

__all__ = ["build_app"]
