"""The right-sizing admission webhook: ``POST /mutate`` lowers a new pod's GPU share to its family's need.

kube-apiserver sends each pod being created (where the MutatingWebhookConfiguration selects it) as an
``AdmissionReview`` (``admission.k8s.io/v1``); the answer always allows the pod, with a JSON patch where
:func:`kubecell.kube.rightsize.right_sized` lowers its ``kubecell.io/gpu-milli`` to the share its family's
finished jobs needed (the job history through :class:`~kubecell.profiler.knowledge.HistoryKnowledge`: cached per
family, a database error answers no advice). A patched pod gets a warning that ``kubectl`` prints, saying what
was changed and why.

The webhook never refuses a pod: what it cannot read, it lets through unchanged (a request that is not an
AdmissionReview gets 400, which the API server treats by the configuration's ``failurePolicy``, ``Ignore`` in
``deploy/rightsize``). Nothing a pod says raises its share: the advice comes from the history, and only lowers.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from kubecell.core.digits import decimal_digits
from kubecell.kube.names import RESOURCE_GPU_MILLI
from kubecell.kube.rightsize import Resize, right_sized

log = logging.getLogger("kubecell.profiler.webhook")

MAX_BODY_BYTES = 3 * 1024 * 1024
"""The API server's own limit on an object is about 1.5 MiB; a review carries it (and its old copy) once."""
MAX_HELD_BYTES = 16 * MAX_BODY_BYTES
"""The most review bytes all calls together hold, from the first byte read until the answer is written; past it a
review gets 503 (the API server applies ``failurePolicy``: the pod is let through). A review is kilobytes, but the
port answers whoever reaches it, and each connection could hold 3 MiB (and several times that while parsed)."""

Advice = Callable[[Mapping[str, Any]], int | None]
"""A pod -> the compute share per GPU its family needs (``HistoryKnowledge.share_milli``)."""


class ReviewError(ValueError):
    """A body that is not an AdmissionReview this webhook can answer."""


def answer(body: bytes, advice: Advice) -> dict[str, Any]:
    """The AdmissionReview answering the review in ``body`` (see the module). Raises :class:`ReviewError`."""
    try:
        review = json.loads(body)
    except ValueError as error:
        raise ReviewError(f"not JSON: {error}") from None
    except RecursionError:
        raise ReviewError("not JSON this webhook reads: nested too deeply") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview" \
            or review.get("apiVersion") != "admission.k8s.io/v1":
        raise ReviewError("not an admission.k8s.io/v1 AdmissionReview")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("an AdmissionReview without request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind") if isinstance(request.get("kind"), dict) else None
    if kind == "Pod" and request.get("operation") == "CREATE" and isinstance(pod, dict) \
            and isinstance(pod.get("metadata") or {}, dict):
        asked_of = {**pod, "metadata": {**(pod.get("metadata") or {}),
                                        "namespace": (pod.get("metadata") or {}).get("namespace")
                                        or str(request.get("namespace") or "default")}}
        resize = _resize(asked_of, advice)
        if resize.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(list(resize.patch)).encode()).decode()
            response["warnings"] = [f"kubecell right-sized {RESOURCE_GPU_MILLI}: {resize.why} "
                                    "(annotate kubecell.io/right-size: \"false\" to keep what it asks)"]
            log.info("right-sized %s/%s: %s", asked_of["metadata"]["namespace"],
                     asked_of["metadata"].get("name") or asked_of["metadata"].get("generateName"), resize.why)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _resize(pod: Mapping[str, Any], advice: Advice) -> Resize:
    """What right-sizing changes in ``pod``; a pod of a shape no API server sends (a list where an object
    belongs) is let through unchanged, as anything this webhook cannot read."""

    def advised() -> int | None:
        try:
            return advice(pod)
        except Exception:  # a broken history is no reason to hold a pod: it goes through as it asks
            log.exception("no advice for a pod in %s", pod["metadata"]["namespace"])
            return None

    try:
        return right_sized(pod, advised)
    except (AttributeError, TypeError) as error:
        log.warning("a pod this webhook cannot read is let through unchanged: %s", error)
        return Resize((), f"unreadable: {error}")


def webhook_app(advice: Advice, *, max_held_bytes: int = MAX_HELD_BYTES) -> Starlette:
    """``POST /mutate`` (the review) and ``GET /healthz``; ``max_held_bytes``: see ``MAX_HELD_BYTES``."""
    held = [0]  # the bytes of reviews in progress; touched on the event loop only, so needs no lock

    async def mutate(request: Request) -> Response:
        too_large = PlainTextResponse(f"a review over {MAX_BODY_BYTES} bytes", status_code=413)
        declared = request.headers.get("content-length", "")
        if decimal_digits(declared) and int(declared) > MAX_BODY_BYTES:
            return too_large
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():  # read up to the bound, whatever the header said (or left out)
                size += len(chunk)
                held[0] += len(chunk)
                if size > MAX_BODY_BYTES:
                    return too_large
                if held[0] > max_held_bytes:
                    return PlainTextResponse("too many reviews in progress; try again", status_code=503)
                chunks.append(chunk)
            body = b"".join(chunks)
            return JSONResponse(await run_in_threadpool(answer, body, advice))
        except ReviewError as error:
            return PlainTextResponse(str(error), status_code=400)
        except ClientDisconnect:  # gone, or closed for sending too slowly (kubecell.cli.serving): nobody to answer
            return PlainTextResponse("the client went away before its review was read", status_code=400)
        finally:
            held[0] -= size

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"]), Route("/healthz", healthz)])
