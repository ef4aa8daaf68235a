"""Serving an ASGI app from a daemon thread under uvicorn, for every kubecell process with an HTTP port.

The scheduler's port (health, metrics, dashboard, extender), the elastic controller's probes and the
right-sizing admission webhook all serve this way, so the process's own loop keeps the main thread (and its
signal handling), a port in use fails the caller at once, and every stop is bounded.

Whoever reaches a port may be hostile, and uvicorn bounds neither how long a request may take to arrive nor how
many connections are open: a client sending its head or body a byte a second, or just holding a socket open, kept
it (and any body read so far) for ever, and 300 such sockets under a 256-descriptor limit left every later call
(kube-scheduler's, the probes') unanswered. So each connection must deliver a whole request within
``REQUEST_SECONDS`` or is closed, and connections past ``MAX_CONNECTIONS`` are answered 503 and closed at once.
On a TLS port a connection reaches the protocol only once its handshake is done, and asyncio gives a handshake
60 s unless told otherwise (uvicorn never tells it): a client that opened TCP connections and sent nothing held
each descriptor for a minute, uncounted by the cap. The server's loop now gives a handshake ``HANDSHAKE_SECONDS``.
A client that asks and then never reads held its connection for ever too (a dashboard's event stream, or an
answer larger than the socket's buffers, waits for the client to take what was sent): 512 of them locked every
later caller out with 503s, the probes included. So a connection whose answer has not moved for
``WRITE_STALL_SECONDS`` while it waits on the client is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("kubecell.http")

REQUEST_SECONDS = 30.0
"""The longest a client may take to send one request, head and body, from when the connection awaits it. Every
legitimate caller is far quicker and gives up sooner: kube-scheduler waits 5 s for an extender (its default
``httpTimeout``), the API server at most 30 s for a webhook, a probe or a scrape seconds."""
WRITE_STALL_SECONDS = 30.0
"""The longest an answer may wait for its client to read (the transport's buffer full, writing paused) before the
connection is aborted. A reading client takes what is sent in milliseconds; a slow network in seconds."""
HANDSHAKE_SECONDS = 10.0
"""The longest a TLS client may take over its handshake. The API server calling a webhook takes milliseconds."""
MAX_CONNECTIONS = 512
"""The most connections open at once (fewer where the descriptor limit is low: half of it). Callers need a few
dozen (kube-scheduler's pool, probes, scrapes, dashboards); the rest of the descriptors stay for the process's
own calls (the API server, the leader's Lease), which a flood of sockets must never starve."""
_BUSY_TEXT = b"too many open connections"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT))


def _connection_limit() -> int:
    """``MAX_CONNECTIONS``, or half the soft descriptor limit where that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(16, min(MAX_CONNECTIONS, soft // 2))


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the two bounds it lacks (see the module): a deadline on receiving each
    request, and a cap on open connections. A request received whole is the app's time, never cut short (an
    extender call waits up to 4 s for the scheduler thread; an event stream runs for hours)."""

    request_seconds: float = REQUEST_SECONDS
    max_connections: int = MAX_CONNECTIONS
    write_stall_seconds: float = WRITE_STALL_SECONDS
    _deadline: asyncio.TimerHandle | None = None
    _stalled: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:  # answered at once, never queued behind the others
            self.transport = transport
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        self._await_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # kept alive: the next request has the same time to arrive
            self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._stalled):
            if timer is not None:
                timer.cancel()
        self._deadline = self._stalled = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The client stopped reading (the transport's buffer is full): it has ``write_stall_seconds`` to go on."""
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.write_stall_seconds, self._stall)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _stall(self) -> None:
        """Aborted, not closed: a close waits to flush what the client will never read."""
        self._stalled = None
        log.debug("aborting a connection from %s that read nothing of its answer for %.0f s", self.client,
                  self.write_stall_seconds)
        self.transport.abort()

    def _await_request(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.request_seconds, self._expire)

    def _expire(self) -> None:
        """The request has not arrived whole in time: close (an app reading its body sees a disconnect)."""
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            return
        log.debug("closing a connection from %s that sent no whole request within %.0f s", self.client,
                  self.request_seconds)
        self.transport.close()


class _HandshakeBoundedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, with a TLS server's handshake bounded (uvicorn creates its server without a bound)."""

    def __init__(self, handshake_seconds: float) -> None:
        super().__init__()
        self.handshake_seconds = handshake_seconds

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
            kwargs["ssl_handshake_timeout"] = self.handshake_seconds
        return await super().create_server(*args, **kwargs)


def _run(server: uvicorn.Server, sock: socket.socket, handshake_seconds: float) -> None:
    """The server's thread: ``uvicorn.Server.run``, on a loop that bounds TLS handshakes."""
    with asyncio.Runner(loop_factory=lambda: _HandshakeBoundedLoop(handshake_seconds)) as runner:
        runner.run(server.serve(sockets=[sock]))


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


def serve(app: ASGIApp, host: str, port: int, *, started_timeout: float = 10.0,
          tls: tuple[str, str] | None = None, request_seconds: float = REQUEST_SECONDS,
          max_connections: int | None = None, handshake_seconds: float = HANDSHAKE_SECONDS,
          write_stall_seconds: float = WRITE_STALL_SECONDS) -> Served:
    """Serve ``app`` on ``host``:``port`` (0: any free port) from a daemon thread; over HTTPS with ``tls``
    (certificate and key files, PEM), as an admission webhook must be. ``request_seconds``, ``handshake_seconds``,
    ``write_stall_seconds`` and ``max_connections`` (default: :func:`_connection_limit`) bound slow and piled-up
    clients (see the module);
    requests in progress past ``max_connections`` get uvicorn's own 503 (``limit_concurrency``).

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
    limit = max_connections if max_connections is not None else _connection_limit()
    protocol = type("BoundedH11", (BoundedH11Protocol,), {"request_seconds": request_seconds,
                                                           "max_connections": limit,
                                                           "write_stall_seconds": write_stall_seconds})
    # limit_concurrency counts this connection too: one more, so the cap above is what turns callers away
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", http=protocol,
                            limit_concurrency=limit + 1, timeout_graceful_shutdown=1, ws="none",
                            ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=_run, args=(server, sock, handshake_seconds), name="http", daemon=True)
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
