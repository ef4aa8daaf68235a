"""What a pod on this node is held to on its GPUs: the grants of its allocation record that the kubelet's own
devices cover, and the GPU memory its spec asks, which bounds whatever its record says.

A record is written by whoever can write the pod, and can be rewritten after the pod started; a pod's resources
cannot. So the overuse monitor believes a record only as far as the kubelet's devices (``covered``) and the spec's
memory ask (``spec_memory_mib``, in any dialect, HAMi's per-container percentages included) bear it out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any, Final

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import pods
from kubecell.kube.dialects.demand import DemandError, PodMeta
from kubecell.kube.dialects.resources import container_amounts_of, containers_asking, pod_totals
from kubecell.kube.names import (
    GPU_MEMORY_MIB_PER_UNIT,
    HAMI_GPU_MEM,
    HAMI_GPU_MEM_PERCENTAGE,
    NVIDIA_GPU,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
)
from kubecell.kube.records import AllocationRecord, GpuGrant

log = logging.getLogger("kubecell.node.grants")

__all__ = ["MEMORY_RESOURCES", "PLUGIN_RESOURCES", "Holdings", "claim_names", "claimed", "covered", "hami_memory_mib",
           "spec_memory_mib"]

Holdings = Mapping[str, tuple[int, int]]
"""Physical GPU UUID -> (milli-GPU, MiB) what prepared claims take of it (MiB 0: not stated)."""

PLUGIN_RESOURCES: Final = frozenset((RESOURCE_GPU, RESOURCE_GPU_MILLI))
MEMORY_RESOURCES: Final = frozenset((*GPU_MEMORY_MIB_PER_UNIT, HAMI_GPU_MEM_PERCENTAGE))
"""The resources a pod's GPU-memory ask can be stated in (:data:`~kubecell.kube.names.GPU_MEMORY_MIB_PER_UNIT`; a
cluster whose gpushare counts MiB, ``--memory-unit=MiB``, is bounded 1,024 times more loosely, never more tightly),
and HAMi's percent of each GPU's memory."""


def covered(record: AllocationRecord, devices: Collection[str]) -> list[GpuGrant]:
    """The grants of ``record`` that the kubelet's ``devices`` for its pod cover, as ``RecordAllocator`` checks
    them before the pod starts: none on a GPU where the pod got no device, a whole GPU (or MIG instance) where
    its own device was given, else a share of at most as many milli-GPU as slots (``<uuid>::<k>``) given."""
    given: dict[str, set[str]] = {}
    for device in devices:
        given.setdefault(device.split("::", 1)[0], set()).add(device)
    grants = []
    for gpu in record.gpus:
        ids = given.get(gpu.uuid)
        if ids:
            milli = gpu.milli if gpu.uuid in ids else min(gpu.milli, len(ids))
            grants.append(gpu if milli == gpu.milli else gpu.model_copy(update={"milli": milli}))
    return grants


def spec_memory_mib(pod: Mapping[str, Any], gpu_memory_mib: int = 0) -> int | None:
    """The MiB of GPU memory the pod's spec asks in any dialect's resource (:data:`MEMORY_RESOURCES`, its
    containers' requests or limits summed as the kubelet and the scheduler sum them), which no rewrite of its record
    can raise; the smallest where it states several; None where the spec asks none (or states it unreadably, which
    the API server's validation of extended resources does not let in). Only resources count: labels and
    annotations can be rewritten with the record. HAMi's asks are per container and per GPU (``hami_memory_mib``).
    """
    if not pods.asks_for_any(pod, MEMORY_RESOURCES):
        return None
    try:
        meta = PodMeta.of(pod)
        totals = pod_totals(meta)
        hami = hami_memory_mib(meta, gpu_memory_mib)
    except DemandError as error:
        log.warning("pod %s: its GPU memory ask cannot be read (%s); its record's memory is taken as written",
                    pods.key(pod), error)
        return None
    stated = [] if hami is None else [hami]
    for resource, mib in GPU_MEMORY_MIB_PER_UNIT.items():
        amount = totals.get(resource)
        if amount is not None and resource != HAMI_GPU_MEM:
            stated.append(max(int(amount * mib), 0))
    return min(stated) if stated else None


def hami_memory_mib(pod: PodMeta, gpu_memory_mib: int) -> int | None:
    """HAMi's memory ask, as HAMi reads it: per container, its ``nvidia.com/gpumem`` MiB (else its
    ``gpumem-percentage`` of ``gpu_memory_mib``, the largest GPU the pod uses here) on each of its
    ``nvidia.com/gpu`` (HAMi's webhook gives a share without a count one), summed over the containers (init
    containers included: never tighter than the pod's peak). None where no container states one, or a percentage
    is stated and no GPU is known. The percentage matters: the scheduler places it as a compute share and grants
    it no MiB (the GPU is not known before it is chosen), and before, such a pod's memory was never checked."""
    total, stated = 0, False
    for name in containers_asking(pod, (HAMI_GPU_MEM, HAMI_GPU_MEM_PERCENTAGE)):
        amounts = container_amounts_of(pod, name)
        gpus = max(amounts.get(NVIDIA_GPU) or Decimal(1), Decimal(1))
        if HAMI_GPU_MEM in amounts:  # overrides the percentage, as in HAMi
            per_gpu = max(amounts[HAMI_GPU_MEM], Decimal(0))
        elif (percent := amounts.get(HAMI_GPU_MEM_PERCENTAGE)) is None:
            continue  # (named only where requests and limits differ, which the API server refuses)
        elif gpu_memory_mib > 0:
            per_gpu = min(max(percent, Decimal(0)), Decimal(100)) * gpu_memory_mib / 100
        else:
            return None
        total += math.ceil(per_gpu * gpus)
        stated = True
    return total if stated else None


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims (by name, in the pod's namespace) the pod uses: named in ``spec.resourceClaims``, or
    made from a template for it (``status.resourceClaimStatuses``)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    made = {str(entry.get("name")): entry.get("resourceClaimName")
            for entry in status.get("resourceClaimStatuses") or [] if isinstance(entry, Mapping)}
    names = []
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if isinstance(name, str) and name:
            names.append(name)
    return names


def claimed(record: AllocationRecord, holdings: Holdings, parent_of: Mapping[str, str]) -> list[GpuGrant]:
    """The grants of ``record`` that the node's prepared claims of its pod bear out (``holdings``): none on a GPU
    they do not take, a whole GPU only where a claim takes it whole, else at most the compute and memory they
    take (MiB 0, not stated by the claims: no memory to hold it to)."""
    grants = []
    for gpu in record.gpus:
        held = holdings.get(parent_of.get(gpu.uuid, gpu.uuid))
        if held is None:
            continue
        milli, memory_mib = held
        if milli >= MILLI_PER_GPU:
            grants.append(gpu)
            continue
        memory = min(gpu.memory_mib, memory_mib) if memory_mib else 0
        grants.append(gpu.model_copy(update={"milli": min(gpu.milli, milli), "memory_mib": memory}))
    return grants
