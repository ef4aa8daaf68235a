//go:build tools

// Package tools pins etcd for the kubecell testbed. The server module's root is a main package
// (which cannot be imported), so its etcdmain package keeps the requirement; `go build
// go.etcd.io/etcd/server/v3` then builds the etcd binary from the same module graph.
package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"
