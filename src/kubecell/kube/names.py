"""Every name kubecell writes into or reads from the Kubernetes API, in one place.

kubecell uses its own resource domain instead of reusing ``nvidia.com/gpu`` for shares: reusing the
vendor's resource forces operators to disable NVIDIA's device plugin (HAMi's most frequent install
complaint). Whole GPUs may still be asked for as ``nvidia.com/gpu``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

DOMAIN = "kubecell.io"
SCHEDULER_NAME = "kubecell"

# Resources a pod asks for (container limits/requests) and a node advertises.
RESOURCE_GPU = f"{DOMAIN}/gpu"                  # whole GPUs
RESOURCE_GPU_MILLI = f"{DOMAIN}/gpu-milli"      # share of one GPU's compute, 1000 = a whole GPU
RESOURCE_GPU_MEMORY = f"{DOMAIN}/gpu-memory"    # MiB of one GPU's memory
NVIDIA_GPU = "nvidia.com/gpu"

# Node annotations and labels.
ANNOTATION_INVENTORY = f"{DOMAIN}/gpu-inventory"   # versioned JSON written by the node agent
ANNOTATION_GPU_FAULTS = f"{DOMAIN}/gpu-faults"     # the node agent: GPUs out of service after a critical XID
ANNOTATION_GPU_FAULT_CLEAR = f"{DOMAIN}/gpu-fault-clear"  # an operator: "all" or GPU UUIDs reset since
LABEL_RACK = f"{DOMAIN}/rack"
LABEL_ZONE = "topology.kubernetes.io/zone"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"             # MiB per GPU
GFD_COUNT = "nvidia.com/gpu.count"

# Pod annotations.
ANNOTATION_ALLOCATION = f"{DOMAIN}/allocation"     # versioned JSON allocation record
ANNOTATION_DURATION = f"{DOMAIN}/duration-seconds" # testbed/replay: the fake kubelet ends the pod after this
ANNOTATION_ACK = f"{DOMAIN}/allocated"              # the node agent: the allocation id its Allocate served
ANNOTATION_STEP_REPORT = f"{DOMAIN}/step-report"     # an elastic worker's last step report (JSON), for goodput

# Pod annotations of kubecell's own dialect (see docs/kubernetes.md, "Asking for GPUs: the dialects").
ANNOTATION_VC = f"{DOMAIN}/vc"                       # the virtual cluster (tenant) the pod runs in
ANNOTATION_GROUP = f"{DOMAIN}/group"                 # gang name, namespaced: pods of one namespace only
ANNOTATION_GROUP_SIZE = f"{DOMAIN}/group-size"       # the gang's headcount
ANNOTATION_GROUP_MIN = f"{DOMAIN}/group-min"         # members that must start together (default: all)
ANNOTATION_GROUP_MAX = f"{DOMAIN}/group-max"         # an elastic gang: the most members it may grow to
ANNOTATION_TOPOLOGY = f"{DOMAIN}/topology"           # nvlink | numa | node | rack | zone
ANNOTATION_GPU_MODELS = f"{DOMAIN}/gpu-models"       # comma list of catalog GPU models allowed
ANNOTATION_ISOLATION = f"{DOMAIN}/isolation"         # accounting | mps | mig
ANNOTATION_OPPORTUNISTIC = f"{DOMAIN}/opportunistic" # "true": scavenge idle GPUs, reclaimed first

TOPOLOGY_VALUES = ("nvlink", "numa", "node", "rack", "zone")
ISOLATION_MODES = ("accounting", "mps", "mig")
DEFAULT_ISOLATION = "accounting"

# Other schedulers' dialects, read so that their manifests run unchanged.
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"                # gpushare: GPU memory of one GPU, GiB by default
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"
ALNAIR_VGPU_MEMORY = "alnair/vgpu-memory"             # Alnair: GPU memory of one GPU, in GiB (its chunk size)
ALNAIR_VGPU_COMPUTE = "alnair/vgpu-compute"           # Alnair: percent of one GPU's compute, below 100
HAMI_GPU_MEM = "nvidia.com/gpumem"                   # HAMi: MiB of each GPU
HAMI_GPU_MEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
HAMI_GPU_CORES = "nvidia.com/gpucores"               # HAMi: percent of each GPU's compute
HAMI_USE_GPU_TYPE = "nvidia.com/use-gputype"         # HAMi pod annotations: comma lists, substring match
HAMI_NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
KUBESHARE_GPU_REQUEST = "sharedgpu/gpu_request"      # KubeShare pod labels
KUBESHARE_GPU_LIMIT = "sharedgpu/gpu_limit"
KUBESHARE_GPU_MEM = "sharedgpu/gpu_mem"              # bytes
KUBESHARE_GPU_MODEL = "sharedgpu/gpu_model"
KUBESHARE_PRIORITY = "sharedgpu/priority"            # 0 = opportunistic, 1..100 = guaranteed
KUBESHARE_GROUP_NAME = "sharedgpu/group_name"
KUBESHARE_GROUP_HEADCOUNT = "sharedgpu/group_headcount"
KUBESHARE_GROUP_THRESHOLD = "sharedgpu/group_threshold"  # minimum = round(threshold x headcount)
KUBESHARE_README_GROUP_NAME = "sharedgpu/pod_group_name" # named in KubeShare's README, never read by its code
HIVED_POD_SCHEDULING_SPEC = "hivedscheduler.microsoft.com/pod-scheduling-spec"  # YAML
COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"      # scheduler-plugins: pod label
VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"           # Volcano: pod annotation
VOLCANO_GROUP_NAME_ALT = "scheduling.volcano.sh/group-name"   # Volcano's second spelling, same meaning
KAI_POD_GROUP = "pod-group-name"                              # KAI-Scheduler: pod annotation
VOLCANO_TASK_SPEC = "volcano.sh/task-spec"                    # Volcano: the pod's task (a member group)
KAI_SUBGROUP = "kai.scheduler/subgroup-name"                  # KAI-Scheduler: the pod's subgroup (pod label)

GPU_MEMORY_MIB_PER_UNIT: Final[Mapping[str, int]] = {RESOURCE_GPU_MEMORY: 1, ALNAIR_VGPU_MEMORY: 1024,
                                                      ALIYUN_GPU_MEM: 1024, HAMI_GPU_MEM: 1}
"""The MiB of one unit of each dialect's GPU-memory resource, read by the scheduler (what a share asks) and by
the node agent (what bounds a pod's record): kubecell's MiB, Alnair's GiB chunks, gpushare's GiB (its device
plugin's default; ``DialectOptions.aliyun_memory_unit`` tells the scheduler of a cluster whose gpushare counts MiB),
HAMi's MiB of each of the pod's GPUs."""

MANAGED_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU_MILLI, RESOURCE_GPU_MEMORY, NVIDIA_GPU, ALIYUN_GPU_MEM,
                     ALIYUN_GPU_COUNT, HAMI_GPU_MEM, HAMI_GPU_MEM_PERCENTAGE, HAMI_GPU_CORES, ALNAIR_VGPU_MEMORY,
                     ALNAIR_VGPU_COMPUTE)
"""The extended resources of every dialect: in extender mode kube-scheduler is told kubecell manages them
(``managedResources``, ``ignoredByScheduler: true``), so it sends kubecell the pods that ask for them and
leaves their accounting (shares of one GPU it cannot count) to kubecell."""

_DNS_UNSAFE = re.compile(r"[^a-z0-9.-]+")


# ElasticJob workers (kubecell.kube.elasticjobs)
ENV_BATCH_SIZE_MIN = "KUBECELL_BATCH_SIZE_MIN"  # a worker's spec.batchSize.min (the job's initial batch)
ENV_BATCH_SIZE_MAX = "KUBECELL_BATCH_SIZE_MAX"  # ... and max: the range kubecell.elastic.batch chooses in
LABEL_ELASTIC_JOB = f"{DOMAIN}/elastic-job"
"""On every Pod of a job (workers and rendezvous host): the job's name. The controller watches pods by it."""
LABEL_WORKER_INDEX = f"{DOMAIN}/worker-index"
"""On a worker: its index, 0 .. replicas-1."""
LABEL_RENDEZVOUS_RUN = f"{DOMAIN}/rendezvous-run"
"""On a worker: the rendezvous run it joins (``PET_RDZV_ID=<job uid>-<run>``), the job's restart count when it
was created. A restart starts a new run, since torchrun closes a run for good when an agent gives up."""
LABEL_ELASTIC_ROLE = f"{DOMAIN}/elastic-role"
LABEL_TEMPLATE_HASH = f"{DOMAIN}/template-hash"
"""On a worker: a digest of the job's ``spec.template`` it was made from. A worker whose digest is not the
template's now is replaced by one made from it (``kubecell.elastic.states``, rule 6)."""


def k8s_name(name: str) -> str:
    """A DNS-1123 subdomain for a trace's node name (lowercase, ``_`` and other characters to ``-``): the
    name a node of a cluster description gets as a Kubernetes object, wherever kubecell needs to match them."""
    cleaned = _DNS_UNSAFE.sub("-", name.lower()).strip("-.")
    return cleaned[:253] or "node"
