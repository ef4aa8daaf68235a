"""Which series the profiler reads for each metric, in the names the exporters really use.

A cluster runs some exporters and not others, so each metric lists its sources in order of preference and the
profiler reads, per pod, the first one that has series for it (kubecell's own node agent first: it measures
per process, so a GPU shared by several pods is split between them; dcgm-exporter reports the whole device to
every pod mapped to it). Values are converted to one canonical unit per metric:

- ``gpu_utilization``: a ratio of one GPU's time, **summed over the pod's GPUs** (two GPUs fully busy is 2.0),
  the unit a right-sized share is asked in. From ``kubecell_node_gpu_pod_utilization_ratio`` (0..1, labels
  ``pod``, ``namespace``, ``node``, ``gpu``), else dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (percent, divided
  by 100), else ``DCGM_FI_PROF_SM_ACTIVE`` (0..1, the profiling metric, where only that is collected).
- ``gpu_memory``: bytes, summed over the pod's GPUs. From ``kubecell_node_gpu_pod_memory_bytes``, else
  ``DCGM_FI_DEV_FB_USED`` (MiB, times 2**20).
- ``gpu_memory_utilization``: a ratio of one GPU's memory-controller time, summed over the pod's GPUs: how
  bandwidth-bound the job is, which the co-location predictor weighs beside its SM time. From
  ``kubecell_node_gpu_pod_memory_utilization_ratio`` (NVML's per-process ``memUtil``), else dcgm-exporter's
  ``DCGM_FI_DEV_MEM_COPY_UTIL`` (percent). Optional: where no exporter gives it, nothing is reported missing
  and the scheduler takes a family's compute utilization for it.
- ``cpu``: cores, the per-container rate of cAdvisor's counter ``container_cpu_usage_seconds_total`` (seconds
  of CPU per second), summed over the pod's containers.
- ``memory``: bytes, cAdvisor's ``container_memory_working_set_bytes`` (what the kubelet evicts on), summed
  over the pod's containers.

dcgm-exporter puts the pod's labels ``pod``, ``namespace`` and ``container`` on a GPU's series when its
Kubernetes mapping is on (``DCGM_EXPORTER_KUBERNETES=true``, the Helm chart's default); a scrape job without
``honor_labels`` renames them ``exported_pod`` and ``exported_namespace``: give such a cluster its own
:class:`Source` with those names. cAdvisor (the kubelet's ``/metrics/cadvisor``) labels ``pod``, ``namespace``,
``container``, and adds rows with ``container=""`` (the pod's cgroup, the sum of its containers) and
``container="POD"`` (the pause container): both are left out, or the pod would be counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from kubecell.profiler.prometheus import quote, regex_literal

MIB: Final = 2**20

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Source:
    """One exporter's series for a metric: its name, which labels name the pod, how to reach the canonical
    unit (``value * multiply / divide``: a percentage is divided by 100 rather than multiplied by 0.01, so a
    ratio exported as ``x`` percent reads back exactly as Python's ``x / 100``), and label values whose rows
    are not a container's own (left out)."""

    name: str
    multiply: float = 1.0
    divide: float = 1.0
    kind: Kind = "gauge"
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    exclude: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def selector(self, namespace: str, pods: tuple[str, ...]) -> str:
        """The PromQL selector of ``pods`` in ``namespace`` (regexes are anchored: a pod matches by its whole
        name), the excluded rows left out already in Prometheus."""
        alternatives = "|".join(regex_literal(pod) for pod in sorted(pods))
        matchers = [f"{self.namespace_label}={quote(namespace)}", f"{self.pod_label}=~{quote(alternatives)}"]
        for label, values in sorted(self.exclude.items()):
            matchers.append(f"{label}!~{quote('|'.join(regex_literal(v) for v in values))}")
        return f"{self.name}{{{', '.join(matchers)}}}"

    def canonical(self, value: float) -> float:
        """``value`` in the metric's canonical unit."""
        return value * self.multiply / self.divide

    def keeps(self, labels: Mapping[str, str]) -> bool:
        """False for the rows :attr:`exclude` names (checked here too: a label absent reads as ``""``)."""
        return not any(labels.get(label, "") in values for label, values in self.exclude.items())


@dataclass(frozen=True)
class Metric:
    """A metric the profiler keeps a distribution of, its canonical unit and its sources by preference.
    ``optional``: a refinement some exporters give; a pod without its series is not a problem of its job."""

    name: str
    unit: str
    sources: tuple[Source, ...]
    optional: bool = False


CADVISOR_ROWS_NOT_CONTAINERS: Final[Mapping[str, tuple[str, ...]]] = {"container": ("", "POD")}

GPU_UTILIZATION: Final = Metric("gpu_utilization", "ratio of one GPU (summed over GPUs)", (
    Source("kubecell_node_gpu_pod_utilization_ratio"),
    Source("DCGM_FI_DEV_GPU_UTIL", divide=100),
    Source("DCGM_FI_PROF_SM_ACTIVE"),
))
GPU_MEMORY: Final = Metric("gpu_memory", "bytes", (
    Source("kubecell_node_gpu_pod_memory_bytes"),
    Source("DCGM_FI_DEV_FB_USED", multiply=MIB),
))
GPU_MEMORY_UTILIZATION: Final = Metric("gpu_memory_utilization", "ratio of one GPU's memory-controller time "
                                       "(summed over GPUs)", (
    Source("kubecell_node_gpu_pod_memory_utilization_ratio"),
    Source("DCGM_FI_DEV_MEM_COPY_UTIL", divide=100),
), optional=True)
CPU: Final = Metric("cpu", "cores", (
    Source("container_cpu_usage_seconds_total", kind="counter", exclude=CADVISOR_ROWS_NOT_CONTAINERS),
))
MEMORY: Final = Metric("memory", "bytes", (
    Source("container_memory_working_set_bytes", exclude=CADVISOR_ROWS_NOT_CONTAINERS),
))

METRICS: Final[tuple[Metric, ...]] = (GPU_UTILIZATION, GPU_MEMORY, GPU_MEMORY_UTILIZATION, CPU, MEMORY)
