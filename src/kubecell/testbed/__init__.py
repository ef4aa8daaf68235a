"""A real Kubernetes control plane on loopback, for tests, benchmarks and demos.

kube-apiserver, kube-controller-manager and kube-scheduler are built from the ``k8s.io/kubernetes`` Go module
and etcd from ``go.etcd.io/etcd/server/v3`` (the Go modules are in the repository's ``testbed/`` directory),
cached per version outside the repository, and started as processes on 127.0.0.1. Nodes are Node objects
generated from the simulator's cluster descriptions and kept Ready by a small fake kubelet; the process
kubelet runs the pods of the nodes it is given as real host processes, and ``replay`` drives a trace through
the whole stack. Only tests, benchmarks and the CLI import this package. Nothing here is a mock: every
object kubecell writes goes through the real API server's validation, admission, RBAC and watch machinery.
"""
