"""NVIDIA's device plugin dialect: ``nvidia.com/gpu: N`` is N whole GPUs.

NVIDIA's device plugin (``NVIDIA/k8s-device-plugin``) advertises each GPU as one unit of the extended
resource ``nvidia.com/gpu`` (kubecell assumes no time-slicing or MPS replicas, which advertise several units
per GPU) and hands a container as many whole GPUs as it asks for; kube-scheduler adds
the containers' amounts up like any extended resource, so the pod's total (``resources.pod_totals``) is
its GPU count. Extended resources are whole numbers, and a pod's GPUs sit on one node.

HAMi reuses the same resource name for its vGPU count: on a pod that states any HAMi share
(``hami.carries_share``) ``nvidia.com/gpu`` is HAMi's to read, and this dialect states nothing.
"""

from __future__ import annotations

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import names
from kubecell.kube.dialects import hami
from kubecell.kube.dialects.resources import gpu_count
from kubecell.kube.dialects.statement import GpuAsk, Reading, Statement


class Nvidia(Statement):
    """What plain ``nvidia.com/gpu`` states."""

    dialect = "nvidia"

    def ask(self) -> GpuAsk | None:
        """The pod's whole GPUs; a count of 0 asks for no GPU."""
        raw = self.reading.totals.get(names.NVIDIA_GPU)
        if raw is None or hami.carries_share(self.reading):
            return None
        count = gpu_count(self.pod, names.NVIDIA_GPU, raw)
        if not count:
            return None
        return GpuAsk("nvidia", names.NVIDIA_GPU, f"{names.NVIDIA_GPU} {count}", count, MILLI_PER_GPU)


def read(reading: Reading) -> Statement:
    """NVIDIA's dialect on the pod (read when asked)."""
    return Nvidia(reading)
