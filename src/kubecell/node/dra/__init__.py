"""The node agent as a Kubernetes DRA driver, ``gpu.kubecell.io`` (``resource.k8s.io/v1``).

With ``kubecell node-agent --dra`` the agent publishes the node's healthy GPUs and MIG instances as a
ResourceSlice (:mod:`.slices` says what a slice holds, :mod:`.publisher` keeps it equal to the inventory),
so any DRA-aware scheduler, the stock kube-scheduler included, can allocate ResourceClaims on them; and
it serves the kubelet's DRA plugin API (:mod:`.plugin`: registration and ``NodePrepareResources``), which
turns each allocated claim into a CDI spec (:mod:`.cdi`) carrying the very environment the device plugin
path gives a container, remembered in a checkpoint (:mod:`.prepared`) across agent restarts.

The names the scheduler side shares (driver, attributes, capacities, DeviceClasses) are in
:mod:`kubecell.kube.dra_names`.
"""
