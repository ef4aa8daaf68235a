"""A pod's resource requests as kube-scheduler adds them up, in exact decimal arithmetic.

Every dialect that asks through container resources (kubecell's own, ``nvidia.com/gpu``, HAMi,
gpushare) and the pod's CPU and memory are read from one table of pod totals computed the way
kube-scheduler computes a pod's request (``k8s.io/component-helpers/resource.PodRequests``):

* a container's amount is its request, or its limit where no request is given (the API server
  defaults requests to limits; a dict built by hand may not have been defaulted);
* containers run together, so their amounts add up; init containers run one after the other before
  them, so the pod needs the larger of the sum and the largest init container; restartable init
  containers (sidecars, ``restartPolicy: Always``) keep running, so they add to both;
* pod-level ``spec.resources`` replaces the containers' CPU and memory where it is set, and
  ``spec.overhead`` (RuntimeClass) is added last.

Amounts stay ``Decimal`` so that ``0.5`` and ``500m`` are the same number and a MiB count is rounded
once, at the end, in the direction that never under-reserves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubecell.k8s.dialects.demand import DemandError, PodMeta

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
MIB = Decimal(2**20)

QUANTITY_FORMS = "a Kubernetes quantity such as 2, 500m, 1.5, 4Gi or 4096Mi"


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity (``"500m"``, ``"4Gi"``, ``"1e3"``, ``2``) as an exact decimal.

    Raises ``ValueError`` for anything else (including booleans, which YAML and JSON clients produce
    by accident)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        return Decimal(repr(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError("not a quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * Decimal(1024) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


def parse_decimal(text: str) -> Decimal:
    """A plain decimal number written in a label (``"0.5"``, ``"2"``), without units."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError("not a number") from None
    if not value.is_finite():
        raise ValueError("not a finite number")
    return value


def number_text(value: Decimal) -> str:
    """``Decimal`` as a person writes it: ``500``, ``0.5``, ``4096`` (no exponent, no trailing zeros)."""
    return format(value.normalize(), "f")


def mib_up(amount_bytes: Decimal) -> int:
    """Bytes to MiB, rounded up: a request rounded down would reserve less than was asked."""
    return math.ceil(amount_bytes / MIB)


def _container_amounts(pod: PodMeta, container: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    """A container's amounts: requests, else limits, per resource; a bad value names the container."""
    resources = container.get("resources") or {}
    requests: Mapping[str, Any] = resources.get("requests") or {}
    limits: Mapping[str, Any] = resources.get("limits") or {}
    amounts: dict[str, Decimal] = {}
    for name in dict.fromkeys([*requests, *limits]):
        raw = requests[name] if name in requests else limits[name]
        try:
            amounts[str(name)] = parse_quantity(raw)
        except ValueError:
            cname = container.get("name") or "?"
            raise DemandError(pod.key, f"{kind} {cname}: {name} {raw!r}", "is not a Kubernetes quantity",
                              field=str(name), accepted=QUANTITY_FORMS) from None
    return amounts


def _add(into: dict[str, Decimal], amounts: Mapping[str, Decimal]) -> None:
    for name, value in amounts.items():
        into[name] = into.get(name, Decimal(0)) + value


def pod_totals(pod: PodMeta) -> dict[str, Decimal]:
    """The pod's request per resource name, as kube-scheduler adds it up (see the module docstring)."""
    spec = pod.spec
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        _add(total, _container_amounts(pod, container, "container"))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for container in spec.get("initContainers") or []:
        amounts = _container_amounts(pod, container, "init container")
        if container.get("restartPolicy") == "Always":
            _add(total, amounts)
            _add(sidecars, amounts)
            running = dict(sidecars)
        else:
            running = dict(amounts)
            _add(running, sidecars)
        for name, value in running.items():
            init_peak[name] = max(init_peak.get(name, Decimal(0)), value)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, Decimal(0)), value)
    pod_level = _container_amounts(pod, {"name": "(pod)", "resources": spec.get("resources") or {}}, "pod-level")
    for name in ("cpu", "memory"):
        if name in pod_level:
            total[name] = pod_level[name]
    overhead = spec.get("overhead") or {}
    _add(total, _container_amounts(pod, {"name": "(overhead)", "resources": {"requests": overhead}}, "overhead"))
    return total


def containers_asking(pod: PodMeta, names: Iterable[str]) -> list[str]:
    """Names of the containers (init containers included) whose requests or limits mention any of
    ``names``: dialects whose amounts are per container need to know how many there are."""
    wanted = set(names)
    found: list[str] = []
    for container in [*(pod.spec.get("initContainers") or []), *(pod.spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        mentioned = set(resources.get("requests") or {}) | set(resources.get("limits") or {})
        if mentioned & wanted:
            found.append(str(container.get("name") or "?"))
    return found


def container_amounts_of(pod: PodMeta, container_name: str) -> dict[str, Decimal]:
    """One container's amounts (requests, else limits), by container name."""
    for kind, key in (("init container", "initContainers"), ("container", "containers")):
        for container in pod.spec.get(key) or []:
            if str(container.get("name") or "?") == container_name:
                return _container_amounts(pod, container, kind)
    return {}
