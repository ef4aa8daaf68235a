"""Pods written for any GPU scheduler, read as one kind of demand on kubecell's core.

Users migrate without rewriting manifests: kubecell's own resources and annotations, plain
``nvidia.com/gpu``, HAMi, Aliyun gpushare, Alnair, KubeShare and HiveD are read side by side, and gangs are
read from kubecell's annotations, KubeShare's labels, HiveD's affinity groups and the PodGroups of
scheduler-plugins, Volcano and KAI. ``pod_demand`` is the one entry point; it is pure (a Pod dict in, a
``PodDemand`` out), and every ask it cannot accept raises ``DemandError`` with a message fit for the
pod's Warning Event. The dialects are tabled in docs/kubernetes.md.

One module per source system, each owning everything its system states and exposing one reader,
``read(reading) -> statement.Statement``: ``kubecell``, ``nvidia``, ``hami``, ``aliyun``, ``alnair``,
``kubeshare``, ``hived``, ``podgroups`` (coscheduling, Volcano, KAI). What they share: ``demand`` (the
result and error types), ``statement`` (the reader interface and what a dialect states), ``resources``
(quantities, pod totals as kube-scheduler adds them, the checks of amounts), ``models`` (GPU model
matching). ``pod`` is the entry point: it asks every dialect and holds every rule by which dialects must
agree.
"""

from kubecell.kube.dialects.demand import (
    LARGEST_CATALOG_GPU_MEMORY_MIB,
    DemandError,
    DialectOptions,
    GroupDemand,
    Isolation,
    PodDemand,
)
from kubecell.kube.dialects.pod import pod_demand
from kubecell.kube.dialects.podgroups import PodGroups

__all__ = [
    "LARGEST_CATALOG_GPU_MEMORY_MIB",
    "DemandError",
    "DialectOptions",
    "GroupDemand",
    "Isolation",
    "PodDemand",
    "PodGroups",
    "pod_demand",
]
