// Command fakecri serves the fake remote CRI runtime and image services that ship with
// k8s.io/cri-client (the ones kubemark's hollow node uses) on one Unix socket, so that a real
// kubelet can admit and "run" pods without containerd, CRI-O or runc. Nothing is executed:
// sandboxes and containers are entries in memory.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	fakeremote "k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "the socket to serve, e.g. unix:///tmp/fakecri.sock")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --endpoint is required")
		os.Exit(2)
	}
	runtime := fakeremote.NewFakeRemoteRuntime()
	// A pulled image gets this size; with the default 0 the kubelet refuses to start a container from an
	// image that was already present ("ImageInspectError: Id or size of image ... is not set").
	runtime.ImageService.SetFakeImageSize(1 << 20)
	if err := runtime.Start(*endpoint); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("fakecri: serving %s\n", *endpoint)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	runtime.Stop()
}
