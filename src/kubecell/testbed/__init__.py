"""A real Kubernetes control plane on loopback, for tests, benchmarks and demos.

kube-apiserver and kube-scheduler are built from the ``k8s.io/kubernetes`` Go module and etcd from
``go.etcd.io/etcd/server/v3`` (the Go modules are in the repository's ``testbed/`` directory), cached
per version outside the repository, and started as processes on 127.0.0.1. Nodes are Node objects
generated from the simulator's cluster descriptions and kept Ready by a small fake kubelet. Nothing
here is a mock: every object kubecell writes goes through the real API server's validation,
admission, RBAC and watch machinery.
"""
