"""Whether an allocation record describes its own pod: the checks kubecell makes before it believes one.

A record (``kubecell.io/allocation``) is written by kubecell's scheduler, and the shipped admission policy
(``deploy/admission``) lets nobody else write it. A cluster without that policy, or a record copied or edited
by hand, must still never make kubecell hand out capacity it does not have or place a pod where its owner
could not: so every record read back (at a rebuild, a restart, in ``kubecell inspect``) is checked against
what the pod itself asks for, and against where the API server says the pod runs. One function here, used
by the scheduler's restore and by ``inspect``, so both count a record the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube import pods
from kubecell.kube.dialects import PodDemand
from kubecell.kube.records import AllocationRecord

_GENERATION = re.compile(r"#[1-9][0-9]{0,8}")
"""A generation as ``kubecell.scheduler.jobs.job_name`` writes one: ASCII digits (``\\d`` takes any script's), no
leading zero."""


def job_base(demand: PodDemand, pod: Mapping[str, Any]) -> str:
    """The job name a record of this pod must carry, without its generation: the gang's key (``ns/group``)
    or, for a pod alone, ``ns/pod@uid8`` (``kubecell.scheduler.jobs.job_name``)."""
    if demand.group is not None:
        return demand.group.key
    return lone_job(pod)


def lone_job(pod: Mapping[str, Any]) -> str:
    """The job name of ``pod`` placed alone (``kubecell.scheduler.jobs.job_name`` at generation 0)."""
    return f"{pods.key(pod)}@{pods.uid(pod)[:8]}"


def forfeited(record: AllocationRecord, pod: Mapping[str, Any]) -> AllocationRecord:
    """What a bound pod whose record agrees on its placement but not on its standing (``standing_disagreement``:
    its owner edited its VC, gang, isolation or class while it ran, or the record was copied from a pod of
    another job) is counted as: the same node, GPUs, grants and isolation (what its node gives it), as
    opportunistic work alone, in the VC the record names (none other: its owner chooses its annotations).

    Neither way out before was sound: believing the record lets an owner move a guarantee between its pods,
    and holding the pod as another scheduler's work (never evicted, charged to no VC) let the owner of a
    borrowed pod make it unreclaimable by editing one annotation before a restart (found by a hostile review).
    Opportunistic work is reclaimed first, so an edit can only lower what a pod may keep."""
    return record.model_copy(update={"job": lone_job(pod), "job_class": "opportunistic", "member": 0, "batch": 1})


def _gpu_problem(record: AllocationRecord, request: Request, *, lowerable: bool) -> str | None:
    held = len(record.gpus)
    if not request.wants_gpu:
        return None if not held else f"holds {held} GPU(s) but the pod asks for none"
    if request.is_whole:
        if held != request.gpu_count or any(gpu.milli != MILLI_PER_GPU for gpu in record.gpus):
            return (f"holds {held} GPU(s) at {record.gpu_milli} milli but the pod asks for {request.gpu_count} whole "
                    "GPU(s)")
        return None
    # A share that kubecell alone counts (``lowerable``) may be granted less compute than it asks
    # (``--place-by-use``: its family's need), but some, never none (0 is "no compute limit" to the node agent);
    # any share exactly the memory it asks (memory is not elastic). One that Kubernetes counts (an extended
    # resource, a claim) holds exactly what it asks: a lower record there would only let kubecell pack its GPU
    # past what the kubelet or the claim counts, which makes other pods fail.
    granted = record.gpu_milli == request.gpu_milli or (lowerable and 0 < record.gpu_milli < request.gpu_milli)
    if held != 1 or not granted or record.gpu_memory_mib != request.gpu_memory_mib:
        most = "at most " if lowerable else ""
        return (f"holds {held} GPU(s) with {record.gpu_milli} milli and {record.gpu_memory_mib} MiB each but the pod "
                f"asks for a share of one GPU ({most}{request.gpu_milli} milli, {request.gpu_memory_mib} MiB)")
    return None


def disagreement(pod: Mapping[str, Any], record: AllocationRecord, demand: PodDemand, *, default_vc: str) -> str | None:
    """Why ``record`` does not describe ``pod``'s own decision, or None when it does: where it runs and what it
    holds (``placement_disagreement``), then whose it is (``standing_disagreement``)."""
    return (placement_disagreement(pod, record, demand)
            or standing_disagreement(pod, record, demand, default_vc=default_vc))


def placement_disagreement(pod: Mapping[str, Any], record: AllocationRecord, demand: PodDemand) -> str | None:
    """Why ``record`` does not describe where ``pod`` runs and what it holds, or None when it does.

    Checked: the node (a bound pod's record must name ``spec.nodeName``) and the GPUs it holds, against the GPUs
    the pod asks for. A pod not bound yet must also be recorded with exactly the CPU and memory it asks for (a
    bound pod's may since have been resized in place)."""
    node = pods.node_of(pod)
    if node and record.node != node:
        return f"names node {record.node} but the pod runs on {node} (spec.nodeName)"
    request = demand.request
    if not node and (record.cpu_milli != request.cpu_milli or record.memory_mib != request.memory_mib):
        return (f"reserves {record.cpu_milli}m CPU and {record.memory_mib} MiB but the pod asks for "
                f"{request.cpu_milli}m and {request.memory_mib} MiB")
    return _gpu_problem(record, request, lowerable=not pods.counted_by_kubernetes(pod))


def standing_disagreement(pod: Mapping[str, Any], record: AllocationRecord, demand: PodDemand, *,
                          default_vc: str) -> str | None:
    """Why ``record`` does not describe whose work ``pod`` is, or None when it does: the job (the pod's own
    gang, or the pod alone), the virtual cluster the pod names (or the default), the isolation mode it asks for,
    and a guaranteed class for a pod that asks to be opportunistic. A running pod that names no VC runs in the
    one its record names: the default it was placed under, which the operator may have changed since (a
    restart with another ``--default-vc`` must not demote every running pod). These are annotations the pod's owner may
    edit while it runs: a bound pod whose record agrees on its placement but not on these forfeits its standing
    (``forfeited``) rather than being believed or held as another scheduler's pod."""
    base = job_base(demand, pod)
    if record.job != base and not (record.job.startswith(base) and _GENERATION.fullmatch(record.job[len(base):])):
        return f"names job {record.job!r}, which is not the pod's own ({base!r})"
    vc = demand.vc or default_vc
    if record.vc != vc and (demand.vc is not None or not pods.node_of(pod)):
        return f"names virtual cluster {record.vc!r} but the pod runs in {vc!r}"
    if record.isolation != demand.isolation:
        return f"names isolation {record.isolation} but the pod asks for {demand.isolation}"
    if record.job_class == "guaranteed" and demand.opportunistic:
        return "holds its GPUs as guaranteed but the pod is opportunistic"
    return None
