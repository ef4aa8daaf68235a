"""Right-sizing a GPU share when its pod is created: the patch that lowers its ``kubecell.io/gpu-milli``.

Why at admission: on a node served by kubecell's device plugin the kubelet counts a share's
``kubecell.io/gpu-milli`` as the container asks it (it hands the plugin exactly that many slots), so a share can
only run at less than it asked if the pod itself asks for less. The scheduler cannot lower it later
(``kube.pods.counted_by_kubernetes``); a mutating admission webhook can, before anyone counts it, as
the Vertical Pod Autoscaler's admission controller does for CPU and memory. The advice is the family's
(``core.rightsizing``, from the job history): the share its earlier jobs needed.

What is changed, and what never is: only a pod with exactly one container asking a share of one GPU through
``kubecell.io/gpu-milli`` (below 1000), to a lower share, never a higher one; its GPU memory never (running out
of it kills a job); the asked value is kept in the ``kubecell.io/asked-gpu-milli`` annotation, so a user sees
what was changed and why. A pod annotated ``kubecell.io/right-size: "false"`` is left as it is, and so is
everything this module cannot read: it answers why, and the webhook lets the pod through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.names import DOMAIN, RESOURCE_GPU_MILLI
from kubecell.kube.rest import json_pointer

ANNOTATION_ASKED = f"{DOMAIN}/asked-gpu-milli"
"""What the container asked for before it was right-sized."""
ANNOTATION_RIGHT_SIZE = f"{DOMAIN}/right-size"
"""``"false"``: leave this pod's share as it asks."""


@dataclass(frozen=True)
class Resize:
    """The JSON patch (RFC 6902) for a pod, empty where nothing is changed, and why."""

    patch: tuple[dict[str, Any], ...]
    why: str


def _milli(value: object) -> int | None:
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return None
    return int(amount) if amount == amount.to_integral_value() and amount > 0 else None


def _asks_share(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any(RESOURCE_GPU_MILLI in (resources.get(part) or {}) for part in ("limits", "requests"))


@dataclass(frozen=True)
class AskedShare:
    """The one container's share a pod asks, as right-sizing may lower it."""

    container: int
    """Its index in ``spec.containers``."""
    parts: tuple[str, ...]
    """Where it asks it: ``limits``, ``requests`` or both (with equal values)."""
    milli: int


def asked_share(pod: Mapping[str, Any]) -> AskedShare | Resize:
    """The share ``pod`` asks that right-sizing may lower, or (an empty ``Resize``) why it may lower none.

    Cheap and read from the pod alone, so a caller asks the history for advice only when this finds a share."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if str(annotations.get(ANNOTATION_RIGHT_SIZE, "")).lower() == "false":
        return Resize((), f"annotated {ANNOTATION_RIGHT_SIZE}: false")
    spec = pod.get("spec") or {}
    if any(_asks_share(container) for container in spec.get("initContainers") or ()):
        return Resize((), f"an init container asks for {RESOURCE_GPU_MILLI}")
    asking = [(index, container) for index, container in enumerate(spec.get("containers") or ())
              if _asks_share(container)]
    if len(asking) != 1:
        return Resize((), f"{len(asking)} containers ask for {RESOURCE_GPU_MILLI}, not one")
    index, container = asking[0]
    resources = container.get("resources") or {}
    parts = {part: (resources.get(part) or {}).get(RESOURCE_GPU_MILLI) for part in ("limits", "requests")}
    asked = {part: _milli(value) for part, value in parts.items() if value is not None}
    if None in asked.values() or len(set(asked.values())) != 1:
        return Resize((), f"its {RESOURCE_GPU_MILLI} is not one whole number of milli-GPU: {parts}")
    milli = next(iter(asked.values()))
    assert milli is not None
    if milli >= MILLI_PER_GPU:
        return Resize((), f"it asks for {milli} milli-GPU: whole GPUs are not right-sized")
    return AskedShare(index, tuple(sorted(asked)), milli)


def lowered(pod: Mapping[str, Any], asked: AskedShare, advice_milli: int | None) -> Resize:
    """The patch that gives the share ``asked`` (of ``pod``) the ``advice_milli`` its family needs, if lower."""
    if advice_milli is None:
        return Resize((), "no advice for its family (fewer than 3 finished jobs, or none that used a GPU)")
    if not 0 < advice_milli < asked.milli:
        return Resize((), f"its family needs {advice_milli} milli-GPU, not less than the {asked.milli} it asks")
    patch: list[dict[str, Any]] = [
        {"op": "replace",
         "path": json_pointer("spec", "containers", str(asked.container), "resources", part, RESOURCE_GPU_MILLI),
         "value": str(advice_milli)} for part in asked.parts]
    meta = pod.get("metadata") or {}
    if not meta.get("annotations"):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_ASKED: str(asked.milli)}})
    else:
        where = json_pointer("metadata", "annotations", ANNOTATION_ASKED)
        patch.append({"op": "add", "path": where, "value": str(asked.milli)})
    return Resize(tuple(patch), f"its family needs {advice_milli} milli-GPU of the {asked.milli} it asks")


def right_sized(pod: Mapping[str, Any], advice: Callable[[], int | None]) -> Resize:
    """The patch that gives ``pod`` the share its family needs (see the module). ``advice`` is asked only for a
    pod with a share to lower: every pod a namespace creates reaches the webhook, and the history is a database."""
    asked = asked_share(pod)
    return asked if isinstance(asked, Resize) else lowered(pod, asked, advice())
