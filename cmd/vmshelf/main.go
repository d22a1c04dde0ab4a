// Command vmshelf is the edge service that takes QCOW2 uploads from the
// boxes of a mesh and serves them to KubeVirt's importers. This package only
// parses flags and wires the packages together; the logic lives in them.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// topHelp is "vmshelf -h": what vmshelf is; the commands follow it.
var topHelp = cli.Doc{
	Args:    "COMMAND [arguments] [flags]",
	Summary: "QCOW2 image gateway and VM market edge",
	About: `The edge service of a mesh of home servers (boxes): boxes upload QCOW2 disk images, ` +
		`KubeVirt's importers fetch them, and boxes sell VM replicas to each other on a market ` +
		`paid through Stripe, which the edge runs on KubeVirt.

Every flag can also come from the environment as VMSHELF_<FLAG> (upper case, "-" as "_"); ` +
		`a flag on the command line wins.`,
	Exits: []string{
		"0  done (each command's help says more)",
		"1  failed; the message says why",
		"2  a usage error: an unknown command, a bad flag, value or argument",
	},
}

// commands is the command line: one row per command, in the order the
// help lists them. A row's doc is the one its flag set shows on -h.
var commands = []cli.Command{
	{Name: "serve", Doc: serveHelp, Run: serve, OwnEnvWarning: true}, // in its start-up log
	{Name: "tenant", Doc: tenantHelp, Sub: tenantCommands},
	{Name: "fetch-url", Doc: fetchURLHelp, Run: fetchURL},
	{Name: "upload", Doc: uploadHelp, Run: upload},
	{Name: "check", Doc: checkHelp, Run: check},
	{Name: "images", Doc: imagesHelp, Run: images},
	{Name: "rm", Doc: rmHelp, Run: rm},
	{Name: "cancel", Doc: cancelHelp, Run: cancel},
	{Name: "orders", Doc: ordersHelp, Sub: ordersCommands},
	{Name: "quarantine", Doc: quarantineHelp, Sub: quarantineCommands},
	{Name: "version", Doc: versionHelp, Run: version},
}

// usagef is a usage error (exit code 2) of one line.
func usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

// newFlagSet is the flag set of "vmshelf NAME", whose -h shows doc.
func newFlagSet(name string, doc cli.Doc) *flag.FlagSet { return cli.NewFlagSet("vmshelf "+name, doc) }

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
	return cli.Run(ctx, "vmshelf", topHelp, commands, args, stdout, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if errors.Is(err, errRefused) { // check printed its verdict line already
		return 1
	}
	return cli.ExitCode("vmshelf", err, stderr)
}
