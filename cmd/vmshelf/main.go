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

// topHelp is "vmshelf -h": what vmshelf is; the commands follow it.
var topHelp = helpDoc{
	args:    "COMMAND [arguments] [flags]",
	summary: "QCOW2 image gateway and VM market edge",
	about: `The edge service of a mesh of home servers (boxes): boxes upload QCOW2 disk images, ` +
		`KubeVirt's importers fetch them, and boxes sell VM replicas to each other on a market ` +
		`paid through Stripe, which the edge runs on KubeVirt.

Every flag can also come from the environment as VMSHELF_<FLAG> (upper case, "-" as "_"); ` +
		`a flag on the command line wins.`,
	exits: []string{
		"0  done (each command's help says more)",
		"1  failed; the message says why",
		"2  a usage error: an unknown command, a bad flag, value or argument",
	},
}

// commands is the command line: one row per command, in the order the
// help lists them. A row's doc is the one its flag set shows on -h.
var commands = []command{
	{name: "serve", doc: serveHelp, run: serve},
	{name: "tenant", doc: tenantHelp, sub: tenantCommands},
	{name: "fetch-url", doc: fetchURLHelp, run: fetchURL},
	{name: "upload", doc: uploadHelp, run: upload},
	{name: "check", doc: checkHelp, run: check},
	{name: "images", doc: imagesHelp, run: images},
	{name: "rm", doc: rmHelp, run: rm},
	{name: "quarantine", doc: quarantineHelp, sub: quarantineCommands},
	{name: "version", doc: versionHelp, run: version},
}

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
	if len(args) > 0 && args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	err := dispatch(ctx, "vmshelf", topHelp, commands, args, stdout, stderr)
	var h helpShown
	if errors.As(err, &h) {
		_, err = io.WriteString(stdout, h.text)
	}
	return err
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
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
