"""The REST client against answers that break: whatever goes wrong between the client and the server surfaces
as :class:`ApiError`, the one error its callers (the leader election, the scheduler's cycle, the watchers)
handle. A server on loopback stands in for an API server whose answer is cut off (a restart mid-response)
or is not JSON (a proxy's page); every wait is bounded."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from kubecell.kube.rest import ApiError, Kube

Answer = Callable[[socket.socket], None]


@pytest.fixture
def answering() -> Iterator[Callable[[Answer], Kube]]:
    """A client of a loopback server that answers each request with ``answer`` (1 s timeout)."""
    servers: list[socket.socket] = []
    clients: list[Kube] = []

    def start(answer: Answer) -> Kube:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(5)
        servers.append(server)

        def accept() -> None:
            for _ in range(8):  # the client's retries included; bounded
                try:
                    connection, _ = server.accept()
                except OSError:
                    return
                with connection:
                    connection.settimeout(5)
                    connection.recv(65536)
                    answer(connection)

        threading.Thread(target=accept, daemon=True).start()
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
        kube = Kube(client.ApiClient(configuration), timeout=1.0)
        clients.append(kube)
        return kube

    yield start
    for kube in clients:
        kube.close()
    for server in servers:
        server.close()


def _cut_off(connection: socket.socket) -> None:
    """Headers promising 100 bytes, then 5 of them, then the connection closes: a server gone mid-answer."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":")


def _chunked_cut_off(connection: socket.socket) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"5\r\n{\"a\":\r\n")


def _not_json(connection: socket.socket) -> None:
    page = b"<html>502 Bad Gateway</html>"
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(page), page))


def _error_cut_off(connection: socket.socket) -> None:
    connection.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n{\"mess")


@pytest.mark.parametrize("answer", [_cut_off, _chunked_cut_off, _error_cut_off], ids=lambda a: a.__name__)
@pytest.mark.parametrize("call", ["get", "replace"])
def test_an_answer_cut_off_mid_body_is_an_unavailable_api_error(answering: Callable[[Answer], Kube],
                                                                  answer: Answer, call: str) -> None:
    """Before, the body was read outside the client's error mapping: urllib3's ``ProtocolError`` escaped, and
    the leader election, which handles ``ApiError``, lost its thread while its replica went on leading."""
    kube = answering(answer)
    send: Callable[[], object] = ((lambda: kube.get("/api/v1/pods")) if call == "get" else
                                  (lambda: kube.replace("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", {})))
    with pytest.raises(ApiError) as raised:
        send()
    assert raised.value.unavailable
    assert "/api" in str(raised.value)


def test_an_answer_that_is_not_json_is_an_api_error(answering: Callable[[Answer], Kube]) -> None:
    kube = answering(_not_json)
    with pytest.raises(ApiError, match="not JSON") as raised:
        kube.get("/api/v1/pods")
    assert raised.value.unavailable
