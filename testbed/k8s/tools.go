//go:build tools

// Package tools pins the Kubernetes control-plane commands the kubecell testbed builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
