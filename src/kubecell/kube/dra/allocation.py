"""A claim's ``status.allocation`` written as kube-scheduler's allocator writes it, and read back.

``allocation_status`` is the exact object the structured allocator (``k8s.io/dynamic-resource-allocation/
structured``, the variant 1.37 runs with consumable capacity on) produces for devices on one node:

* ``devices.results``: one entry per device, in request order: ``request``, ``driver``, ``pool``, ``device``;
  the request's ``tolerations`` when it has any; for a shareable device (``allowMultipleAllocations``) a fresh
  ``shareID`` and the ``consumedCapacity`` of every capacity (``capacity.consume``);
* ``devices.config``: each class's configuration once (``source: FromClass``, the requests of that class),
  then the claim's own entries (``FromClaim``) that apply to one of its requests, and ``requests`` dropped
  from an entry that applies to all of them;
* ``nodeSelector``: the node, as ``matchFields metadata.name In [node]`` (the devices are node-local).

``allocated_devices`` reads any allocation back (kubecell's after a restart, or one the stock scheduler made
for a pod it placed, to hold those devices): the devices of ``gpu.kubecell.io`` with their node and what they
consume. Status is input anyone with write access to the claim could have shaped: every field is checked for
type and size, and a malformed one is a ``ClaimError`` naming it.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.dra.capacity import quantity_text
from kubecell.kube.dra.claims import MAX_REQUESTS, ClaimDemand, ClaimError
from kubecell.kube.dra.slices import PublishedDevice
from kubecell.kube.dra_names import CAPACITY_COMPUTE, CAPACITY_MEMORY, DRIVER

MAX_RESULTS = 32
"""``AllocationResultsMaxSize``."""
MAX_NAME = 253
MIB = 2**20


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def node_selector(node: str) -> dict[str, Any]:
    """The allocation's node selector for devices local to ``node``."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def allocation_status(demand: ClaimDemand, node: str, picks: Sequence[PublishedDevice], *,
                      share_ids: Sequence[str] | None = None) -> dict[str, Any]:
    """``status.allocation`` giving ``picks`` (on ``node``, as many as the claim asks, in its requests' order:
    the first request takes the first devices) to the claim ``demand`` was read from. ``share_ids`` are the
    share IDs of the shareable picks in order (fresh UUIDs when not given). Raises ``ClaimError`` for picks
    the demand does not admit."""
    if len(picks) != demand.count:
        raise ClaimError(f"{len(picks)} devices given for a claim of {demand.count}", claim=demand.claim)
    fresh = iter(share_ids) if share_ids is not None else None
    results: list[dict[str, Any]] = []
    remaining = list(picks)
    for ask in demand.asks:
        taken, remaining = remaining[:ask.count], remaining[ask.count:]
        for device in taken:
            if device.node != node or device.uuid not in ask.allowed or device.driver != DRIVER:
                raise ClaimError(f"device {device.node}/{device.name} ({device.uuid}) is not one request "
                                 f"{ask.request} admits on node {node}", claim=demand.claim)
            result: dict[str, Any] = {"request": ask.request, "driver": device.driver, "pool": device.pool,
                                      "device": device.name}
            if ask.tolerations:
                result["tolerations"] = [dict(t) for t in ask.tolerations]
            if device.shareable:
                result["shareID"] = next(fresh) if fresh is not None else str(uuidlib.uuid4())
                consumed = ask.consumed.get(device.uuid, {})
                capacities = device.capacities
                if consumed:
                    result["consumedCapacity"] = {
                        name: quantity_text(amount, binary=capacities[name].binary if name in capacities else False)
                        for name, amount in sorted(consumed.items())}
            results.append(result)
    return {"devices": {"results": results, **_config(demand)}, "nodeSelector": node_selector(node)}


def _config(demand: ClaimDemand) -> dict[str, Any]:
    """``devices.config`` as the allocator orders it (empty: left out)."""
    entries: list[dict[str, Any]] = []
    by_class: dict[str, list[dict[str, Any]]] = {}
    for ask in demand.asks:
        if ask.device_class in by_class:
            for entry in by_class[ask.device_class]:
                entry["requests"].append(ask.request)
            continue
        by_class[ask.device_class] = [{"source": "FromClass", "requests": [ask.request], **_configuration(c)}
                                      for c in ask.class_config]
        entries.extend(by_class[ask.device_class])
    names = [ask.request for ask in demand.asks]
    for config in demand.config:
        requests = [str(r) for r in config.get("requests") or []]
        if not requests or any(r in names for r in requests):
            entries.append({"source": "FromClaim", "requests": requests, **_configuration(config)})
    for entry in entries:
        if set(names) <= set(entry["requests"]) or not entry["requests"]:
            del entry["requests"]
    return {"config": entries} if entries else {}


