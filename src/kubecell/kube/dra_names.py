"""The names of kubecell's Dynamic Resource Allocation driver, shared by the node agent and the scheduler.

The node agent publishes each node's GPUs as a ResourceSlice of driver ``gpu.kubecell.io``
(``kubecell.node.dra.slices``); whoever places claims (the stock kube-scheduler, or kubecell's own) reads
the same attribute and capacity names. Attribute and capacity names are unqualified: in a ResourceSlice
they take the driver's domain, so a CEL selector reads them as ``device.attributes["gpu.kubecell.io"].type``
and ``device.capacity["gpu.kubecell.io"].memory``. Constants only: nothing here imports anything.
"""

from __future__ import annotations

DRIVER = "gpu.kubecell.io"
"""The DRA driver name: the slices' ``spec.driver``, the allocation results' ``driver``, the kubelet plugin's
registered name and the domain of every attribute and capacity below."""

API_GROUP_VERSION = "resource.k8s.io/v1"
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def claim_path(namespace: str, name: str) -> str:
    """The API path of ResourceClaim ``namespace/name``."""
    return f"/apis/{API_GROUP_VERSION}/namespaces/{namespace}/resourceclaims/{name}"


# Device attributes (``spec.devices[].attributes``).
ATTR_TYPE = "type"
"""``gpu`` (a whole GPU, shareable by capacity) or ``mig`` (one MIG instance, exclusive)."""
ATTR_UUID = "uuid"
ATTR_MODEL = "model"
"""The GPU model as kubecell's inventory names it (``A100-SXM4-40GB``), ``MIG-<profile>`` for an instance."""
ATTR_PRODUCT = "productName"
ATTR_INDEX = "index"
"""The GPU's NVML index (for a MIG instance: its parent GPU's)."""
ATTR_NUMA = "numaNode"
ATTR_NVLINK_GROUP = "nvlinkGroup"
"""The smallest GPU index of the GPU's NVLink island (GPUs that can reach each other over NVLink share it)."""
ATTR_MEMORY_MIB = "memoryMiB"
ATTR_PROFILE = "profile"
"""A MIG instance's profile (``1g.5gb``)."""
ATTR_PARENT_INDEX = "parentIndex"
ATTR_PARENT_UUID = "parentUUID"

TYPE_GPU = "gpu"
TYPE_MIG = "mig"

# Device capacities (``spec.devices[].capacity``).
CAPACITY_MEMORY = "memory"
"""Device memory as a quantity (``40960Mi``)."""
CAPACITY_COMPUTE = "compute"
"""Compute in milli-GPU: ``1000`` is the whole GPU (kubecell's ``MILLI_PER_GPU``)."""

# DeviceClasses (deploy/dra/deviceclasses.yaml).
CLASS_GPU = "gpu.kubecell.io"
"""Whole GPUs: a claim without capacity requests takes all of one GPU."""
CLASS_GPU_SHARE = "gpu-share.kubecell.io"
"""Shares of a GPU: the same devices, asked for with ``capacity.requests`` (``compute``, ``memory``)."""
CLASS_MIG = "mig.kubecell.io"
"""MIG instances, a profile chosen with a selector on ``profile``."""

CDI_KIND = f"{DRIVER}/claim"
"""The CDI kind of the specs the kubelet plugin writes (``gpu.kubecell.io/claim=<device>``)."""
