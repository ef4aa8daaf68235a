"""ResourceClaims read into what kubecell's engine places: how many devices, how much of each, which ones.

A claim asks through requests (``spec.devices.requests[].exactly``) for devices of a DeviceClass, narrowed
by CEL selectors (the class's, then the request's) and, on shareable GPUs, sized by ``capacity.requests``.
``claim_demand`` evaluates that against the published devices exactly as kube-scheduler's allocator would
(same selectors, same consumed-capacity rule, same taint rule) and says it in the engine's terms: ``count``
devices of ``milli`` (1000: whole) and ``memory_mib`` each, MIG instances or GPUs, ``allowed`` the UUIDs
that qualify, and per device what the allocation will record as ``consumedCapacity``.

What the engine cannot honour is refused with a ``ClaimError`` naming the field, never approximated: a
prioritized list (``firstAvailable``), ``allocationMode: All``, ``adminAccess``, derived attributes,
constraints other than ``matchAttribute: gpu.kubecell.io/model`` (whole GPUs of one pod share a node and
every node has one model, so that one always holds), more than ``MAX_DEVICES`` devices, several shares
(a share is one device), a class of another driver, a selector that is not valid CEL or that kubecell
does not implement, a capacity larger than any published device has, and opaque configuration for
``gpu.kubecell.io`` (its driver takes none: refused rather than silently ignored). Configuration for other
drivers, and the classes' own, is copied into the allocation as the allocator copies it. Tolerations are
honoured: a device with a NoSchedule or NoExecute taint is allowed only to a request that tolerates it.

A selector that fails at run time on a device (a missing attribute ...) makes kube-scheduler's allocation
on that node fail; ``node_errors`` says so per node, and that node's devices are not ``allowed``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.dra.capacity import CapacityError, consume, quantity_text
from kubecell.kube.dra.cel import (
    DEVICE_SECONDS,
    Selector,
    SelectorError,
    SelectorTimeoutError,
    compile_selector,
    is_compiled,
)
from kubecell.kube.dra.slices import PublishedDevice, Taint
from kubecell.kube.dra_names import ATTR_MODEL, CAPACITY_COMPUTE, CAPACITY_MEMORY, CLASS_MIG, DRIVER, TYPE_MIG

MAX_DEVICES = 16
"""The most devices one claim may ask for (the most GPUs kubecell gives one pod on one node)."""
MAX_REQUESTS = 32
"""``DeviceRequestsMaxSize``; also ``DeviceSelectorsMaxSize``, ``DeviceConstraintsMaxSize``, ``DeviceConfigMaxSize``."""
MAX_TOLERATIONS = 16
MAX_OPAQUE_PARAMETERS = 10 * 1024
MATCHABLE = frozenset({f"{DRIVER}/{ATTR_MODEL}"})
MIB = 2**20
CLAIM_SELECTOR_SECONDS = 1.0
CLAIM_SELECTOR_SECONDS_PER_DEVICE = 0.003
"""The longest one claim's selectors may run over all the published devices: 1 s and 3 ms a device (and
``cel.DEVICE_SECONDS`` on any one device); past it the claim is refused. A selector of the usual kind (a model,
a driver, an attribute compared) takes 0.6-0.7 ms a device on a loaded 2-core machine (2,000 devices: 1.2-1.5
s, against 7 s given), and its result per device is cached, so a claim pays it once per new selector. The
scheduler spends that time in slices of a scheduling pass (``scheduler.claims``), not at once."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DRIVER_LITERAL = re.compile(r"""device\.driver\s*==\s*["']([^"']*)["']|["']([^"']*)["']\s*==\s*device\.driver""")


class ClaimError(InvalidInputError):
    """A claim kubecell cannot allocate: ``reason`` and ``field`` (``spec.devices.requests[0].count`` ...)."""

    def __init__(self, reason: str, field: str | None = None, *, claim: str | None = None,
                 accepted: str | None = None) -> None:
        super().__init__(reason, location=claim, field=field, accepted=accepted)
        self.reason = reason


class ClaimOutOfTimeError(ClaimError):
    """The claim's selectors reached their ``deadline`` (the claim's own time) or ``pause_at`` before they were
    through. Paused, they may go on later: the per-device results found so far are cached, so the next try
    starts where this one stopped."""


def claim_seconds(devices: int) -> float:
    """The time one claim's selectors are given over ``devices`` published devices, in all."""
    return CLAIM_SELECTOR_SECONDS + CLAIM_SELECTOR_SECONDS_PER_DEVICE * devices


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """One request of a claim, evaluated: ``allowed`` the UUIDs it admits, ``consumed`` what it records per
    shareable device (capacity name as published -> amount), ``milli``/``memory_mib`` per device."""

    request: str
    device_class: str
    count: int
    milli: int
    memory_mib: int
    mig: bool
    allowed: frozenset[str]
    consumed: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    class_config: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    """What a claim asks of the engine: ``count`` devices of one kind (``mig`` or GPUs), each ``milli``
    milli-GPU (1000: whole) and ``memory_mib`` MiB (0: not asked, or the device is taken whole), among
    ``allowed`` (UUIDs; None when no selector, capacity request or taint narrows anything). ``consumed``
    is what the allocation records per shareable device; ``config`` the claim's configuration entries;
    ``node_errors`` the nodes where a selector failed at run time (the allocator's allocation fails there)."""

    claim: str
    asks: tuple[ClaimAsk, ...]
    count: int
    milli: int
    memory_mib: int
    mig: bool
    allowed: frozenset[str] | None
    consumed: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    config: tuple[Mapping[str, Any], ...] = ()
    node_errors: Mapping[str, str] = field(default_factory=dict)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any, where: str, limit: int, claim: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise ClaimError(f"is not a list of at most {limit}", where, claim=claim)
    return value


