"""The extender's HTTP endpoints: ``POST <prefix>/filter|prioritize|bind|preempt``.

Each verb's body is parsed (off the event loop: a filter without a node cache carries every candidate
Node object, megabytes at 5,000 nodes), answered by ``Extender`` on the scheduler thread, and written in
the upstream shape. A malformed request gets 400 with the reason in ``Error``; a replica that does not
lead (or has not read the cluster yet) gets 503, so kube-scheduler's retry reaches the leader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kubecell.core.digits import decimal_digits
from kubecell.scheduler.extender import protocol
from kubecell.scheduler.extender.verbs import Extender

log = logging.getLogger("kubecell.extender")

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request read. With ``nodeCacheCapable: true`` (the sample) a filter carries the pod and node
names, kilobytes; without it, every candidate Node object: tens of megabytes at 5,000 nodes. The port answers
whoever reaches it, and an unbounded body was read whole into memory (34 MB cost 2 GB and 13 s)."""
MAX_HELD_BYTES = 4 * MAX_BODY_BYTES
"""The most request bytes all calls together hold, from the first byte read until the answer is written (parsing
a body costs several times its size). kube-scheduler sends one filter or prioritize at a time; a request past the
bound gets 503, and kube-scheduler tries the pod again. Without it each connection could hold 64 MiB: four
clients that sent 60 MiB and stopped held 240 MB, and nothing bounded their number."""


class _Held:
    """The request bytes held by calls in progress (touched on the event loop only, so needs no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0

    def take(self, size: int) -> bool:
        if self.bytes + size > self.limit:
            return False
        self.bytes += size
        return True


EXTENDER_THREADS = 8
"""Worker threads of the extender's own: its calls never wait for the pool every other route shares (anyio's
default, 40 threads), which a flood of ``/metrics`` or ``/api/snapshot`` requests, each a few ms of CPU, could
hold while kube-scheduler's filter waited out its 5 s ``httpTimeout``. kube-scheduler sends one call at a
time; each ends within ``scheduler.call``'s 4 s."""


class _Threads:
    """The extender's own thread limiter, made on the event loop at first use (anyio makes one only there)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, work: Callable[[bytes], Any], body: bytes) -> Any:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.tokens)
        return await anyio.to_thread.run_sync(work, body, limiter=self._limiter)


class _RefusedError(Exception):
    """A body that is not read, with the status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _bounded_body(request: Request, held: _Held, taken: list[int]) -> bytes:
    """The body, read up to ``MAX_BODY_BYTES`` whatever the header said, each chunk taken from ``held`` (and
    added to ``taken[0]``, for the caller to give back). Raises :class:`_RefusedError`."""
    declared = request.headers.get("content-length", "")
    if decimal_digits(declared) and int(declared) > MAX_BODY_BYTES:
        raise _RefusedError(413, f"a request over {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _RefusedError(413, f"a request over {MAX_BODY_BYTES} bytes")
            if not held.take(len(chunk)):
                raise _RefusedError(503, f"kubecell holds {held.limit} bytes of requests already; try again")
            taken[0] += len(chunk)
            chunks.append(chunk)
    except ClientDisconnect:  # gone, or closed for sending too slowly (kubecell.cli.serving): nobody to answer
        raise _RefusedError(400, "the client went away before its request was read") from None
    return b"".join(chunks)


def routes(extender: Extender, *, prefix: str = "/extender", ready: Callable[[], bool] | None = None,
           max_held_bytes: int = MAX_HELD_BYTES) -> list[Route]:
    """The four verbs under ``prefix`` (kube-scheduler's ``urlPrefix``); ``ready``: whether this replica
    may answer (it leads and has read the cluster); ``max_held_bytes``: see ``MAX_HELD_BYTES``."""
    is_ready = ready or extender.scheduler.ready.is_set
    held = _Held(max_held_bytes)
    threads = _Threads(EXTENDER_THREADS)

    def verb(answer: Callable[[bytes], Any], on_error: Callable[[str], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not is_ready():
                return JSONResponse(on_error("kubecell is not ready (not the leader, or still reading the "
                                             "cluster)"), status_code=503)
            taken = [0]
            try:
                body = await _bounded_body(request, held, taken)
                return JSONResponse(await threads.run(answer, body))
            except _RefusedError as refused:
                return JSONResponse(on_error(str(refused)), status_code=refused.status)
            except protocol.ProtocolError as error:
                return JSONResponse(on_error(str(error)), status_code=400)
            except TimeoutError as error:
                return JSONResponse(on_error(str(error)), status_code=503)
            finally:
                held.bytes -= taken[0]
        return endpoint

    def filter_(body: bytes) -> Any:
        args = protocol.parse_args(body, "filter")
        verdict = extender.filter(args.pod, args.node_names)
        return protocol.filter_result(args, verdict.passed, verdict.failed, verdict.unresolvable)

    def prioritize(body: bytes) -> Any:
        args = protocol.parse_args(body, "prioritize")
        return protocol.priorities(extender.prioritize(args.pod, args.node_names))

    def bind(body: bytes) -> Any:
        args = protocol.parse_binding(body)
        return protocol.binding_result(extender.bind(args.pod_uid, args.node))

    def preempt(body: bytes) -> Any:
        protocol.parse_preemption(body)  # validated; kubecell names no victims (see verbs.py)
        return protocol.preemption_result({})

    def error_field(message: str) -> dict[str, str]:
        return {"Error": message}

    return [
        Route(f"{prefix}/filter", verb(filter_, error_field), methods=["POST"]),
        Route(f"{prefix}/prioritize", verb(prioritize, lambda _: []), methods=["POST"]),
        Route(f"{prefix}/bind", verb(bind, error_field), methods=["POST"]),
        Route(f"{prefix}/preempt", verb(preempt, lambda _: {"NodeNameToMetaVictims": {}}), methods=["POST"]),
    ]
