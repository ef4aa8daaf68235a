"""What a container is given for its allocation record, per isolation mode.

* ``accounting``: the GPUs by UUID (``NVIDIA_VISIBLE_DEVICES`` for the container runtime,
  ``CUDA_VISIBLE_DEVICES`` for CUDA) and the share's budget in the environment, for frameworks that can
  limit themselves (``KUBECELL_GPU_MEMORY_FRACTION`` is what PyTorch's
  ``torch.cuda.set_per_process_memory_fraction`` takes). Nothing is enforced: overuse is detected and
  reported by the agent, and the record, ``kubecell inspect`` and the metrics say ``accounting``.
* ``mps``: the same plus NVIDIA's per-client MPS limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and the pipe and log directories of the MPS control daemon the agent
  runs for that GPU, mounted into the container: the driver enforces the memory limit and caps the SMs.
* ``mig``: the one MIG instance the record names, by its ``MIG-...`` UUID. The hardware isolates its
  compute and memory. A node whose GPUs are in MIG mode gives this mode alone, and the scheduler places
  instances there (``kubecell.kube.mig``); a record for another mode on such a node, or a ``mig`` record
  naming a GPU rather than an instance, is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube.records import AllocationRecord, RecordError, gpu_environment
from kubecell.node.deviceplugin import ContainerAllocation, Mount

MPS_ROOT = Path("/var/run/kubecell/mps")
"""Per GPU: ``<root>/<uuid>/pipe`` and ``<root>/<uuid>/log`` of the MPS control daemon the agent runs."""


@dataclass(frozen=True, slots=True)
class NodeIsolation:
    """What this node can give: the modes its inventory advertises and where MPS daemons keep their pipes."""

    modes: tuple[str, ...] = ("accounting",)
    mps_root: Path = MPS_ROOT

    def mps_dirs(self, uuid: str) -> tuple[Path, Path]:
        return self.mps_root / uuid / "pipe", self.mps_root / uuid / "log"


def container_allocation(record: AllocationRecord, node: NodeIsolation,
                         gpu_memory_mib: Mapping[str, int]) -> ContainerAllocation:
    """The environment and mounts for a container holding ``record`` (``gpu_memory_mib``: each GPU's size
    by UUID); ``RecordError`` for a mode this node cannot give (the pod then fails to start on this node,
    loudly, instead of running unlimited)."""
    if record.isolation not in node.modes:
        raise RecordError(f"isolation {record.isolation} is not available on node {record.node} "
                          f"(it gives {', '.join(node.modes)})", location=f"allocation {record.allocation_id}")
    env = dict(gpu_environment(record))  # RecordError for mig
    if record.gpus and record.gpu_milli < MILLI_PER_GPU:
        fraction = memory_fraction(record, gpu_memory_mib.get(record.gpus[0].uuid, 0))
        if fraction is not None:
            env["KUBECELL_GPU_MEMORY_FRACTION"] = f"{fraction:.4f}"
    mounts: tuple[Mount, ...] = ()
    if record.isolation == "mps" and record.gpus:
        if len(record.gpus) != 1:
            raise RecordError("isolation mps is for a share of one GPU", location=f"allocation {record.allocation_id}")
        pipe, log = node.mps_dirs(record.gpus[0].uuid)
        env["CUDA_MPS_PIPE_DIRECTORY"] = "/var/run/kubecell-mps/pipe"
        env["CUDA_MPS_LOG_DIRECTORY"] = "/var/run/kubecell-mps/log"
        mounts = (Mount("/var/run/kubecell-mps/pipe", str(pipe), read_only=False),
                  Mount("/var/run/kubecell-mps/log", str(log), read_only=False))
    return ContainerAllocation(envs=env, mounts=mounts,
                               annotations={"kubecell.io/allocation-id": record.allocation_id})


def memory_fraction(record: AllocationRecord, gpu_memory_mib: int) -> float | None:
    """The share of its GPU's memory a share may use (PyTorch's per-process memory fraction), or None."""
    if not record.gpus or not record.gpu_memory_mib or gpu_memory_mib <= 0:
        return None
    return min(1.0, record.gpu_memory_mib / gpu_memory_mib)