def _selectors(raw: Any, where: str, claim: str, owner: str, deadline: float | None = None) -> list[Selector]:
    selectors = []
    for j, entry in enumerate(_list(raw, where, MAX_REQUESTS, claim)):
        expression = entry.get("cel", {}).get("expression") if isinstance(entry, Mapping) and isinstance(
            entry.get("cel"), Mapping) else None
        if not isinstance(expression, str):
            raise ClaimError(f"{owner}: selector #{j} is not a CEL selector", f"{where}[{j}]", claim=claim,
                             accepted="selectors: [{cel: {expression: ...}}]")
        if deadline is not None and time.monotonic() > deadline and not is_compiled(expression):
            raise ClaimOutOfTimeError(f"{owner}: selector #{j} waits to be compiled (no time is left for it)",
                                      f"{where}[{j}].cel.expression", claim=claim)
        try:
            selectors.append(compile_selector(expression))
        except SelectorError as error:
            raise ClaimError(f"{owner}: {error}", f"{where}[{j}].cel.expression", claim=claim) from None
    return selectors


def _opaque(entries: list[Any], where: str, claim: str, *, ours_refused: bool) -> tuple[Mapping[str, Any], ...]:
    kept = []
    for j, entry in enumerate(entries):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or not isinstance(opaque.get("driver"), str):
            raise ClaimError("is not an opaque configuration {driver, parameters}", f"{where}[{j}]", claim=claim)
        try:
            size = len(json.dumps(opaque.get("parameters"), default=str))
        except RecursionError:  # as deep as the API server lets them be: more than Python writes
            raise ClaimError("opaque parameters nested deeper than kubecell reads", f"{where}[{j}]",
                             claim=claim) from None
        if size > MAX_OPAQUE_PARAMETERS:
            raise ClaimError(f"opaque parameters longer than {MAX_OPAQUE_PARAMETERS}", f"{where}[{j}]", claim=claim)
        if ours_refused and opaque["driver"] == DRIVER:
            raise ClaimError(f"opaque parameters for {DRIVER}: kubecell's driver takes no configuration",
                             f"{where}[{j}].opaque", claim=claim, accepted="no config for this driver")
        kept.append(dict(entry))
    return tuple(kept)


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """``resourceclaim.ToleratesTaint``: the core/v1 rule (empty key or effect matches any)."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.effect:
            continue
        if toleration.get("key") and toleration.get("key") != taint.key:
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (operator == "Equal" and (toleration.get("value") or "") == taint.value):
            return True
    return False


@dataclass(slots=True)
class _Request:
    name: str
    device_class: str
    count: int
    capacity: dict[str, Decimal]
    selectors: list[Selector]
    tolerations: tuple[Mapping[str, Any], ...]
    class_config: tuple[Mapping[str, Any], ...]


def _request(raw: Any, i: int, classes: Mapping[str, Mapping[str, Any]], claim: str,
             deadline: float | None = None) -> _Request:
    where = f"spec.devices.requests[{i}]"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not _NAME.fullmatch(raw["name"]):
        raise ClaimError("has no valid name", where, claim=claim)
    name = raw["name"]
    if raw.get("firstAvailable"):
        raise ClaimError(f"request {name} asks by firstAvailable (a prioritized list); kubecell allocates only "
                         "exact requests", f"{where}.firstAvailable", claim=claim,
                         accepted="exactly: {deviceClassName, selectors, count, capacity}")
    exactly = raw.get("exactly")
    if not isinstance(exactly, Mapping):
        raise ClaimError(f"request {name} has no 'exactly'", where, claim=claim)
    where += ".exactly"
    class_name = exactly.get("deviceClassName")
    device_class = classes.get(class_name) if isinstance(class_name, str) else None
    if device_class is None:
        raise ClaimError(f"device class {str(class_name)[:253]!r} does not exist", f"{where}.deviceClassName",
                         claim=claim)
    assert isinstance(class_name, str)
    spec = _map(device_class.get("spec"))
    for entry in _list(spec.get("selectors"), f"DeviceClass {class_name} spec.selectors", MAX_REQUESTS, claim):
        expression = str(((entry or {}).get("cel") or {}).get("expression", "")) if isinstance(entry, Mapping) else ""
        for found in _DRIVER_LITERAL.finditer(expression):
            driver = found.group(1) if found.group(1) is not None else found.group(2)
            if driver != DRIVER:
                raise ClaimError(f"device class {class_name} selects devices of driver {driver[:63]!r}; kubecell "
                                 f"allocates only {DRIVER}", f"{where}.deviceClassName", claim=claim)
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise ClaimError(f"request {name}: allocationMode {str(mode)[:20]} is not supported", f"{where}.allocationMode",
                         claim=claim, accepted="ExactCount with a count")
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DEVICES:
        raise ClaimError(f"request {name}: count {str(count)[:20]} is out of range", f"{where}.count", claim=claim,
                         accepted=f"1..{MAX_DEVICES}")
    if exactly.get("adminAccess"):
        raise ClaimError(f"request {name} asks for admin access (devices in use by others); kubecell does not "
                         "grant it", f"{where}.adminAccess", claim=claim)
    if exactly.get("derivedAttributes"):
        raise ClaimError(f"request {name} uses derivedAttributes, which kubecell does not support",
                         f"{where}.derivedAttributes", claim=claim)
    tolerations = _list(exactly.get("tolerations"), f"{where}.tolerations", MAX_TOLERATIONS, claim)
    for j, toleration in enumerate(tolerations):
        if not isinstance(toleration, Mapping) or toleration.get("operator", "Equal") not in ("", "Equal", "Exists") \
                or not all(isinstance(toleration.get(k, ""), str) for k in ("key", "value", "effect")):
            raise ClaimError("is not a toleration {key, operator: Equal|Exists, value, effect}",
                             f"{where}.tolerations[{j}]", claim=claim)
    capacity: dict[str, Decimal] = {}
    requested = _map(exactly.get("capacity")).get("requests")
    if requested is not None:
        if not isinstance(requested, Mapping) or len(requested) > MAX_REQUESTS:
            raise ClaimError("is not a map of capacity names to quantities", f"{where}.capacity.requests", claim=claim)
        for key, value in requested.items():
            try:
                capacity[str(key)] = parse_quantity(value)
            except QuantityError as error:
                raise ClaimError(f"request {name}: {error.reason}", f"{where}.capacity.requests.{str(key)[:100]}",
                                 claim=claim, accepted=error.accepted) from None
            if capacity[str(key)] < 0:
                raise ClaimError(f"request {name}: a negative amount", f"{where}.capacity.requests.{key}", claim=claim)
    selectors = _selectors(spec.get("selectors"), f"DeviceClass {class_name} spec.selectors", claim,
                           f"device class {class_name}", deadline)
    selectors += _selectors(exactly.get("selectors"), f"{where}.selectors", claim, f"request {name}", deadline)
    config = _opaque(_list(spec.get("config"), f"DeviceClass {class_name} spec.config", MAX_REQUESTS, claim),
                     f"DeviceClass {class_name} spec.config", claim, ours_refused=False)
    return _Request(name, class_name, count, capacity, selectors, tuple(dict(t) for t in tolerations), config)


def _capacity_key(device: PublishedDevice, name: str) -> str | None:
    """The published key of capacity ``name`` of the driver's domain (``memory`` or ``gpu.kubecell.io/memory``)."""
    capacities = device.capacities
    return next((key for key in (name, f"{DRIVER}/{name}") if key in capacities), None)


