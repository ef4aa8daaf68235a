"""The node's own check that a claim's devices are not another prepared claim's, and that shares fit.

DRA drivers usually trust the scheduler for exclusivity across claims: the allocator never gives one device to
two claims. The plugin is the last thing between an allocation and a container, though, and whoever can write a
claim's ``status.allocation`` (a second scheduler allocating for ``gpu.kubecell.io``, a bug, an account with
``resourceclaims/status``) could give a running training job's GPU to a second pod, which would then share it
silently. So a claim is refused, with a message naming the claim that holds the device, where one of its devices

* is held whole by another prepared claim (a whole GPU or a MIG instance), or is wanted whole and another claim
  holds any share of it;
* is a share whose ``shareID`` another prepared claim already holds on that device (a share ID is one
  allocation's);
* is a MIG instance of a GPU another claim holds as a GPU (whole or a share), or the other way round: a GPU in
  MIG mode runs no work outside its instances;
* is a share that, with the shares other prepared claims hold on that device, would take more than all of its
  compute or more than its memory (a claim prepared before the plugin kept consumed capacities counts as
  none of either).

A refusal is the claim's error: the kubelet retries it, and it is prepared once the other claim is
unprepared (a pod that ended on the device and whose claim was allocated again before its unprepare arrived).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubecell.node.dra.slices import MILLI_PER_GPU, NodeDevice


@dataclass(frozen=True, slots=True)
class Holding:
    """What one device of a claim takes of a physical GPU."""

    device: str
    gpu: str
    """The physical GPU's UUID (a MIG instance's parent)."""
    mig: bool
    share_id: str | None
    exclusive: bool
    """Held whole: a whole GPU, or a MIG instance."""
    milli: int = 0
    """The compute a share takes, in thousandths of the GPU (0: not known)."""
    memory_mib: int = 0
    """The memory a share takes (0: not stated or not known)."""


def holding(device: NodeDevice, share_id: str | None, milli: int, memory_mib: int) -> Holding:
    """What ``device``, held with ``share_id``, ``milli`` of its compute and ``memory_mib``, takes."""
    return Holding(device.name, device.gpu.uuid, device.is_mig, share_id, device.is_mig or milli >= MILLI_PER_GPU,
                   milli, memory_mib)


def conflicts(wanted: Holding, held: Holding) -> bool:
    """Whether a claim may not take ``wanted`` while another holds ``held``."""
    if wanted.device == held.device:
        return wanted.exclusive or held.exclusive or (wanted.share_id is not None and
                                                      wanted.share_id == held.share_id)
    return wanted.gpu == held.gpu and wanted.mig != held.mig


def held_elsewhere(wanted: Sequence[Holding], others: Mapping[str, Iterable[Holding]],
                   memory_of: Mapping[str, int]) -> str | None:
    """Why ``wanted`` cannot be prepared beside the claims ``others`` (claim name -> its holdings), on devices
    of ``memory_of`` MiB (device name -> memory); None if it can."""
    shared: dict[str, list[tuple[str, Holding]]] = {}
    for claim, holdings in others.items():
        for held in holdings:
            for want in wanted:
                if conflicts(want, held):
                    what = "held whole" if held.exclusive else f"shared as {held.share_id or 'a share'}"
                    asked = "whole" if want.exclusive else f"as share {want.share_id}"
                    return (f"device {want.device} is asked {asked}, and claim {claim} prepared on this node holds "
                            f"{held.device} {what}; it is prepared once that claim is unprepared")
            if not held.exclusive:
                shared.setdefault(held.device, []).append((claim, held))
    for device in sorted({want.device for want in wanted if not want.exclusive}):
        mine = [want for want in wanted if want.device == device]
        there = shared.get(device, [])
        milli = sum(h.milli for h in mine) + sum(h.milli for _, h in there)
        memory = sum(h.memory_mib for h in mine) + sum(h.memory_mib for _, h in there)
        held_by = sorted({claim for claim, _ in there})
        beside = (f" and the shares claims {', '.join(held_by)} hold on it" if held_by else "")
        after = "; it is prepared once enough of them are unprepared" if held_by else ""
        if milli > MILLI_PER_GPU:
            return (f"device {device}: the shares asked ({sum(h.milli for h in mine)} milli-GPU){beside} come to "
                    f"{milli} milli-GPU, more than the GPU{after}")
        capacity = memory_of.get(device, 0)
        if capacity and memory > capacity:
            return (f"device {device}: the shares asked ({sum(h.memory_mib for h in mine)} MiB){beside} come to "
                    f"{memory} MiB, more than its {capacity} MiB{after}")
    return None
