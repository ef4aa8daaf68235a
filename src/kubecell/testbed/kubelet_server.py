"""The process kubelet's HTTPS endpoint: ``/containerLogs``, so that ``kubectl logs`` works.

``kubectl logs`` asks the API server for ``pods/log``; the API server looks up the pod's node, takes
the node's address (``status.addresses``, by ``--kubelet-preferred-address-types``: the process kubelet
reports only ``InternalIP`` 127.0.0.1) and the kubelet's port (``status.daemonEndpoints.kubeletEndpoint.
Port``), and proxies ``GET /containerLogs/<namespace>/<pod>/<container>?follow=&tailLines=&limitBytes=&
previous=`` to it over HTTPS. This module serves exactly that path (and ``/healthz``) on 127.0.0.1.

TLS, both ways, follows what the API server is given:

* an API server started without ``--kubelet-certificate-authority`` (the testbed's today) does not
  verify kubelets' certificates, so a certificate of the process kubelet's own is enough;
  :func:`serving_certificate` signs it with an issuer when one is given (the CA the API server trusts
  for kubelets), else makes it self-signed;
* an API server started without ``--kubelet-client-certificate`` presents no client certificate; with
  ``client_ca`` the endpoint requires one signed by that CA, as a real kubelet does with
  ``--client-ca-file``. Without it anyone on this machine who can reach the loopback port may read the
  logs of the pods this kubelet runs (the testbed's user runs those processes anyway).

Each connection is handled in its own thread, the TLS handshake included, with a socket timeout, so a
client that stalls holds one thread for at most that long; a followed log ends when its container's
process has ended and the file is drained, when the kubelet stops, or when the client goes away.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CONNECTION_TIMEOUT = 30.0
"""Seconds a connection may stall (handshake, request, a write the client does not read)."""
FOLLOW_POLL = 0.1
CHUNK = 64 * 1024

LogFinder = Callable[[str, str, str, bool], "Path | str"]
"""``(namespace, pod, container, previous)`` -> the log file, or why there is none (the answer's text)."""


def serving_certificate(directory: Path, *, issuer: tuple[Path, Path] | None = None,
                        names: tuple[str, ...] = ("localhost",)) -> tuple[Path, Path]:
    """Write a serving certificate for 127.0.0.1 (and ``names``) and its key into ``directory``; signed
    by ``issuer`` (certificate and key files) when given, else self-signed. Returns (certificate, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubecell-process-kubelet")])
    if issuer is not None:
        issuer_cert = x509.load_pem_x509_certificate(issuer[0].read_bytes())
        issuer_key: Any = serialization.load_pem_private_key(issuer[1].read_bytes(), password=None)
        issuer_name = issuer_cert.subject
    else:
        issuer_key, issuer_name = key, subject
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    *(x509.DNSName(name) for name in names)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "kubelet.crt", directory / "kubelet.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def tail_offset(path: Path, lines: int) -> int:
    """The offset where the last ``lines`` lines of the file start (read backwards, a chunk at a time)."""
    with open(path, "rb") as handle:
        end = handle.seek(0, 2)
        if lines <= 0:
            return end
        position, seen = end, 0
        trailing = True  # a final newline ends the last line; it does not start another
        while position > 0:
            step = min(CHUNK, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            for index in range(len(block) - 1, -1, -1):
                if block[index] != 0x0A:
                    trailing = False
                    continue
                if trailing and position + index == end - 1:
                    continue
                seen += 1
                if seen == lines:
                    return position + index + 1
        return 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, context: ssl.SSLContext, find: LogFinder, live: Callable[[Path], bool],
                 stop: threading.Event) -> None:
        self.context = context
        self.find = find
        self.live = live
        self.stop = stop
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake here, in the connection's own thread, never in the accept loop."""
        request.settimeout(CONNECTION_TIMEOUT)
        try:
            secured = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            handler: Any = self.RequestHandlerClass  # typeshed wants the base server type here
            handler(secured, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                secured.close()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CONNECTION_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the API server's proxying is not worth a line per request."""

    def _answer(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            self._answer(200, "ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._answer(404, f"{url.path}: the process kubelet serves /containerLogs/<namespace>/<pod>/<container>")
            return
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            tail = int(query["tailLines"]) if "tailLines" in query else None
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
        except ValueError:
            self._answer(400, "tailLines and limitBytes are whole numbers")
            return
        follow, previous = query.get("follow") == "true", query.get("previous") == "true"
        found = self.server.find(parts[1], parts[2], parts[3], previous)
        if isinstance(found, str):
            self._answer(400, found)
            return
        self._stream(found, follow=follow, tail=tail, limit=limit)

    def _stream(self, path: Path, *, follow: bool, tail: int | None, limit: int | None) -> None:
        try:
            start = tail_offset(path, tail) if tail is not None else 0
            handle = open(path, "rb")  # noqa: SIM115 - closed below, after a possibly long follow
        except OSError as error:
            self._answer(404, f"cannot read the log: {error.strerror}")
            return
        with handle:
            handle.seek(start)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Connection", "close")
            self.end_headers()
            left = limit if limit is not None and limit >= 0 else None
            try:
                while left is None or left > 0:
                    data = handle.read(CHUNK if left is None else min(CHUNK, left))
                    if data:
                        self.wfile.write(data)
                        if left is not None:
                            left -= len(data)
                        continue
                    if not follow or self.server.stop.is_set() or not self.server.live(path):
                        if follow and not self.server.stop.is_set():
                            rest = handle.read(CHUNK if left is None else min(CHUNK, left))
                            if rest:  # written between the last read and the process's end
                                self.wfile.write(rest)
                                continue
                        break
                    self.server.stop.wait(FOLLOW_POLL)
            except (OSError, ssl.SSLError):
                return  # the client went away


class KubeletServer:
    """``/containerLogs`` and ``/healthz`` over HTTPS on 127.0.0.1 (see the module docstring)."""

    def __init__(self, find: LogFinder, live: Callable[[Path], bool], stop: threading.Event, *,
                 certificate: tuple[Path, Path], client_ca: Path | None = None) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(certificate[0]), str(certificate[1]))
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(client_ca))
        self._server = _Server(context, find, live, stop)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="kubelet-server", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def start(self) -> KubeletServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

