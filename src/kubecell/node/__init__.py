"""The node agent: GPU inventory, the kubelet device plugin, isolation (MPS, MIG, accounting). It talks to the
API server through ``kubecell.kube`` only and imports no other driver."""