def _share(device: PublishedDevice, amounts: Mapping[str, Decimal], request: _Request) -> tuple[int, int]:
    """(milli, MiB) of one device the request takes: a whole device unless it is shared by compute."""
    compute = _capacity_key(device, CAPACITY_COMPUTE)
    total = device.capacities[compute].value if compute else Decimal(0)
    if not device.shareable or compute is None or total <= 0:
        return 1000, 0
    milli = min(1000, math.ceil(amounts[compute] * 1000 / total))
    if milli >= 1000:
        return 1000, 0
    memory = _capacity_key(device, CAPACITY_MEMORY)
    asked = memory is not None and memory in request.capacity
    return milli, math.ceil(amounts[memory] / MIB) if asked and memory is not None else 0


def _evaluate(request: _Request, devices: Sequence[PublishedDevice], claim: str,
              node_errors: dict[str, str], deadline: float, pause_at: float) -> ClaimAsk:
    """One request over the devices. ``pause_at`` stops it between devices only: a device begun is finished
    (within ``cel.DEVICE_SECONDS``), or a pause shorter than one device's evaluation would never get further."""
    allowed: set[str] = set()
    consumed: dict[str, dict[str, Decimal]] = {}
    shares: list[tuple[int, int]] = []
    kinds: set[str] = set()
    def out_of_time(why: str) -> ClaimOutOfTimeError:
        return ClaimOutOfTimeError(f"the selectors of request {request.name} ran out of the time a claim is given "
                                   f"over the {len(devices)} published devices ({why}): a selector must be cheap "
                                   "enough to run on every device", "spec.devices.requests", claim=claim)
    for device in devices:
        if device.node in node_errors:
            continue
        if time.monotonic() > pause_at and not all(selector.knows(device.cel) for selector in request.selectors):
            # between devices (a cheap selector never reads the clock itself); results kept take no time
            raise out_of_time(f"stopped before device {device.name} of node {device.node}")
        try:
            if not all(selector.matches(device.cel, deadline) for selector in request.selectors):
                continue
            if any(t.effect in ("NoSchedule", "NoExecute") and not _tolerates(request.tolerations, t)
                   for t in device.taints):
                continue
            amounts = consume(request.capacity, device.capacities)
        except SelectorTimeoutError as error:
            if time.monotonic() >= deadline:
                raise out_of_time(error.reason) from None
            raise ClaimError(f"a selector of request {request.name} ran longer than {DEVICE_SECONDS * 1000:.0f} ms "
                             f"on one device ({error.reason}): a selector must be cheap enough to run on every "
                             "device", "spec.devices.requests", claim=claim) from None
        except (SelectorError, CapacityError) as error:
            node_errors[device.node] = f"request {request.name}: {error}"
            continue
        if amounts is None:
            continue
        allowed.add(device.uuid)
        kinds.add(device.kind)
        shares.append(_share(device, amounts, request))
        if device.shareable:
            consumed[device.uuid] = amounts
    if len(kinds) > 1:
        raise ClaimError(f"request {request.name} admits both whole GPUs and MIG instances", "spec.devices.requests",
                         claim=claim, accepted=f'one kind: select on device.attributes["{DRIVER}"].type')
    mig = kinds == {TYPE_MIG} if kinds else request.device_class == CLASS_MIG
    milli, memory = (max(s[0] for s in shares), max(s[1] for s in shares)) if shares else _asked(request)
    if milli == 0 and memory == 0:
        raise ClaimError(f"request {request.name} asks for no compute and no memory", "spec.devices.requests",
                         claim=claim)
    return ClaimAsk(request.name, request.device_class, request.count, milli, memory, mig, frozenset(allowed),
                    consumed, request.tolerations, request.class_config)


