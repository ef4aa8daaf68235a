"""Hostile clients of the right-sizing webhook (``kubecell.profiler.webhook``) over its real HTTPS server on
loopback: malformed reviews are 400 (never 500, never a crash), a huge one is 413 before it is read, the review
bytes held together are bounded, and a TLS handshake of garbage leaves the server serving."""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubecell.cli.serving import Served, serve
from kubecell.profiler.webhook import MAX_BODY_BYTES, webhook_app

HELD = 512 * 1024


def _certificate(directory: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256()))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return str(directory / "tls.crt"), str(directory / "tls.key")


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    """The webhook over TLS with a 1 s request deadline (``indirect`` parametrization: another) and a 1 s
    handshake deadline."""
    server = serve(webhook_app(lambda pod: 500, max_held_bytes=HELD), "127.0.0.1", 0,
                   tls=_certificate(tmp_path), request_seconds=getattr(request, "param", 1.0), handshake_seconds=1.0)
    try:
        yield server
    finally:
        server.stop()


def _context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def post(served: Served, body: bytes, headers: dict[str, str] | None = None) -> int:
    connection = http.client.HTTPSConnection("127.0.0.1", served.port, timeout=5, context=_context())
    try:
        connection.request("POST", "/mutate", body=body, headers=headers or {})
        return connection.getresponse().status
    finally:
        connection.close()


def healthy(served: Served) -> bool:
    connection = http.client.HTTPSConnection("127.0.0.1", served.port, timeout=5, context=_context())
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    finally:
        connection.close()


def review(request: object) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


@pytest.mark.parametrize("body", [
    b"[" * 200_000, b'{"a":' * 50_000, b"\xff\xfe not utf-8", b"[]", b'"AdmissionReview"',
    review([]), review({"uid": ["u"]}),
], ids=["deep-list", "deep-object", "binary", "list", "string", "request-list", "uid-list"])
def test_what_is_no_review_is_a_400(served: Served, body: bytes) -> None:
    assert post(served, body) == 400
    assert healthy(served)


@pytest.mark.parametrize("pod", [[], {"metadata": []}, {"metadata": {}, "spec": []},
                                 {"metadata": {}, "spec": {"containers": {"c": 1}}},
                                 {"metadata": {}, "spec": {"containers": [[]]}}])
def test_a_pod_of_any_shape_is_let_through(served: Served, pod: object) -> None:
    body = review({"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ns", "object": pod})
    assert post(served, body) == 200


def test_a_review_declared_over_the_bound_is_413_before_it_is_read(served: Served) -> None:
    started = time.monotonic()
    assert post(served, b"x" * 1024, {"content-length": str(100 * 1024 * 1024)}) == 413
    assert time.monotonic() - started < 1.0
    assert MAX_BODY_BYTES < 100 * 1024 * 1024


@pytest.mark.parametrize("served", [30.0], indirect=True)  # the stalled review kept however slow the machine
def test_review_bytes_held_together_are_bounded(served: Served) -> None:
    stalled = _context().wrap_socket(socket.create_connection(("127.0.0.1", served.port), timeout=3))
    try:
        stalled.sendall(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (2 * HELD))
        stalled.sendall(b" " * (HELD * 3 // 4))
        time.sleep(0.2)
        assert post(served, b" " * (HELD // 2)) == 503  # pods pass by the failurePolicy; memory stays bounded
    finally:
        stalled.close()
    deadline = time.monotonic() + 3
    while post(served, b" " * (HELD // 2)) != 400:  # given back: read, and found to be no review
        assert time.monotonic() < deadline
        time.sleep(0.05)


def closed_by_server(sock: socket.socket, limit: float = 3.0) -> bool:
    """Whether the server ends the connection within ``limit`` seconds (an alert, then the close)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


def test_a_garbage_or_unfinished_handshake_leaves_the_server_serving(served: Served) -> None:
    unfinished = socket.create_connection(("127.0.0.1", served.port), timeout=3)
    try:
        unfinished.sendall(b"\x16\x03")  # the start of a client hello, and nothing more: the handshake waits
        for hello in (b"\x16\x03\x01\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n", bytes(range(256)) * 8):
            with socket.create_connection(("127.0.0.1", served.port), timeout=3) as sock:
                sock.sendall(hello)
                assert closed_by_server(sock)
        assert healthy(served)
    finally:
        unfinished.close()


@pytest.mark.parametrize("sent", [b"", b"\x16\x03"], ids=["nothing", "half-a-hello"])
def test_a_handshake_that_never_finishes_is_cut_off(served: Served, sent: bytes) -> None:
    """A client that opens a connection to the TLS port and never finishes its handshake: asyncio's default
    kept the socket 60 s (uvicorn set no bound), and those sockets were not counted against the connection cap
    either, so a few thousand of them took the process's descriptors."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=3) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert closed_by_server(sock, limit=5.0), "the handshake was given longer than its bound"
        assert time.monotonic() - started < 4.0
    assert healthy(served)
