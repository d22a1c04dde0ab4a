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
	// The API server, etcd's client and KubeVirt's code write their logs
	// to the process's stderr: they go to the log file, so that the
	// terminal keeps the newcomer's steps. The demo's own failure still
	// reaches the terminal, through a copy of the original stderr.
	terminal, err := divertStderr(log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// A second Ctrl-C is not caught: it ends the process at once.
		<-ctx.Done()
		stop()
	}()
	err = kubetest.RunDemo(ctx, kubetest.DemoConfig{Vmshelf: abs, Out: os.Stdout, Log: log})
	if err != nil {
		fmt.Fprintf(terminal, "demo: %v (the log: %s)\n", err, *logPath)
		os.Exit(1)
	}
	fmt.Println("Stopped: nothing of the demo runs any more.")
}

// divertStderr points the process's stderr (descriptor 2) at log and
// returns the terminal's stderr as it was.
func divertStderr(log *os.File) (*os.File, error) {
	fd, err := syscall.Dup(int(os.Stderr.Fd()))
	if err != nil {
		return nil, fmt.Errorf("keeping stderr: %w", err)
	}
	if err := syscall.Dup3(int(log.Fd()), int(os.Stderr.Fd()), 0); err != nil {
		return nil, fmt.Errorf("stderr to the log: %w", err)
	}
	return os.NewFile(uintptr(fd), "stderr"), nil
}