def _asked(request: _Request) -> tuple[int, int]:
    """(milli, MiB) from the request alone, when no device qualifies yet (a GPU's compute is 1000)."""
    compute = request.capacity.get(CAPACITY_COMPUTE, request.capacity.get(f"{DRIVER}/{CAPACITY_COMPUTE}"))
    memory = request.capacity.get(CAPACITY_MEMORY, request.capacity.get(f"{DRIVER}/{CAPACITY_MEMORY}"))
    milli = 1000 if compute is None else min(1000, math.ceil(compute))
    return (1000, 0) if milli >= 1000 else (milli, math.ceil(memory / MIB) if memory is not None else 0)


def _check_largest(request: _Request, devices: Sequence[PublishedDevice], claim: str) -> None:
    """Refuse a capacity request no published device could ever hold (naming the largest there is)."""
    for name, amount in request.capacity.items():
        totals = [device.capacities[name] for device in devices if name in device.capacities]
        if devices and (not totals or amount > max(total.value for total in totals)):
            biggest = max(totals, key=lambda total: total.value) if totals else None
            largest = (f"the largest published is {quantity_text(biggest.value, binary=biggest.binary)}" if biggest
                       else "no published device has it")
            shown = quantity_text(amount, binary=bool(biggest and biggest.binary))
            raise ClaimError(f"request {request.name} asks for {name} {shown}; {largest}",
                             f"spec.devices.requests.{request.name}.capacity.requests.{name}", claim=claim)


