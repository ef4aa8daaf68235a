"""What a running pod kubecell did not place is taken to hold, as kubecell accounts it.

A pod another scheduler bound (or one created with ``spec.nodeName``), and a pod of kubecell's own whose record a
restarted scheduler cannot believe, run where they run: kubecell holds their CPU, memory and GPUs there (whole
GPUs: a share another scheduler granted is not one kubecell can see), never evicts them, and charges them to no
VC. Never less than they could use: a pod whose ask kubecell cannot read holds what its containers ask.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubecell.core.limits import MAX_CPU_MILLI, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube import pods
from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.dialects.demand import PodMeta
from kubecell.kube.dialects.resources import mib_up, pod_totals
from kubecell.kube.names import MANAGED_RESOURCES, NVIDIA_GPU, RESOURCE_GPU


def foreign_hold(pod: Mapping[str, Any], name: str) -> Request:
    """What a pod another scheduler bound is taken to hold, as kubecell accounts it: its CPU and memory,
    and its GPUs as whole GPUs (a share another scheduler granted is not one kubecell can see). A pod whose ask
    kubecell cannot read (a malformed kubecell annotation: the kubelet runs it all the same) is held by its
    containers' resources alone (``unread_hold``)."""
    try:
        request = pod_demand(pod).request
    except DemandError:
        return unread_hold(pod, name)
    gpus = max(request.gpu_count, 1) if (request.gpu_count or request.gpu_memory_mib) else 0
    return Request(name, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, gpu_count=gpus,
                   gpu_milli=MILLI_PER_GPU if gpus else 0)


def unread_hold(pod: Mapping[str, Any], name: str) -> Request:
    """A running pod's hold from its resources alone: its CPU and memory, its whole GPUs as counted
    (``nvidia.com/gpu``, ``kubecell.io/gpu``), and one GPU at least where it asks any GPU resource kubecell
    knows (a share, GPU memory). Before, a pod whose ask could not be read held nothing, and its GPUs were
    given to another tenant's pod (found by a hostile review)."""
    try:
        totals = pod_totals(PodMeta.of(pod))
    except DemandError:
        totals = {}
    whole = sum(totals.get(resource, Decimal(0)) for resource in (RESOURCE_GPU, NVIDIA_GPU))
    gpus = min(math.ceil(max(whole, Decimal(0))), MAX_GPUS_PER_NODE)
    if not gpus and pods.asks_for_any(pod, frozenset(MANAGED_RESOURCES)):
        gpus = 1
    cpu = min(math.ceil(max(totals.get("cpu", Decimal(0)), Decimal(0)) * 1000), MAX_CPU_MILLI)
    memory = min(mib_up(max(totals.get("memory", Decimal(0)), Decimal(0))), MAX_MEMORY_MIB)
    return Request(name, cpu_milli=cpu, memory_mib=memory, gpu_count=gpus, gpu_milli=MILLI_PER_GPU if gpus else 0)


def gpus_only(held: Request) -> Request:
    """``held`` without its CPU and memory: what is still held of a running pod whose CPU or memory the node's books
    cannot fit (resized in place past them, or a node that reports less than it runs). Its GPUs matter most: held as
    nothing, they were given to another pod while it used them (found by a hostile review)."""
    return Request(held.name, gpu_count=held.gpu_count, gpu_milli=held.gpu_milli, gpu_memory_mib=held.gpu_memory_mib)
