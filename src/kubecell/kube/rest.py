"""A thin JSON client over the official ``kubernetes`` client's transport.

The official client does the hard parts (kubeconfig and in-cluster config, TLS, token refresh,
connection pooling); its generated model classes are what we skip. A scheduler that lists 50,000
pods and watches every change spends most of its time turning JSON into those objects and back, and
the rest of kubecell already speaks plain dicts with the API's own field names. So requests go
through ``ApiClient.param_serialize``/``call_api`` and come back as ``dict`` (one ``json.loads``), and
watches are read line by line from the same connection.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from kubecell.core.errors import KubecellError
from kubecell.inputs.bounded_yaml import BoundedLoader, YamlRefused

_SEGMENT = re.compile(r"[^/?#%\s\\]+")
"""A path segment as kubecell's paths have them (API groups, versions, names): nothing that could make a name
read from a pod or an owner reference point elsewhere once sent (``..``, ``?``, ``#``, an escape)."""


def checked_path(path: str) -> str:
    """``path`` if every segment is one a name can be (see ``_SEGMENT``), else :class:`ApiError` 400.

    Why here: paths are built from names that pods and owner references carry, and urllib3 resolves ``..``
    before sending (``/namespaces/a/elasticjobs/../../b/elasticjobs/x`` reaches namespace ``b``), so every
    request goes through this, whatever each caller checked."""
    segments = path.split("/")
    if segments[0] or not all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments[1:]):
        raise ApiError(400, "BadRequest", f"refused to send a request to {path!r}: a segment is empty, '.', "
                                          "'..' or holds '?', '#', '%', a backslash or a space")
    return path


class KubeconfigError(KubecellError, ConfigException):
    """A kubeconfig that cannot be used (absent, unreadable, not a kubeconfig): one line for the user, and still
    the ``ConfigException`` callers of the official client catch."""


PatchKind = Literal["strategic", "merge", "json", "apply"]
PATCH_TYPES: Mapping[str, str] = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}



def json_pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer for a ``json`` patch: ``("status", "capacity", "kubecell.io/gpu-memory")`` ->
    ``/status/capacity/kubecell.io~1gpu-memory`` (``~`` is ``~0``, ``/`` in a key ``~1``)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


