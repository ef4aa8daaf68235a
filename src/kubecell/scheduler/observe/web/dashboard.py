"""The live dashboard's routes: the page, the snapshot as JSON, the stream of updates, and the page's assets.

The page loads the full payload once from ``/api/snapshot`` and then listens on ``/api/stream``. Each event
there carries the small part of a new snapshot (figures and VCs, from which the page draws its history),
and the page fetches the full map again only when it is visible. So an update costs every open page a few
hundred bytes, and the 40,000-cell map of a 5,000-node cluster (about 2 MB of JSON) crosses the wire
gzipped (about 0.4 MB), never more often than the page can show it, and is encoded once per snapshot
whatever the number of pages. Events to one page are at most one per ``min_interval`` and always the
newest snapshot (intermediate ones are skipped, never queued).

The scheduler publishes ``scheduler.snapshot`` (a ``Snapshot`` or None); a read never waits on the
scheduler thread. None means no snapshot yet: a clear 503, never an empty page.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Scope, Send

from kubecell.scheduler.observe.snapshot import Snapshot
from kubecell.scheduler.observe.web.payload import PayloadCache, build_summary, encode

HERE: Final = Path(__file__).resolve().parent
NO_SNAPSHOT: Final = ("the scheduler has published no snapshot yet (it is starting, syncing its caches, or "
                      "standing by for the leader lease); try again in a few seconds")
POLL_SECONDS: Final = 0.25
"""How often a stream looks for a new snapshot: reading one attribute, so cheap; its latency is far below
``min_interval``, which bounds how often a page is updated anyway."""
KEEPALIVE_SECONDS: Final = 15.0
MAX_STREAMS: Final = 32
"""Event streams open at once; more are answered 503 (a browser's EventSource tries again). A stream holds a
connection for as long as it lasts, so without a cap of its own, a client opening hundreds filled the port's
connection cap and locked kube-scheduler's calls and the probes out."""
STREAM_SECONDS: Final = 600.0
"""How long one stream lasts; the page's EventSource reconnects at once (``retry``), so a slot held by a page
left open is given back now and then and one client cannot keep the cap's slots for ever."""


def plotly_bundle() -> Path:
    """plotly.js as the ``plotly`` PyPI package ships it (found without importing plotly itself)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the plotly package is not installed; it ships the dashboard's charting library")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the plotly package no longer ships plotly.min.js there")
    return path


class Dashboard:
    """The dashboard of one scheduler; ``routes()`` mounts it."""

    def __init__(self, scheduler: object, *, min_interval: float = 1.0) -> None:
        self.scheduler = scheduler
        self.min_interval = min_interval
        self.cache = PayloadCache()
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self._plotly: tuple[bytes, str] | None = None
        self._plotly_lock = threading.Lock()
        self.streams = 0
        """Event streams open now (changed on the server's loop only)."""
        self._summary: tuple[Snapshot, bytes] | None = None
        self._summary_lock = threading.Lock()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.page),
            Route("/api/snapshot", self.snapshot_json),
            Route("/api/stream", self.stream),
            Route("/vendor/plotly.min.js", self.plotly),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]

    def current(self) -> Snapshot | None:
        """The published snapshot; anything else (nothing published yet, a scheduler without the hook) is None."""
        snapshot = getattr(self.scheduler, "snapshot", None)
        return snapshot if isinstance(snapshot, Snapshot) else None

    def page(self, request: Request) -> Response:
        snapshot = self.current()
        if snapshot is None:
            return self.templates.TemplateResponse(request, "waiting.html", {"message": NO_SNAPSHOT},
                                                   status_code=503, headers={"Retry-After": "2"})
        return self.templates.TemplateResponse(request, "dashboard.html", {"cycle": snapshot.cycle},
                                               headers={"Cache-Control": "no-store"})

    def snapshot_json(self, request: Request) -> Response:
        """The full payload (sync: building it is CPU work, done in the thread pool, once per snapshot)."""
        snapshot = self.current()
        if snapshot is None:
            return JSONResponse({"error": "no snapshot", "detail": NO_SNAPSHOT}, status_code=503,
                                headers={"Retry-After": "2", "Cache-Control": "no-store"})
        encoded = self.cache.get(snapshot)
        headers = {"Cache-Control": "no-store", "X-Kubecell-Cycle": str(snapshot.cycle), "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return Response(encoded.gzipped, media_type="application/json", headers=headers)
        return Response(encoded.body, media_type="application/json", headers=headers)

    async def stream(self, request: Request) -> Response:
        if self.streams >= MAX_STREAMS:
            return JSONResponse({"error": "too many event streams", "detail": f"{MAX_STREAMS} are open; try again "
                                 "later"}, status_code=503, headers={"Retry-After": "10", "Cache-Control": "no-store"})
        self.streams += 1  # counted before the response starts, given back however it ends
        return _CountedStream(self._stream_ended, self._events(request), media_type="text/event-stream",
                              headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def _stream_ended(self) -> None:
        self.streams -= 1

    async def _events(self, request: Request) -> AsyncIterator[bytes]:
        """``snapshot`` events: the newest snapshot's summary, at most one per ``min_interval``; a comment line
        now and then keeps proxies from closing an idle stream and finds a page that went away. Ends after
        ``STREAM_SECONDS`` (the page reconnects)."""
        yield b"retry: 2000\n\n"
        last: Snapshot | None = None
        opened = time.monotonic()
        sent = quiet = opened - self.min_interval
        while not await request.is_disconnected() and time.monotonic() - opened < STREAM_SECONDS:
            snapshot = self.current()
            now = time.monotonic()
            if snapshot is not None and snapshot is not last and now - sent >= self.min_interval:
                last, sent, quiet = snapshot, now, now
                data = await anyio.to_thread.run_sync(self._summary_bytes, snapshot)
                yield b"event: snapshot\nid: %d\ndata: %s\n\n" % (snapshot.cycle, data)
            elif now - quiet >= KEEPALIVE_SECONDS:
                quiet = now
                yield b": keepalive\n\n"
            await anyio.sleep(POLL_SECONDS)

    def _summary_bytes(self, snapshot: Snapshot) -> bytes:
        """The summary of ``snapshot``, built once whatever the number of streams (each built its own before: 8 ms
        per stream per snapshot at 5,000 nodes, 270 builds a second with 450 streams)."""
        with self._summary_lock:
            if self._summary is None or self._summary[0] is not snapshot:
                self._summary = snapshot, encode(build_summary(snapshot))
            return self._summary[1]

    def plotly(self, request: Request) -> Response:
        """plotly.js from the installed package, gzipped once per process and cached by the browser."""
        with self._plotly_lock:
            if self._plotly is None:
                raw = plotly_bundle().read_bytes()
                version = raw[:200].split(b"plotly.js v", 1)[-1].split(b"\n", 1)[0].strip().decode(errors="replace")
                self._plotly = gzip.compress(raw, compresslevel=6, mtime=0), version
        body, version = self._plotly
        headers = {"Cache-Control": "public, max-age=86400", "ETag": json.dumps(f"plotly-{version}"),
                   "Vary": "Accept-Encoding"}
        if request.headers.get("if-none-match") == headers["ETag"]:
            return Response(status_code=304, headers=headers)
        if "gzip" in request.headers.get("accept-encoding", ""):
            return Response(body, media_type="text/javascript", headers={**headers, "Content-Encoding": "gzip"})
        return Response(gzip.decompress(body), media_type="text/javascript", headers=headers)


class _CountedStream(StreamingResponse):
    """A stream that gives its slot back however it ends: finished, cut off by its client, or cancelled before
    its first byte (where a generator's own ``finally`` never runs)."""

    def __init__(self, ended: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ended()
