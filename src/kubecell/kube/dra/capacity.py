"""How much of a device's capacities one request consumes: the stock allocator's rule, exactly.

A device with ``allowMultipleAllocations`` can be allocated to several requests; each consumes an amount of
every capacity the device has, and the amounts of all allocations must fit in the capacity's ``value``.
kube-scheduler's structured allocator (``k8s.io/dynamic-resource-allocation/structured``, its
``consumable_capacity.go``) computes the amount so, and writes it into the claim's
``status.allocation.devices.results[].consumedCapacity``:

* a capacity the request does not name consumes ``requestPolicy.default``, or the whole ``value`` when the
  capacity has no policy (or a policy without a default);
* a named capacity without a policy consumes exactly what is requested;
* with ``validRange``: a request below ``min`` consumes ``min``; with a ``step`` it is rounded up to
  ``min + n * step`` (in integers: the request is first rounded up to a whole unit, as
  ``Quantity.Value()`` does); with ``validValues``: the smallest valid value at least the request;
* the device cannot serve the request when it names a capacity the device lacks, when the amount breaks the
  policy (above ``max``, off the step, not a valid value; the default itself always passes), or when the
  amounts no longer fit in ``value``; an amount that cannot be represented (beyond int64) or is negative is
  a fatal error for the allocation, not a skipped device (``CapacityError``).

Exclusive devices go through the same check (a request for more memory than a MIG instance has does not
get it) but nothing is recorded for them. Kubernetes 1.37 computes in integers unless the
``DRAFractionalCapacityRange`` gate is on (off while the cluster stays compatible with 1.36), which is what
``consume`` does; names are the capacity's keys as published (``memory``, not ``gpu.kubecell.io/memory``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from kubecell.kube.dialects.resources import QuantityError, parse_quantity

INT64_MAX = 2**63 - 1


class CapacityError(ValueError):
    """A capacity request the allocator cannot compute: it aborts the allocation rather than skip a device."""


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """``DeviceCapacity.requestPolicy``: a default, and either ``validValues`` (ascending) or ``validRange``
    (``min`` required, ``max`` and ``step`` optional)."""

    default: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()
    has_range: bool = False
    min: Decimal | None = None
    max: Decimal | None = None
    step: Decimal | None = None


@dataclass(frozen=True, slots=True)
class DeviceCapacity:
    """One capacity of a device: its total ``value``, its policy, and whether it was written with a binary
    suffix (``40Gi``), which is how amounts of it are written back."""

    value: Decimal
    policy: RequestPolicy | None = None
    binary: bool = False


def _whole(amount: Decimal) -> int:
    """``Quantity.Value()``: the amount rounded up to a whole unit (away from zero)."""
    return math.ceil(amount) if amount >= 0 else math.floor(amount)


def _round_up_range(requested: Decimal, policy: RequestPolicy) -> Decimal:
    assert policy.min is not None  # parse_policy requires it with a range
    if requested < policy.min:
        return policy.min
    if policy.step is None:
        return requested
    if requested > INT64_MAX:
        raise CapacityError(f"request {requested} exceeds the largest integer a quantity holds")
    wanted, step, low = _whole(requested), _whole(policy.step), _whole(policy.min)
    added = wanted - low
    steps = added // step + (1 if added % step else 0)
    if low >= 0 and steps > (INT64_MAX - low) // step:
        raise CapacityError(f"rounding request {requested} up to the next step passes the largest integer")
    return Decimal(low + step * steps)


def consumed_amount(requested: Decimal | None, capacity: DeviceCapacity) -> Decimal:
    """What a request of ``requested`` (None: the request does not name this capacity) consumes."""
    policy = capacity.policy
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else capacity.value
    if policy is None:
        return requested
    if policy.has_range and policy.min is not None:
        return _round_up_range(requested, policy)
    if policy.valid_values:
        return next((value for value in policy.valid_values if requested <= value), requested)
    return requested


def violates(amount: Decimal, policy: RequestPolicy | None) -> bool:
    """Whether ``amount`` breaks the policy (the allocator's ``violatesPolicy``, integer arithmetic)."""
    if policy is None or (policy.default is not None and amount == policy.default):
        return False
    if policy.has_range:
        if policy.max is not None and amount > policy.max:
            return True
        if policy.step is not None and policy.min is not None:
            return (_whole(amount) - _whole(policy.min)) % _whole(policy.step) != 0
        return False
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def consume(requests: Mapping[str, Decimal], capacities: Mapping[str, DeviceCapacity],
            used: Mapping[str, Decimal] | None = None) -> dict[str, Decimal] | None:
    """What the request consumes of every capacity of the device, or None when the device cannot serve it
    (beside ``used``, what its other allocations consume). Raises ``CapacityError`` for an amount the
    allocator refuses outright (not representable, negative)."""
    if any(name not in capacities for name in requests):
        return None
    amounts: dict[str, Decimal] = {}
    for name, capacity in capacities.items():
        amount = consumed_amount(requests.get(name), capacity)
        if amount < 0:
            raise CapacityError(f"capacity {name!r}: consumed amount {amount} is negative")
        amounts[name] = amount
    for name, capacity in capacities.items():
        if violates(amounts[name], capacity.policy):
            return None
        if amounts[name] + (used or {}).get(name, Decimal(0)) > capacity.value:
            return None
    return amounts


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity_text(amount: Decimal, *, binary: bool = False) -> str:
    """``amount`` as a Kubernetes quantity: with the largest binary suffix that divides it (``10Gi``) when
    ``binary``, else a plain integer, or milli/micro/nano units below one (``250m``)."""
    if amount == amount.to_integral_value():
        whole = int(amount)
        if binary and whole:
            for suffix, unit in _BINARY:
                if whole % unit == 0:
                    return f"{whole // unit}{suffix}"
        return str(whole)
    for suffix, scale in (("m", 1000), ("u", 10**6), ("n", 10**9)):
        scaled = amount * scale
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    return f"{math.ceil(amount * 10**9)}n"


MAX_VALID_VALUES = 10
"""``CapacityRequestPolicy.validValues`` holds at most 10 entries."""


def _quantity(raw: object, what: str) -> tuple[Decimal, bool]:
    """A quantity written in a ResourceSlice, and whether it has a binary suffix."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        raise ValueError(f"{what} is not a quantity")
    try:
        value = parse_quantity(raw)
    except QuantityError as problem:
        raise ValueError(f"{what} {str(raw)[:64]!r} {problem.reason}") from None
    return value, isinstance(raw, str) and raw.rstrip()[-2:] in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def parse_capacity(raw: object) -> DeviceCapacity:
    """A ResourceSlice's ``DeviceCapacity`` (``{value, requestPolicy}``); raises ``ValueError`` with the
    reason for one that is malformed or whose policy the allocator could not apply (a ``validRange``
    without ``min``, a step that is not positive, both ``validValues`` and ``validRange``)."""
    if not isinstance(raw, Mapping):
        raise ValueError("is not an object")
    value, binary = _quantity(raw.get("value"), "value")
    if value < 0:
        raise ValueError("value is negative")
    policy_raw = raw.get("requestPolicy")
    if policy_raw is None:
        return DeviceCapacity(value, None, binary)
    if not isinstance(policy_raw, Mapping):
        raise ValueError("requestPolicy is not an object")
    default = _quantity(policy_raw["default"], "requestPolicy.default")[0] if policy_raw.get("default") is not None \
        else None
    values_raw, range_raw = policy_raw.get("validValues") or [], policy_raw.get("validRange")
    if values_raw and range_raw is not None:
        raise ValueError("requestPolicy sets both validValues and validRange")
    if not isinstance(values_raw, list) or len(values_raw) > MAX_VALID_VALUES:
        raise ValueError(f"requestPolicy.validValues is not a list of at most {MAX_VALID_VALUES} quantities")
    values = tuple(_quantity(item, "requestPolicy.validValues entry")[0] for item in values_raw)
    if list(values) != sorted(values):
        raise ValueError("requestPolicy.validValues is not in ascending order")
    if range_raw is None:
        return DeviceCapacity(value, RequestPolicy(default, values), binary)
    if not isinstance(range_raw, Mapping) or range_raw.get("min") is None:
        raise ValueError("requestPolicy.validRange has no min")
    bounds = {key: _quantity(range_raw[key], f"requestPolicy.validRange.{key}")[0] if range_raw.get(key) is not None
              else None for key in ("min", "max", "step")}
    low, high, step = bounds["min"], bounds["max"], bounds["step"]
    if low is None or low < 0 or (high is not None and high < low) or (step is not None and _whole(step) <= 0):
        raise ValueError("requestPolicy.validRange needs 0 <= min <= max and a step of at least 1")
    return DeviceCapacity(value, RequestPolicy(default, (), True, low, high, step), binary)
