"""The scheduler's HTTP port: health, metrics and the live dashboard as one Starlette app (``build_app``), served
by uvicorn from a thread (``serve``)."""

from kubecell.scheduler.observe.web.app import Served, build_app, serve

__all__ = ["Served", "build_app", "serve"]
