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

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kubecell.scheduler.extender import protocol
from kubecell.scheduler.extender.verbs import Extender

log = logging.getLogger("kubecell.extender")

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request read. With ``nodeCacheCapable: true`` (the sample) a filter carries the pod and node
names, kilobytes; without it, every candidate Node object: tens of megabytes at 5,000 nodes. The port answers
whoever reaches it, and an unbounded body was read whole into memory (34 MB cost 2 GB and 13 s)."""


async def _bounded_body(request: Request) -> bytes | None:
    """The body, or None past ``MAX_BODY_BYTES`` (read up to the bound, whatever the header said)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def routes(extender: Extender, *, prefix: str = "/extender",
           ready: Callable[[], bool] | None = None) -> list[Route]:
    """The four verbs under ``prefix`` (kube-scheduler's ``urlPrefix``); ``ready``: whether this replica
    may answer (it leads and has read the cluster)."""
    is_ready = ready or extender.scheduler.ready.is_set

    def verb(answer: Callable[[bytes], Any], on_error: Callable[[str], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not is_ready():
                return JSONResponse(on_error("kubecell is not ready (not the leader, or still reading the "
                                             "cluster)"), status_code=503)
            body = await _bounded_body(request)
            if body is None:
                return JSONResponse(on_error(f"a request over {MAX_BODY_BYTES} bytes"), status_code=413)
            try:
                return JSONResponse(await run_in_threadpool(answer, body))
            except protocol.ProtocolError as error:
                return JSONResponse(on_error(str(error)), status_code=400)
            except TimeoutError as error:
                return JSONResponse(on_error(str(error)), status_code=503)
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
