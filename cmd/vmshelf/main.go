// Command vmshelf is the edge service that takes QCOW2 uploads from the
// boxes of a mesh and serves them to KubeVirt's importers. This package only
// parses flags and wires the packages together; the logic lives in them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `vmshelf — QCOW2 image gateway and VM market edge

usage:
  vmshelf serve [flags]                     run the data plane, control plane and metrics
  vmshelf tenant add NAME [--sharing] [--in-mesh] [--hosts-vms] [--appliance NODE] [--stripe-account ID]
  vmshelf tenant list
  vmshelf tenant set NAME [--sharing=BOOL] [--in-mesh=BOOL] [--hosts-vms=BOOL] [--appliance NODE] [--stripe-account ID]
  vmshelf tenant token NAME                 rotate the tenant's token and print the new one once
  vmshelf fetch-url UPLOAD_ID [--ttl 1h]    mint a fetch capability and print its URL once
  vmshelf upload --control URL --token-file F --name NAME [--efi] FILE   check, then upload resumably with progress
  vmshelf check FILE [--max-virtual-gib N]  the gateway's QCOW2 checks, offline (exit 0 good, 1 bad, 2 unreadable)
  vmshelf quarantine list                   image files start-up set aside because no record named them
  vmshelf quarantine rm UPLOAD_ID...        delete quarantined image files (only these, only on request)

Every flag can also come from the environment as VMSHELF_<FLAG> (upper case,
"-" as "_"). "vmshelf COMMAND -h" lists a command's flags.
`

// usageError is a mistake in the command line: exit code 2, one line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("a command is needed")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "tenant":
		return tenant(ctx, args[1:], stdout, stderr)
	case "fetch-url":
		return fetchURL(ctx, args[1:], stdout, stderr)
	case "upload":
		return upload(ctx, args[1:], stdout, stderr)
	case "check":
		return check(ctx, args[1:], stdout, stderr)
	case "quarantine":
		return quarantine(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usagef("unknown command %q", args[0])
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, errHelp) {
		return 0
	}
	if errors.Is(err, errRefused) { // check printed its verdict line already
		return 1
	}
	fmt.Fprintln(stderr, "vmshelf:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	// A command with exit codes of its own (upload's 3: resumable).
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}
