"""Serving an ASGI app from a daemon thread under uvicorn, for every kubecell process with an HTTP port.

The scheduler's port (health, metrics, dashboard, extender), the elastic controller's probes and the
right-sizing admission webhook all serve this way, so the process's own loop keeps the main thread (and its
signal handling), a port in use fails the caller at once, and every stop is bounded.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

log = logging.getLogger("kubecell.http")


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