def claim_demand(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]],
                 devices: Sequence[PublishedDevice], *, deadline: float | None = None,
                 pause_at: float | None = None) -> ClaimDemand:
    """What ``claim`` asks of the engine, evaluated against ``devices`` (kubecell's published devices) with
    the DeviceClasses by name; raises ``ClaimError`` for what kubecell cannot allocate, and
    ``ClaimOutOfTimeError`` where the selectors are not through by ``deadline`` (``time.monotonic()``; None:
    ``claim_seconds`` from now), or have reached ``pause_at`` between two devices (a caller that gives its
    time in slices)."""
    meta = _map(claim.get("metadata"))
    key = f"{str(meta.get('namespace', ''))[:63]}/{str(meta.get('name', ''))[:253]}"
    where = f"ResourceClaim {key}"
    wanted = _map(_map(claim.get("spec")).get("devices"))
    raw_requests = _list(wanted.get("requests"), "spec.devices.requests", MAX_REQUESTS, where)
    if not raw_requests:
        raise ClaimError("asks for no devices", "spec.devices.requests", claim=where)
    if deadline is None:
        deadline = time.monotonic() + claim_seconds(len(devices))  # the whole claim's, at once
    pause = deadline if pause_at is None else min(deadline, pause_at)
    requests = [_request(raw, i, classes, where, pause) for i, raw in enumerate(raw_requests)]
    names = [request.name for request in requests]
    if len(set(names)) != len(names):
        raise ClaimError("names a request twice", "spec.devices.requests", claim=where)
    for i, constraint in enumerate(_list(wanted.get("constraints"), "spec.devices.constraints", MAX_REQUESTS, where)):
        at = f"spec.devices.constraints[{i}]"
        if not isinstance(constraint, Mapping) or constraint.get("distinctAttribute"):
            raise ClaimError("only matchAttribute constraints are supported", at, claim=where,
                             accepted=f"matchAttribute: {', '.join(sorted(MATCHABLE))}")
        if constraint.get("matchAttribute") not in MATCHABLE:
            raise ClaimError(f"matchAttribute {str(constraint.get('matchAttribute'))[:100]!r} is not supported",
                             f"{at}.matchAttribute", claim=where, accepted=", ".join(sorted(MATCHABLE)))
    config = _opaque(_list(wanted.get("config"), "spec.devices.config", MAX_REQUESTS, where), "spec.devices.config",
                     where, ours_refused=True)
    node_errors: dict[str, str] = {}
    for request in requests:
        _check_largest(request, devices, where)
    asks = [_evaluate(request, devices, where, node_errors, deadline, pause) for request in requests]
    errored = {device.uuid for device in devices if device.node in node_errors}
    asks = [ask if not errored & ask.allowed else _without(ask, errored) for ask in asks]
    first = asks[0]
    for ask in asks[1:]:
        if (ask.allowed, ask.milli, ask.memory_mib, ask.mig) != (first.allowed, first.milli, first.memory_mib,
                                                                 first.mig):
            raise ClaimError(f"requests {first.request} and {ask.request} ask for different devices; kubecell "
                             "places a claim's devices as one request", "spec.devices.requests", claim=where,
                             accepted="requests of the same class, selectors and capacity")
    count = sum(ask.count for ask in asks)
    if count > MAX_DEVICES:
        raise ClaimError(f"asks for {count} devices", "spec.devices.requests", claim=where,
                         accepted=f"at most {MAX_DEVICES}")
    if count > 1 and first.milli < 1000:
        raise ClaimError(f"asks for {count} shares of GPUs; a share is one device", "spec.devices.requests",
                         claim=where, accepted="one share per claim (count 1), or whole GPUs")
    narrowed = len(first.allowed) < len({device.uuid for device in devices})  # the class's selectors count too
    consumed = {uuid: amounts for ask in asks for uuid, amounts in ask.consumed.items()}
    return ClaimDemand(key, tuple(asks), count, first.milli, first.memory_mib, first.mig,
                       first.allowed if narrowed else None, consumed, config, dict(node_errors))


