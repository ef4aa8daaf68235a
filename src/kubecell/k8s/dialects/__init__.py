"""Pods written for any GPU scheduler, read as one kind of demand on kubecell's core.

Users migrate without rewriting manifests: kubecell's own resources and annotations, plain
``nvidia.com/gpu``, HAMi, Aliyun gpushare, KubeShare and HiveD are read side by side, and gangs are read
from kubecell's annotations, KubeShare's labels, HiveD's affinity groups and the PodGroups of
scheduler-plugins, Volcano and KAI. ``pod_demand`` is the one entry point; it is pure (a Pod dict in, a
``PodDemand`` out), and every ask it cannot accept raises ``DemandError`` with a message fit for the
pod's Warning Event. The dialects are tabled in docs/kubernetes.md.

Modules: ``demand`` (the result and error types), ``resources`` (pod totals as kube-scheduler adds them),
``gpu`` (resource and label dialects), ``hived``, ``groups``, ``models`` (GPU model filters), ``pod``
(the entry point).
"""

from kubecell.k8s.dialects.demand import (
    LARGEST_CATALOG_GPU_MEMORY_MIB,
    DemandError,
    DialectOptions,
    GroupDemand,
    Isolation,
    PodDemand,
)
from kubecell.k8s.dialects.groups import PodGroups
from kubecell.k8s.dialects.pod import pod_demand

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
