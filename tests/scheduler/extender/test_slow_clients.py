"""Hostile clients of the extender's port: the request bytes all calls hold together are bounded (past it, 503
at once), a slow body gives its share back when its connection is cut, and JSON nested past the interpreter's
stack is a 400, not a 500. Loopback only; every wait bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import anyio
import anyio.to_thread
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kubecell.cli.serving import Served, serve
from kubecell.scheduler.extender import protocol
from kubecell.scheduler.extender.http import routes
from kubecell.scheduler.extender.verbs import Extender, Verdict

HELD = 256 * 1024


class _Stub:
    """Answers every filter with its candidates passed: the HTTP layer is what is under test."""

    def filter(self, pod: dict[str, Any], candidates: list[str]) -> Verdict:
        return Verdict(list(candidates), {}, {})


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """The extender's routes with a 1 s request deadline (``indirect`` parametrization: another)."""
    app = Starlette(routes=routes(cast(Extender, _Stub()), ready=lambda: True, max_held_bytes=HELD))
    server = serve(app, "127.0.0.1", 0, request_seconds=getattr(request, "param", 1.0))
    try:
        yield server
    finally:
        server.stop()


def filter_body(size: int) -> bytes:
    """A filter of about ``size`` bytes (padded with candidate names)."""
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    names = [f"node-{i:06d}" for i in range(max(1, size // 15))]
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def post(served: Served, body: bytes) -> str:
    with socket.create_connection(("127.0.0.1", served.port), timeout=3) as sock:
        sock.sendall(b"POST /extender/filter HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        return sock.recv(200).split(b"\r\n")[0].decode()


@pytest.mark.parametrize("served", [30.0], indirect=True)  # the stalled body kept however slow the machine
def test_request_bytes_held_together_are_bounded(served: Served) -> None:
    assert post(served, filter_body(HELD // 2)) == "HTTP/1.1 200 OK"
    stalled = socket.create_connection(("127.0.0.1", served.port))
    try:  # most of the budget, sent and then nothing more: held until the connection is cut
        stalled.sendall(b"POST /extender/filter HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (2 * HELD))
        stalled.sendall(b" " * (HELD * 3 // 4))
        time.sleep(0.2)
        started = time.monotonic()
        assert post(served, filter_body(HELD // 2)) == "HTTP/1.1 503 Service Unavailable"
        assert time.monotonic() - started < 2.0
    finally:
        stalled.close()
    deadline = time.monotonic() + 3  # given back once the stalled request is gone
    while post(served, filter_body(HELD // 2)) != "HTTP/1.1 200 OK":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_stalled_body_is_cut_off_and_gives_its_bytes_back(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=3) as stalled:
        stalled.sendall(b"POST /extender/filter HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (2 * HELD))
        stalled.sendall(b" " * (HELD * 3 // 4))
        started = time.monotonic()
        assert stalled.recv(100) == b""  # cut by the request deadline (1 s here), kept open by the client
        assert time.monotonic() - started < 2.5
    assert post(served, filter_body(HELD // 2)) == "HTTP/1.1 200 OK"


def test_json_nested_too_deeply_is_a_protocol_error() -> None:
    with pytest.raises(protocol.ProtocolError, match="nested too deeply"):
        protocol.parse_args(b"[" * 200_000)
    with pytest.raises(protocol.ProtocolError, match="nested too deeply"):
        protocol.parse_binding(b'{"a":' * 200_000)


def test_json_nested_too_deeply_is_answered_400(served: Served) -> None:
    assert post(served, b"[" * 100_000) == "HTTP/1.1 400 Bad Request"



def test_a_busy_shared_thread_pool_never_delays_a_filter() -> None:
    """Routes without an ``async`` body (``/metrics``, ``/api/snapshot``) run in anyio's default thread pool: a
    flood of them held every thread, and kube-scheduler's filter waited behind them past its 5 s timeout. The
    extender's verbs have threads of their own."""
    gate = threading.Event()

    async def hog(_: Request) -> PlainTextResponse:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 2  # the shared pool, made small
        await anyio.to_thread.run_sync(gate.wait, 10.0)
        return PlainTextResponse("done")

    app = Starlette(routes=[*routes(cast(Extender, _Stub()), ready=lambda: True), Route("/hog", hog)])
    server = serve(app, "127.0.0.1", 0)
    hogs = [threading.Thread(target=_get, args=(server.port, "/hog"), daemon=True) for _ in range(3)]
    try:
        for hog_client in hogs:
            hog_client.start()
        time.sleep(0.3)  # the two threads of the shared pool taken, the third hog waiting for one
        started = time.monotonic()
        assert post(server, filter_body(1000)) == "HTTP/1.1 200 OK"
        assert time.monotonic() - started < 2.0
    finally:
        gate.set()
        for hog_client in hogs:
            hog_client.join(10)
        server.stop()


def _get(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        sock.recv(100)