def _without(ask: ClaimAsk, errored: set[str]) -> ClaimAsk:
    return ClaimAsk(ask.request, ask.device_class, ask.count, ask.milli, ask.memory_mib, ask.mig,
                    ask.allowed - errored, {u: c for u, c in ask.consumed.items() if u not in errored},
                    ask.tolerations, ask.class_config)


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``: the ResourceClaim it names (``key``, ``namespace/name``)
    and the object, or, while kube-controller-manager has not created it from its template yet, ``claim`` None
    and ``reason`` saying what the pod waits for (``key`` then names the template)."""

    pod_claim: str
    key: str
    claim: Mapping[str, Any] | None
    reason: str = ""

    @property
    def waiting(self) -> bool:
        return self.claim is None


def pod_claims(pod: Mapping[str, Any], claims_by_name: Mapping[str, Mapping[str, Any]]) -> list[PodClaim]:
    """The ResourceClaims a pod uses, from ``claims_by_name`` (keyed ``namespace/name``): a direct
    ``resourceClaimName``, or for ``resourceClaimTemplateName`` the claim ``pod.status.resourceClaimStatuses``
    names (one the controller made for this pod: it must be owned by the pod). A template entry whose status
    names no claim needs none and is skipped. Raises ``ClaimError`` for a malformed entry or a claim made
    for another pod."""
    meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    namespace, pod_name, uid = str(meta.get("namespace", "default")), str(meta.get("name", "")), meta.get("uid")
    where = f"pod {namespace}/{pod_name}"
    statuses = {str(s.get("name")): s.get("resourceClaimName") for s in _map(pod.get("status")).get(
        "resourceClaimStatuses") or [] if isinstance(s, Mapping)}
    found: list[PodClaim] = []
    for i, entry in enumerate(_list(spec.get("resourceClaims"), "spec.resourceClaims", MAX_REQUESTS, where)):
        at = f"spec.resourceClaims[{i}]"
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ClaimError("has no valid name", at, claim=where)
        direct, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if isinstance(direct, str) and direct and not template:
            key = f"{namespace}/{direct[:253]}"
            claim = claims_by_name.get(key)
            found.append(PodClaim(name, key, claim, "" if claim is not None else "not created yet"))
            continue
        if not (isinstance(template, str) and template) or direct:
            raise ClaimError("sets neither or both of resourceClaimName and resourceClaimTemplateName", at,
                             claim=where)
        if name not in statuses:
            found.append(PodClaim(name, f"{namespace}/{template[:253]} (template)", None,
                                  f"the claim for {name} is not created from template {template[:253]} yet"))
            continue
        made = statuses[name]
        if not made:
            continue  # the controller decided that no claim is needed
        key = f"{namespace}/{str(made)[:253]}"
        claim = claims_by_name.get(key)
        if claim is None:
            found.append(PodClaim(name, key, None, "created but not seen yet"))
            continue
        owners = _map(claim.get("metadata")).get("ownerReferences") or []
        if not any(isinstance(o, Mapping) and o.get("uid") == uid and o.get("controller") for o in owners):
            raise ClaimError(f"ResourceClaim {key} was not created for this pod", at, claim=where)
        found.append(PodClaim(name, key, claim))
    return found
