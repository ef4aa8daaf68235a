"""The node agent: GPU inventory, the kubelet device plugin, isolation."""
