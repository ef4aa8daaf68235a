//go:build tools

// Package tools pins the Kubernetes commands the kubecell testbed builds: the control plane
// (kube-apiserver, kube-scheduler, kube-controller-manager), and kubectl (same release) for the deploy
// tests.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
