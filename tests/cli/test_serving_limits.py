"""Slow and piled-up clients of every kubecell HTTP port (``kubecell.cli.serving``): a request must arrive whole
within the deadline or its connection is closed, and connections past the cap are answered 503 at once. All
servers listen on loopback; every loop is bounded in count and time."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from kubecell.cli.serving import Served, serve


async def _slow(request: Request) -> Response:
    await anyio.sleep(1.5)  # the app's own time, as the extender waits for the scheduler thread
    return PlainTextResponse("done")


async def _echo(request: Request) -> Response:
    return PlainTextResponse(str(len(await request.body())))


async def _chunks() -> AsyncIterator[bytes]:
    for _ in range(20_000):  # 1.3 GB at most: no client of these tests reads that far
        yield b"x" * 65_536


def _endless(request: Request) -> Response:
    return StreamingResponse(_chunks(), media_type="application/octet-stream")


APP = Starlette(routes=[Route("/healthz", lambda r: PlainTextResponse("ok")), Route("/slow", _slow),
                        Route("/echo", _echo, methods=["POST"]), Route("/endless", _endless)])


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """A server with a 1 s request deadline (``indirect`` parametrization: another), 8 connections at most."""
    server = serve(APP, "127.0.0.1", 0, request_seconds=getattr(request, "param", 1.0), max_connections=8,
                   write_stall_seconds=1.0)
    try:
        yield server
    finally:
        server.stop()


def status(served: Served, request: bytes = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n") -> str:
    with socket.create_connection(("127.0.0.1", served.port), timeout=3) as sock:
        sock.sendall(request)
        return sock.recv(200).split(b"\r\n")[0].decode()


def closed_after(sock: socket.socket, trickle: bytes, limit: float = 4.0) -> float | None:
    """Send ``trickle`` a byte every 0.1 s; the seconds until the server closed the connection (None: never)."""
    sock.settimeout(0.1)
    started = time.monotonic()
    for byte in [trickle[i:i + 1] for i in range(len(trickle))]:
        if time.monotonic() - started > limit:
            return None
        try:
            sock.send(byte)
            if sock.recv(100) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started
    return None


def test_a_head_sent_a_byte_at_a_time_is_cut_off(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        seconds = closed_after(sock, b"GET /healthz HTTP/1.1\r\n" + b"x-a: b\r\n" * 20)
    assert seconds is not None, "a slowloris head kept its connection for ever"
    assert seconds < 2.5
    assert status(served) == "HTTP/1.1 200 OK"


def test_a_body_sent_a_byte_at_a_time_is_cut_off(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        seconds = closed_after(sock, b"x" * 100)
    assert seconds is not None, "a slow body kept its connection (and what it sent) for ever"
    assert seconds < 2.5


def test_a_kept_alive_connection_has_the_same_deadline_for_its_next_request(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=3) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(200).startswith(b"HTTP/1.1 200")
        seconds = closed_after(sock, b"GET /healthz HTTP/1.1\r\n" + b"x-a: b\r\n" * 20)
    assert seconds is not None
    assert seconds < 2.5


def test_an_idle_connection_is_closed(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(3)
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 2.5


def test_a_request_received_whole_is_never_cut_short(served: Served) -> None:
    """The deadline is on the client's sending, not on the app's answering (which outlasts it here)."""
    assert status(served, b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n") == "HTTP/1.1 200 OK"


@pytest.mark.parametrize("served", [30.0], indirect=True)  # idle sockets kept however slow the machine
def test_connections_past_the_cap_are_answered_503_at_once(served: Served) -> None:
    idle = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(8)]
    try:
        time.sleep(0.1)  # all accepted
        started = time.monotonic()
        assert status(served) == "HTTP/1.1 503 Service Unavailable"
        assert time.monotonic() - started < 2.0, "at once, not when an idle socket's time is up"
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 3
    while status(served) != "HTTP/1.1 200 OK":  # the server sees the closes within moments
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_clients_that_ask_and_never_read_are_cut_off_and_lock_nobody_out(served: Served) -> None:
    """Before, a connection whose answer waited on its client was held for ever: as many as the cap (512 event
    streams of the dashboard, never read) answered every later caller, the probes included, with 503."""
    hoarders = []
    try:
        for _ in range(8):  # the fixture's cap
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", served.port))
            sock.sendall(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
            hoarders.append(sock)
        time.sleep(0.3)
        assert status(served) == "HTTP/1.1 503 Service Unavailable", "the cap is full of clients that never read"
        deadline = time.monotonic() + 8
        while status(served) != "HTTP/1.1 200 OK" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status(served) == "HTTP/1.1 200 OK"
        for sock in hoarders:  # each was aborted: what it reads ends (a reset, or the end of what was sent)
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(1 << 20):
                    pass
    finally:
        for sock in hoarders:
            sock.close()


def test_a_client_that_reads_slowly_but_steadily_is_never_cut(served: Served) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", served.port))
        sock.sendall(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
        sock.settimeout(3)
        received, started = 0, time.monotonic()
        while time.monotonic() - started < 2.5:  # past the 1 s stall bound, reading a little every 0.5 s
            received += len(sock.recv(65_536))
            time.sleep(0.5)
        assert received > 0
        assert sock.recv(65_536), "still served"