class ApiError(KubecellError):
    """An error answer of the API server: its HTTP status, reason and message."""

    def __init__(self, status: int, reason: str, message: str, *, method: str = "", path: str = "") -> None:
        self.status = status
        self.reason = reason
        self.api_message = message
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status} {reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def unavailable(self) -> bool:
        """No answer (refused, reset, timed out) or a 5xx: worth retrying after a back-off."""
        return self.status == 0 or self.status >= 500


class RetryUnlessTimedOut(urllib3.util.Retry):
    """urllib3's retries, but none after a timeout. Its default (3, for GET, PUT and DELETE alike) made a request
    to a hung API server wait 4 x ``timeout`` before the caller heard of it, a leader's lease renewal or a
    cycle's read included; so a request that timed out is an ``ApiError`` (``unavailable``) at once, which every
    caller handles (the leader election renews again, a watcher relists, a write is retried with back-off or at
    the next cycle). One retry stays for what costs no wait: a pooled connection the server closed meanwhile
    (an API server restarted), a refused connection (urllib3 sends again only what is safe to send twice)."""

    def increment(self, method: str | None = None, url: str | None = None, response: Any = None,
                  error: Exception | None = None, _pool: Any = None, _stacktrace: Any = None) -> Any:
        if isinstance(error, urllib3.exceptions.TimeoutError):
            return urllib3.util.Retry(total=0).increment(method, url, response, error, _pool, _stacktrace)
        return super().increment(method, url, response, error, _pool, _stacktrace)


@dataclass
class Kube:
    """JSON requests to one API server, authenticated as the kubeconfig (or the pod's service account).

    ``timeout`` bounds each request (``from_kubeconfig`` retries nothing that timed out,
    :class:`RetryUnlessTimedOut`, so it is the whole wait; a caller that builds ``api`` itself sets ``retries``
    on its configuration, as ``from_kubeconfig`` does)."""

    api: client.ApiClient
    timeout: float = 30.0

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path | None = None, *, pool: int = 32, timeout: float = 30.0) -> Kube:
        configuration = client.Configuration()
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except ConfigException as error:
                raise KubeconfigError(f"no kubeconfig given and not in a pod: {error}") from None
        else:
            _check_kubeconfig(Path(kubeconfig))
            try:
                config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
            except ConfigException as error:
                raise KubeconfigError(f"cannot read kubeconfig {kubeconfig}: {error}") from None
            except OSError as error:
                raise KubeconfigError(f"cannot read kubeconfig {kubeconfig}: {error.strerror or error}") from None
            except (UnicodeDecodeError, yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError,
                    RecursionError) as error:
                # the client parses the file without checking its shape: a binary file, broken YAML or a list
                # where a mapping belongs would escape as whatever the parser raised
                said = " ".join(str(error).split())[:MAX_ERROR_CHARS]  # one line, and short
                raise KubeconfigError(f"cannot read kubeconfig {kubeconfig}: not a kubeconfig: "
                                      f"{type(error).__name__}: {said}") from None
        configuration.connection_pool_maxsize = pool
        configuration.retries = RetryUnlessTimedOut(total=1, status=0, redirect=0)
        return cls(client.ApiClient(configuration), timeout)

    def close(self) -> None:
        self.api.close()


    def _send(self, method: str, path: str, *, query: Sequence[tuple[str, Any]] = (), body: Any = None,
              content_type: str | None = None, timeout: float | tuple[float, float] | None = None,
              stream: bool = False) -> Any:
        checked_path(path)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = self.api.param_serialize(method, path, query_params=list(query), header_params=headers,
                                          body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(*params, _request_timeout=timeout or self.timeout)
            if stream and 200 <= response.status <= 299:
                return response
            # The body is read here, inside the mapping: an answer cut off mid-body (an API server restarting,
            # a connection reset) raised urllib3's own error past every caller, which handle ``ApiError``.
            data = response.read()
        except client.exceptions.ApiException as error:
            raise _api_error(error.status or 0, error.reason or "", error.body, method, path) from None
        except urllib3.exceptions.HTTPError as error:  # refused, reset, timed out, cut off: the server is not there
            raise ApiError(0, "Unavailable", str(error), method=method, path=path) from None
        if not 200 <= response.status <= 299:
            raise _api_error(response.status, response.reason or "", data, method, path)
        try:
            return loads(data) if data else {}
        except ValueError as error:  # (a proxy's page in front of the API server): worth another try later
            raise ApiError(0, "Unavailable", f"the answer is not JSON ({error})", method=method, path=path) from None

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._send("GET", path, query=_query(query))
        return result

    def create(self, path: str, body: Mapping[str, Any], **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._send("POST", path, query=_query(query), body=body)
        return result

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._send("PUT", path, body=body)
        return result

    def patch(self, path: str, body: Any, *, kind: PatchKind = "merge", **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._send("PATCH", path, query=_query(query), body=body,
                                            content_type=PATCH_TYPES[kind])
        return result

    def delete(self, path: str, body: Mapping[str, Any] | None = None, **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._send("DELETE", path, query=_query(query), body=body)
        return result

    def watch(self, path: str, resource_version: str, *, timeout_seconds: int = 60,
              **query: Any) -> Iterator[dict[str, Any]]:
        """Watch events (``type``, ``object``) from ``resource_version`` until the server closes the watch
        (after ``timeout_seconds``). An ``ERROR`` event is raised as :class:`ApiError` (410 = relist)."""
        params = {**query, "watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds)}
        response = self._send("GET", path, query=_query(params), timeout=(10.0, timeout_seconds + 30.0),
                              stream=True)
        buffer = b""
        try:
            for chunk in _chunks(response, path):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event: dict[str, Any] = loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise ApiError(int(status.get("code", 500)), str(status.get("reason", "")),
                                       str(status.get("message", "")), method="WATCH", path=path)
                    yield event
        finally:
            response.response.release_conn()


MAX_NESTING = 10_000
"""The deepest JSON the API server accepts (``sigs.k8s.io/json``'s limit); free-form fields (a ResourceClaim's
opaque parameters, a CRD that keeps unknown fields) may nest that deep."""


def loads(data: bytes | str) -> Any:
    """``json.loads``, and for a document nested deeper than Python's recursion limit lets it read (about 1,000
    levels), the same on a thread with a stack and limit for ``MAX_NESTING`` levels. Why: a user's 3 KB
    ResourceClaim nested 1,500 deep raised RecursionError out of the watch's decoding and ended the watcher
    thread; the scheduler went on with a frozen copy of every tenant's claims, and a relist failed the same way."""
    try:
        return json.loads(data)
    except RecursionError:
        return _deep_loads(data)


def _deep_loads(data: bytes | str) -> Any:
    decoded: list[Any] = []
    failed: list[BaseException] = []

    def decode() -> None:
        try:
            decoded.append(json.loads(data))
        except BaseException as error:  # handed to the caller's thread
            failed.append(error)

    with _DEEP:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 2 * MAX_NESTING + 1000))
        stack = threading.stack_size(256 * 1024 * 1024)
        try:
            worker = threading.Thread(target=decode, name="deep-json", daemon=True)
            worker.start()
        finally:
            threading.stack_size(stack)
        worker.join()
        sys.setrecursionlimit(limit)
    if failed:
        raise failed[0]
    return decoded[0]


_DEEP = threading.Lock()
"""One deep decode at a time: the recursion limit it raises is the process's."""


LIST_PAGE = 500
"""Items per page when a whole collection is listed (``list_all``): a large cluster is read in bounded pieces."""


def list_all(kube: Kube, path: str) -> list[dict[str, Any]]:
    """Every item of a collection, ``LIST_PAGE`` to a page (the API's ``limit`` and ``continue``)."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        page = kube.get(path, limit=LIST_PAGE, **({"continue": token} if token else {}))
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def _chunks(response: Any, path: str) -> Iterator[bytes]:
    """The body of a streamed response; a connection that breaks mid-stream is an ``Unavailable`` error."""
    try:
        yield from response.response.stream(amt=None, decode_content=False)
    except urllib3.exceptions.HTTPError as error:
        raise ApiError(0, "Unavailable", str(error), method="WATCH", path=path) from None


def _query(values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(key, str(value).lower() if isinstance(value, bool) else value)
            for key, value in values.items() if value is not None]


def _api_error(status: int, reason: str, body: Any, method: str, path: str) -> ApiError:
    message = ""
    if body:
        try:
            decoded = json.loads(body)
            message = str(decoded.get("message", "")) if isinstance(decoded, dict) else str(decoded)
        except (ValueError, TypeError):
            message = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    return ApiError(status, reason, message, method=method, path=path)


MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024
"""The largest kubeconfig read (hundreds of contexts with embedded certificates are a few MiB)."""
MAX_ERROR_CHARS = 300


def _check_kubeconfig(path: Path) -> None:
    """Read the kubeconfig once with bounds before the client parses it: the client's ``yaml.safe_load`` expands
    a 500-byte alias bomb (20 s, 1.9 GB, and a 226 MB error line) and recurses until ``RecursionError`` on a
    few thousand ``[``. A file that cannot be opened is left to the client, which words that error."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError:
        return
    if len(raw) > MAX_KUBECONFIG_BYTES:
        raise KubeconfigError(f"cannot read kubeconfig {path}: longer than {MAX_KUBECONFIG_BYTES // 2**20} MiB")
    try:
        yaml.load(raw.decode("utf-8"), Loader=BoundedLoader)
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        said = " ".join(str(error).split())[:MAX_ERROR_CHARS]
        kind = "" if isinstance(error, YamlRefused) else f"{type(error).__name__}: "
        raise KubeconfigError(f"cannot read kubeconfig {path}: not a kubeconfig: {kind}{said}") from None
