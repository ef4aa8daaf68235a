"""The node agent's metrics port against slow and piled-up clients: a thread per connection only up to
``METRICS_CONNECTIONS`` (past it, 503 at once), and a client that stops sending is dropped. Loopback only;
every wait bounded."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

import pytest
from prometheus_client import CollectorRegistry, Gauge

from kubecell.node import agent
from kubecell.node.agent import serve_metrics


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[WSGIServer]:
    monkeypatch.setattr(agent, "METRICS_CONNECTIONS", 4)
    monkeypatch.setattr(agent._MetricsHandler, "timeout", 0.5)
    registry = CollectorRegistry()
    Gauge("kubecell_test", "a gauge", registry=registry).set(1)
    served = serve_metrics(registry, "127.0.0.1", 0)
    try:
        yield served
    finally:
        served.shutdown()
        served.server_close()


def status(server: WSGIServer) -> str:
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=3) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        return sock.recv(200).split(b"\r\n")[0].decode()


def test_slow_clients_hold_at_most_the_bounded_threads(server: WSGIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # slow clients held for longer than a loaded machine takes to reach the probe (read at each connection)
    monkeypatch.setattr(agent._MetricsHandler, "timeout", 10.0)

    def serving() -> int:  # (other tests' threads may come and go meanwhile: count only this server's)
        return sum("process_request_thread" in thread.name for thread in threading.enumerate())

    before = serving()
    slow = [socket.create_connection(("127.0.0.1", server.server_address[1])) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(b"G")
        time.sleep(0.2)
        assert serving() - before <= 4, "a thread per slow client up to the bound, however many clients"
        started = time.monotonic()
        assert status(server) == "HTTP/1.0 503 Service Unavailable"
        assert time.monotonic() - started < 2.0, "at once, not when a slow client's 10 s are up"
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 3
    while status(server) != "HTTP/1.0 200 OK":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_client_that_stops_sending_is_dropped(server: WSGIServer) -> None:
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=3) as sock:
        sock.sendall(b"GET /metr")
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 2.0


def test_a_client_that_trickles_is_dropped_at_the_connection_deadline(server: WSGIServer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.3 s keeps under the 0.5 s socket timeout for ever: the thread was held as long as the
    client liked, and 32 such clients took every slot."""
    monkeypatch.setattr(agent, "METRICS_CONNECTION_SECONDS", 1.5)
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=0.3) as sock:
        started = time.monotonic()
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\n" + b"x" * 40:
            if time.monotonic() - started > 5:
                break
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(100) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed, "the trickling client kept its connection"
        assert time.monotonic() - started < 3.0
    assert status(server) == "HTTP/1.0 200 OK"
