"""The REST client against answers that break: whatever goes wrong between the client and the server surfaces
as :class:`ApiError`, the one error its callers (the leader election, the scheduler's cycle, the watchers)
handle. A server on loopback stands in for an API server whose answer is cut off (a restart mid-response)
or is not JSON (a proxy's page); every wait is bounded."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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


@pytest.fixture
def hung_server() -> Iterator[str]:
    """The URL of a loopback server that accepts connections (the kernel does, from its backlog) and never
    answers: an API server that hangs."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def _kubeconfig(directory: Path, server: str) -> Path:
    path = directory / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


@pytest.mark.parametrize("call", ["get", "replace"])
def test_the_timeout_a_caller_gives_is_the_wait_it_gets_from_a_hung_server(hung_server: str, tmp_path: Path,
                                                                          call: str) -> None:
    """Before, urllib3's default retries (3, for GET and PUT) read the hung server four times over: a 0.5 s
    timeout waited 2 s, and the default 30 s two minutes."""
    kube = Kube.from_kubeconfig(_kubeconfig(tmp_path, hung_server), timeout=0.5)
    send: Callable[[], object] = ((lambda: kube.get("/api/v1/pods")) if call == "get" else
                                  (lambda: kube.replace("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", {})))
    began = time.monotonic()
    try:
        with pytest.raises(ApiError) as raised:
            send()
    finally:
        kube.close()
    waited = time.monotonic() - began
    assert raised.value.unavailable
    assert waited < 1.5, f"waited {waited:.2f} s for a 0.5 s timeout"


def test_a_connection_the_server_drops_unanswered_is_sent_again_once(tmp_path: Path) -> None:
    """An API server restarting closes the connection a request was sent on, unanswered: that costs no wait, and a
    read is sent again once on a new connection (only what timed out is never retried)."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        server.settimeout(10)
        answered: list[int] = []

        def serve() -> None:
            first, _ = server.accept()
            first.recv(65536)
            first.close()  # read the request, answered nothing
            second, _ = server.accept()
            with second:
                second.recv(65536)
                body = b'{"kind": "PodList", "items": []}'
                second.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                               + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                answered.append(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        kube = Kube.from_kubeconfig(_kubeconfig(tmp_path, f"http://127.0.0.1:{server.getsockname()[1]}"), timeout=5)
        try:
            assert kube.get("/api/v1/pods")["kind"] == "PodList"
        finally:
            kube.close()
        thread.join(timeout=10)
    assert answered == [1]
