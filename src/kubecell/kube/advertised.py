"""What a Node advertises, and the rule that its GPU inventory never offers more.

Two writers describe a node's GPUs and can disagree: the node agent's inventory annotation (or GPU Feature
Discovery's labels) says which GPUs exist, and the device plugin, through the kubelet, says how many the node
offers (``status.allocatable``, else ``capacity``). The advertised count is what the kubelet will actually hand
out (it refuses at admission a pod bound beyond it), and one node claiming 16 GPUs where it offers 8 would
change the cluster's shape under every tenant's guarantee. So the scheduler believes the smaller: an inventory
listing 16 GPUs on a node advertising ``kubecell.io/gpu: 8`` keeps the GPUs of the 8 lowest indices, and the
view says what it dropped (``NodeView.inventory_note``; the scheduler posts it as a Warning Event).

Which resource counts (``advertised_gpus``): ``kubecell.io/gpu`` (kubecell's device plugin: one device per GPU,
or per MIG instance on a node in MIG mode); else, on a MIG node, NVIDIA's ``mixed`` strategy's
``nvidia.com/mig-<profile>`` resources together; else ``nvidia.com/gpu`` (NVIDIA's plugin; its ``single`` MIG
strategy counts instances there). A node advertising none keeps its whole inventory.

The status maps are written by kubelets and device plugins, so every count is read as a Kubernetes quantity,
checked before conversion, and a bad one is an ``InvalidInputError`` naming the node and the field (the
scheduler then leaves the node out with that reason). Split from ``kubecell.kube.inventory``, which applies the
rule to the inventory and GFD views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Gpu
from kubecell.core.shown import shown
from kubecell.kube.dialects.resources import QUANTITY_FORMS, QuantityError, parse_quantity
from kubecell.kube.names import NVIDIA_GPU, RESOURCE_GPU

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""NVIDIA's device plugin in its ``mixed`` MIG strategy advertises one resource per profile."""


def status_map(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``status.<key>`` (``allocatable`` or ``capacity``), or an empty map."""
    status = obj.get("status") or {}
    value = status.get(key) if isinstance(status, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def node_value_error(name: str, where: str, raw: object, message: str, accepted: str) -> InvalidInputError:
    """A value of the Node that cannot be read: ``node n1: status.allocatable.cpu: 'abc' is not ...``."""
    return InvalidInputError(f"{shown(raw)} {message}", location=f"node {name}: {where}", accepted=accepted)


@dataclass(frozen=True, slots=True)
class Advertised:
    """The GPUs the node advertises as a resource: how many, and under which name (for the note)."""

    resource: str
    count: int


def _advertised_count(name: str, table: str, resource: str, raw: object) -> int:
    where = f"status.{table}.{resource}"
    accepted = "a whole number of GPUs >= 0"
    try:
        value = parse_quantity(raw)
    except QuantityError as error:
        raise node_value_error(name, where, raw, error.reason, f"{accepted} ({QUANTITY_FORMS})") from None
    if value < 0 or value != value.to_integral_value():
        raise node_value_error(name, where, raw, "is not a whole number of GPUs >= 0", accepted)
    return int(value)


def advertised_resource(name: str, obj: Mapping[str, Any], resource: str) -> int | None:
    """One resource's count, from ``status.allocatable``, else ``status.capacity``; None where neither has it."""
    for table in ("allocatable", "capacity"):
        values = status_map(obj, table)
        if resource in values:
            return _advertised_count(name, table, resource, values[resource])
    return None


def advertised_gpus(name: str, obj: Mapping[str, Any], *, mig: bool) -> Advertised | None:
    """How many GPUs the node advertises, read as the kubelet reports it: ``status.allocatable`` of a
    resource, else ``status.capacity`` (allocatable leaves out the devices a device plugin reports
    unhealthy). ``kubecell.io/gpu`` (kubecell's device plugin: one device per GPU, or per MIG instance on a
    node in MIG mode) wins; else, on a MIG node, NVIDIA's ``mixed`` strategy's ``nvidia.com/mig-<profile>``
    resources together; else ``nvidia.com/gpu`` (NVIDIA's device plugin; its ``single`` MIG strategy counts
    MIG instances there). None where the node advertises none: the inventory then stands alone."""
    count = advertised_resource(name, obj, RESOURCE_GPU)
    if count is not None:
        return Advertised(RESOURCE_GPU, count)
    if mig:
        profiles = sorted({key for table in ("allocatable", "capacity") for key in status_map(obj, table)
                           if isinstance(key, str) and key.startswith(MIG_RESOURCE_PREFIX)})
        if profiles:
            named = ", ".join(profiles) if len(profiles) <= 3 else f"{MIG_RESOURCE_PREFIX}*"
            return Advertised(named, sum(advertised_resource(name, obj, profile) or 0 for profile in profiles))
    count = advertised_resource(name, obj, NVIDIA_GPU)
    return None if count is None else Advertised(NVIDIA_GPU, count)


def kept_gpus(gpus: Sequence[Gpu], advertised: Advertised | None, listing: str, unit: str) -> tuple[int, str]:
    """How many of ``gpus`` (in index order) the view keeps, and the note saying why when it drops some.

    The node advertises the devices its device plugin reports healthy (the kubelet leaves unhealthy ones out
    of allocatable), so the inventory's *healthy* GPUs are compared with the advertised count: a node with
    one failed GPU of eight advertises 7 and keeps all eight, the failed one marked unhealthy. Beyond the
    count, the view keeps the lowest indices (the longest prefix holding no more healthy GPUs than
    advertised): indices stay 0..n-1, so allocation records keep naming the same GPUs."""
    healthy = sum(gpu.healthy for gpu in gpus)
    if advertised is None or healthy <= advertised.count:
        return len(gpus), ""
    kept = seen = 0
    for gpu in gpus:
        if gpu.healthy:
            if seen == advertised.count:
                break
            seen += 1
        kept += 1
    listed = f"{len(gpus)} {unit}s" + (f" ({healthy} healthy)" if healthy != len(gpus) else "")
    using = f"{kept}" + (f" ({seen} healthy)" if seen != kept else "")
    return kept, (f"{listing} lists {listed} but the node advertises {advertised.resource}: {advertised.count}; "
                  f"using {using}")
