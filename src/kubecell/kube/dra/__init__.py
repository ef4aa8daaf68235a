"""Dynamic Resource Allocation (``resource.k8s.io/v1``) read into what kubecell's engine places.

The node agent publishes each node's GPUs as a ResourceSlice of driver ``gpu.kubecell.io``
(``kubecell.kube.dra_names``); pods ask for them through ResourceClaims. This package is the translation
both ways, with no I/O: ``slices`` turns slices into published devices (refusing forged ones), ``claims``
turns a claim and its DeviceClasses into the demand the engine places (count, milli-GPU, memory, which
devices its CEL selectors admit), ``allocation`` writes the chosen devices as the claim's
``status.allocation`` exactly as kube-scheduler's structured allocator would, and reads allocations made
by anyone back. ``capacity`` is the allocator's consumed-capacity rule. ``cel`` evaluates device selectors
in Kubernetes' CEL environment with cel-python: ``cel_types`` (Quantity, Semver) and ``cel_library`` (the
Kubernetes and cel-go libraries selectors call) are what it adds to the language, ``cel_tree`` and
``cel_check`` what it checks and bounds before anything runs.
"""
