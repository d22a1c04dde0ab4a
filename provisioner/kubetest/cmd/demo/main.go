// Command demo runs a buyer's whole journey on this machine, for a
// newcomer at a browser: `make demo` builds vmshelf and runs it (as root:
// libvirt's system instance and the guest's build need it). What runs,
// and what to click, is in kubetest.RunDemo; Ctrl-C stops it all.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/vmshelf/vmshelf/provisioner/kubetest"
)

func main() {
	bin := flag.String("vmshelf", "../../bin/vmshelf", "the vmshelf binary to serve with (make demo builds it)")
	logPath := flag.String("log", "../../bin/demo.log", "where the cluster's, the node's and serve's logs go")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: the vmshelf binary: %v (make build makes it)\n", err)
		os.Exit(2)
	}
	log, err := os.Create(*logPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
	defer log.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// A second Ctrl-C is not caught: it ends the process at once.
		<-ctx.Done()
		stop()
	}()
	err = kubetest.RunDemo(ctx, kubetest.DemoConfig{Vmshelf: abs, Out: os.Stdout, Log: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("Stopped: nothing of the demo runs any more.")
}