def _configuration(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``DeviceConfiguration`` part of a class or claim config entry (today: ``opaque``)."""
    return {key: value for key, value in config.items() if key not in ("requests", "source")}


def reserved_for(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod as a ``status.reservedFor`` entry (``ResourceClaimConsumerReference``)."""
    meta = _map(pod.get("metadata"))
    return {"resource": "pods", "name": str(meta.get("name", "")), "uid": str(meta.get("uid", ""))}


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of kubecell's driver in an allocation: where it is and what it consumes (capacity name as
    published -> amount; empty for an exclusive device)."""

    node: str
    device: str
    consumed: Mapping[str, Decimal] = field(default_factory=dict)
    request: str = ""
    pool: str = ""
    share_id: str | None = None

    def _amount(self, name: str) -> Decimal | None:
        return self.consumed.get(name, self.consumed.get(f"{DRIVER}/{name}"))

    @property
    def compute_milli(self) -> int:
        """The compute it takes in milli-GPU (1000: the whole GPU, also for an exclusive device)."""
        compute = self._amount(CAPACITY_COMPUTE)
        return 1000 if compute is None else max(0, min(1000, math.ceil(compute)))

    @property
    def memory_mib(self) -> int:
        """The GPU memory it takes in MiB (0: not recorded, the whole device's)."""
        memory = self._amount(CAPACITY_MEMORY)
        return 0 if memory is None else max(0, math.ceil(memory / MIB))


def _text(raw: Mapping[str, Any], key: str, where: str, claim: str, *, required: bool = True) -> str:
    value = raw.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise ClaimError(f"is not a name of at most {MAX_NAME} characters", f"{where}.{key}", claim=claim)
    return value


def _allocated_node(allocation: Mapping[str, Any], claim: str) -> str | None:
    """The one node a node-local allocation's selector names; None without a selector."""
    selector = allocation.get("nodeSelector")
    if selector is None:
        return None
    where = "status.allocation.nodeSelector"
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    fields = terms[0].get("matchFields") if isinstance(terms, list) and len(terms) == 1 and isinstance(
        terms[0], Mapping) else None
    if isinstance(fields, list) and len(fields) == 1 and isinstance(fields[0], Mapping):
        term = fields[0]
        values = term.get("values")
        if term.get("key") == "metadata.name" and term.get("operator") == "In" and isinstance(values, list) \
                and len(values) == 1 and isinstance(values[0], str) and 0 < len(values[0]) <= MAX_NAME:
            return values[0]
    if isinstance(terms, list) and len(terms) <= MAX_REQUESTS:
        return None  # a selector of another shape (devices not local to one node): no node from it
    raise ClaimError("is not a node selector", where, claim=claim)


def allocated_devices(claim: Mapping[str, Any]) -> list[AllocatedDevice]:
    """The devices of ``gpu.kubecell.io`` the claim's ``status.allocation`` gives, with their node (from the
    node selector, else the pool, which kubecell's slices name after the node); [] when not allocated.
    Raises ``ClaimError`` for an allocation that is malformed or exceeds the API's limits."""
    meta = _map(claim.get("metadata"))
    name = f"ResourceClaim {str(meta.get('namespace', ''))[:63]}/{str(meta.get('name', ''))[:MAX_NAME]}"
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if allocation is None:
        return []
    if not isinstance(allocation, Mapping) or not isinstance(allocation.get("devices", {}), Mapping):
        raise ClaimError("is not an allocation", "status.allocation", claim=name)
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        raise ClaimError(f"is not a list of at most {MAX_RESULTS}", "status.allocation.devices.results", claim=name)
    node = _allocated_node(allocation, name)
    found = []
    for i, result in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise ClaimError("is not an object", where, claim=name)
        if _text(result, "driver", where, name) != DRIVER:
            continue
        pool, device = _text(result, "pool", where, name), _text(result, "device", where, name)
        if node is not None and pool != node:
            raise ClaimError(f"pool {pool!r} is not node {node!r} of the allocation", f"{where}.pool", claim=name)
        share = result.get("shareID")
        if share is not None and (not isinstance(share, str) or len(share) > 64):
            raise ClaimError("is not a UID", f"{where}.shareID", claim=name)
        found.append(AllocatedDevice(node or pool, device, _consumed(result.get("consumedCapacity"), where, name),
                                     _text(result, "request", where, name), pool, share))
    return found


def _consumed(raw: Any, where: str, claim: str) -> dict[str, Decimal]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or len(raw) > MAX_REQUESTS:
        raise ClaimError(f"is not a map of at most {MAX_REQUESTS} quantities", f"{where}.consumedCapacity",
                         claim=claim)
    amounts = {}
    for key, value in raw.items():
        if not isinstance(key, str) or len(key) > 96:
            raise ClaimError("has a capacity name that is not a qualified name", f"{where}.consumedCapacity",
                             claim=claim)
        try:
            amounts[key] = parse_quantity(value)
        except QuantityError as error:
            raise ClaimError(error.reason, f"{where}.consumedCapacity.{key}", claim=claim) from None
        if amounts[key] < 0:
            raise ClaimError("is negative", f"{where}.consumedCapacity.{key}", claim=claim)
    return amounts
