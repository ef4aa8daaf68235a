//go:build tools

// Package tools pins the node-side Kubernetes commands the kubecell testbed builds: the kubelet,
// run against the fake CRI runtime in ./cmd/fakecri for the real-kubelet device-plugin tests.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
