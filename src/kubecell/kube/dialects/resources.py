"""A pod's resource requests as kube-scheduler adds them up, in exact decimal arithmetic, and the checks
every dialect applies to the amounts it reads.

Every dialect that asks through container resources (kubecell's own, ``nvidia.com/gpu``, HAMi,
gpushare, Alnair) and the pod's CPU and memory are read from one table of pod totals computed the way
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

The checks at the end are the ones several dialects share, so that a GPU count, a memory share or a
gang's headcount is refused with the same words whichever dialect wrote it: a whole number of an extended
resource, a GPU count one node can hold, a memory share one GPU can hold, a count written as text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from decimal import ROUND_UP, Context, Decimal, InvalidOperation, localcontext
from typing import Any

from kubecell.core.limits import MAX_GANG_MEMBERS, MAX_GPUS_PER_NODE
from kubecell.core.shown import shown
from kubecell.kube.dialects.demand import DemandError, DialectOptions, PodMeta

_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
"""Kubernetes' quantity grammar (``k8s.io/apimachinery/pkg/api/resource``): ASCII digits only, as Go reads
them (Python's ``\\d`` would also take ``"١٢"`` and other Unicode digits)."""
_DECIMAL_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
MIB = Decimal(2**20)

QUANTITY_FORMS = "a Kubernetes quantity such as 2, 500m, 1.5, 4Gi or 4096Mi"

MAX_NUMBER_CHARS = 64
"""The longest number text read (a quantity, or a decimal in a label). The largest quantity Kubernetes
holds has 19 digits, and a label value is at most 63 characters, so nothing valid is longer; checking the
length first bounds every conversion that follows (and Python's own limit of 4,300 digits for ``int``)."""

MAX_QUANTITY = 2**63 - 1
"""The largest magnitude a quantity may have. Kubernetes keeps quantities in int64 base units and caps them
there (``resource.Quantity``: "no quantity may represent a number greater than 2^63-1"); kubecell refuses
larger ones instead of capping, so a pod never silently gets less than it wrote. Every amount kubecell then
derives (milli-CPU, MiB, GPU counts) is a number of at most about 22 digits, checked against
``kubecell.core.limits`` with its own message."""

_NANO = Decimal("1e-9")
_EXPONENT_SPAN = 100
"""Decimal exponents beyond +-100 need no arithmetic: the mantissa has at most 64 digits, so such a value is
either far above ``MAX_QUANTITY`` or far below a nano-unit."""
_EXACT = Context(prec=200, Emax=999_999, Emin=-999_999)
"""Room for every exact product of a 64-digit mantissa, a power of ten within +-100 and 1024^6."""


class QuantityError(ValueError):
    """A number kubecell cannot read: ``reason`` says why (in words for a message), ``accepted`` what would
    be read."""

    def __init__(self, reason: str, accepted: str = QUANTITY_FORMS) -> None:
        super().__init__(reason)
        self.reason = reason
        self.accepted = accepted


def _too_large(accepted: str, what: str = "a Kubernetes quantity holds") -> QuantityError:
    return QuantityError(f"is beyond the largest amount {what} ({MAX_QUANTITY}, int64)",
                         f"{accepted}, of magnitude at most {MAX_QUANTITY}")


def _scaled(number: Decimal, exponent: int, power_1024: int, accepted: str) -> Decimal:
    """``number`` x 10^exponent x 1024^power_1024, exactly, within ``MAX_QUANTITY``; magnitudes finer than a
    nano-unit are rounded up to one, as the API server stores quantities (a pod that asks for something gets
    something)."""
    if not number:
        return Decimal(0)
    if exponent > _EXPONENT_SPAN:
        raise _too_large(accepted)
    if exponent < -_EXPONENT_SPAN:
        return _NANO.copy_sign(number)
    with localcontext(_EXACT):
        value = number.scaleb(exponent) * (Decimal(1024) ** power_1024)
        if abs(value) > MAX_QUANTITY:
            raise _too_large(accepted)
        exponent_of = value.as_tuple().exponent
        if isinstance(exponent_of, int) and exponent_of < -9:
            value = value.quantize(_NANO, rounding=ROUND_UP)
    return value


def _number_text(value: object, accepted: str) -> str:
    """The text of a number, length-checked before anything else reads it."""
    if not isinstance(value, str):
        raise QuantityError(f"is a {type(value).__name__}, not a quantity", accepted)
    if len(value) > MAX_NUMBER_CHARS:
        raise QuantityError(f"is {len(value)} characters long; no number kubecell reads is longer than "
                            f"{MAX_NUMBER_CHARS}", f"{accepted}, of at most {MAX_NUMBER_CHARS} characters")
    return value.strip()


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity (``"500m"``, ``"4Gi"``, ``"1e3"``, ``2``) as an exact decimal.

    Raises ``QuantityError`` (a ``ValueError``) for anything else: booleans (which YAML and JSON clients
    produce by accident), text longer than ``MAX_NUMBER_CHARS``, digits other than ASCII, and magnitudes
    beyond ``MAX_QUANTITY``. Lengths and exponents are checked before any conversion, so no text costs
    more than a few microseconds, whatever its exponent (``1e999999999``) or length."""
    if isinstance(value, bool):
        raise QuantityError("is a boolean, not a quantity")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:
            raise _too_large(QUANTITY_FORMS)
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError("is not a finite number")
        if abs(value) > MAX_QUANTITY:
            raise _too_large(QUANTITY_FORMS)
        return _scaled(Decimal(repr(value)), 0, 0, QUANTITY_FORMS)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise QuantityError("is not a finite number")
        value = str(value)
    match = _QUANTITY.fullmatch(_number_text(value, QUANTITY_FORMS))
    if not match:
        raise QuantityError("is not a Kubernetes quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return _scaled(number, 0, _BINARY[suffix], QUANTITY_FORMS)
    if suffix in _DECIMAL:
        return _scaled(number, _DECIMAL[suffix], 0, QUANTITY_FORMS)
    if suffix:  # e/E notation: the exponent has at most 62 digits here, and beyond +-100 is never computed
        return _scaled(number, int(suffix[1:]), 0, QUANTITY_FORMS)
    return _scaled(number, 0, 0, QUANTITY_FORMS)


DECIMAL_FORMS = "a decimal such as 0.5, 1 or 2"
_LABEL_LIMIT = "kubecell reads in a label (the largest Kubernetes quantity)"


def parse_decimal(text: str, accepted: str = DECIMAL_FORMS) -> Decimal:
    """A plain decimal number written in a label (``"0.5"``, ``"2"``, ``"1e-3"``), without units.

    Raises ``QuantityError`` with the reason for anything else: not ASCII digits, more than
    ``MAX_NUMBER_CHARS`` characters, a magnitude beyond ``MAX_QUANTITY``, or a non-zero magnitude below
    10^-100 (no share or size is that fine; refused rather than read as 0). ``accepted`` is what the caller
    reads, for the error."""
    stripped = _number_text(text, accepted)
    if not _DECIMAL_NUMBER.fullmatch(stripped):
        raise QuantityError("is not a number", accepted)
    mantissa, _, exponent = stripped.lower().partition("e")
    number, power = Decimal(mantissa), int(exponent or 0)
    if not number:
        return Decimal(0)
    if number.adjusted() + power < -_EXPONENT_SPAN:
        raise QuantityError(f"is closer to 0 than 1e-{_EXPONENT_SPAN}, finer than any amount", accepted)
    if number.adjusted() + power > 18:
        raise _too_large(accepted, _LABEL_LIMIT)
    try:
        with localcontext(_EXACT):
            value = number.scaleb(power)
    except InvalidOperation:  # unreachable within the bounds above; a number all the same
        raise QuantityError("is not a number", accepted) from None
    if abs(value) > MAX_QUANTITY:
        raise _too_large(accepted, _LABEL_LIMIT)
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
        except QuantityError as error:
            cname = str(container.get("name") or "?")[:63]
            raise DemandError(pod.key, f"{kind} {cname}: {str(name)[:253]} {shown(raw)}", error.reason,
                              field=str(name), accepted=error.accepted) from None
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


# ---------------------------------------------------------------- checks the dialects share

WHOLE_ASK_HINT = "kubecell.io/gpu: N or nvidia.com/gpu: N for N whole GPUs"
"""How to ask for whole GPUs, told wherever a share asks for more than one GPU holds."""


def whole_number(pod: PodMeta, name: str, value: Decimal) -> int:
    """A container resource amount that must be a whole number (every extended resource is)."""
    if value != value.to_integral_value():
        raise pod.error(f"{name} {number_text(value)}", "is not a whole number",
                        field=name, accepted="whole numbers (extended resources cannot be fractional)")
    return int(value)


def gpu_count(pod: PodMeta, name: str, value: Decimal) -> int:
    """A number of whole GPUs: a pod's GPUs sit on one node, so at most a node's."""
    count = whole_number(pod, name, value)
    if count < 0:
        raise pod.error(f"{name} {count}", "asks for a negative number of GPUs", field=name,
                        accepted=f"0..{MAX_GPUS_PER_NODE}")
    if count > MAX_GPUS_PER_NODE:
        raise pod.error(f"{name} {count}", "asks for more GPUs than one node has", field=name,
                        accepted=f"0..{MAX_GPUS_PER_NODE} (a pod's GPUs sit on one node; use a group of pods)")
    return count


def share_memory_mib(pod: PodMeta, subject: str, field: str, mib: int, options: DialectOptions, unit: str) -> int:
    """The MiB of one GPU a memory share asks for: above 0, and no more than the largest GPU has (``unit`` is
    the unit the dialect writes, for the message)."""
    if mib <= 0:
        raise pod.error(subject, "a share of no GPU memory is no share", field=field,
                        accepted=f"a positive amount in {unit}; none for a pod without GPUs")
    if mib > options.largest_gpu_memory_mib:
        raise pod.error(subject, f"asks {mib} MiB of one GPU, more than the largest GPU's "
                        f"{options.largest_gpu_memory_mib} MiB", field=field,
                        accepted=f"at most {options.largest_gpu_memory_mib} MiB, or {WHOLE_ASK_HINT}")
    return mib


_DIGITS = re.compile(r"[0-9]+")
"""ASCII digits: ``str.isdigit`` also takes ``"²"`` (which ``int`` refuses) and ``"١٢"`` (which it reads)."""


def count_text(pod: PodMeta, text: str, subject: str, field: str, low: int) -> int:
    """A headcount or minimum written in a label or annotation: ASCII digits, its length and its range
    checked before ``int`` reads it (which refuses more than 4,300 digits with a ``ValueError``)."""
    accepted = f"{low}..{MAX_GANG_MEMBERS}"
    if len(text) > MAX_NUMBER_CHARS:
        raise pod.error(subject, f"is {len(text)} characters long, not a count", field=field, accepted=accepted)
    stripped = text.strip()
    if not _DIGITS.fullmatch(stripped):
        raise pod.error(subject, "is not a whole number (digits 0-9)", field=field, accepted=accepted)
    digits = stripped.lstrip("0") or "0"
    if len(digits) > len(str(MAX_GANG_MEMBERS)) or not low <= int(digits) <= MAX_GANG_MEMBERS:
        raise pod.error(subject, "is out of range", field=field, accepted=accepted)
    return int(digits)
