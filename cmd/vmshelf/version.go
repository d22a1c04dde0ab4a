package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// versionHelp is "vmshelf version -h".
var versionHelp = cli.Doc{
	Summary: "print the version, commit and Go version of this binary",
	About: `Prints what this binary was built from, from the build information the Go toolchain ` +
		`embeds: the module version, the VCS commit and its time, and the Go version and platform. ` +
		`A build from a git checkout (make build) has the version of its commit: its tag, or else a ` +
		`pseudo-version like v0.0.0-20260102030405-0123456789ab, with "+dirty" and "(modified)" ` +
		`when the tree had changes not committed. A build without VCS information (go run, go ` +
		`build -buildvcs=false, a tree that is no checkout) prints "(devel)" and "commit unknown". ` +
		`"vmshelf --version" is the same.`,
	Exits: []string{"0  printed", "2  a usage error (an argument or flag)"},
}

// version is "vmshelf version".
func version(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("version", versionHelp)
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("version takes no arguments, got %q", fs.Arg(0))
	}
	bi, ok := debug.ReadBuildInfo()
	_, err := io.WriteString(stdout, versionText(bi, ok))
	return err
}

// versionText is version's output for the build information bi (ok:
// the binary has any).
//
//	vmshelf v0.0.0-20260102030405-0123456789ab+dirty
//	commit 0123456789abcdef0123456789abcdef01234567 (modified), 2026-01-02T03:04:05Z
//	go1.26.8 linux/amd64
func versionText(bi *debug.BuildInfo, ok bool) string {
	ver, commit, goVersion := "(devel)", "commit unknown", runtime.Version()
	if ok {
		if bi.Main.Version != "" {
			ver = bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		vcs := map[string]string{}
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
		if rev := vcs["vcs.revision"]; rev != "" {
			commit = "commit " + rev
			if vcs["vcs.modified"] == "true" {
				commit += " (modified)"
			}
			if t := vcs["vcs.time"]; t != "" {
				commit += ", " + t
			}
		}
	}
	return fmt.Sprintf("vmshelf %s\n%s\n%s %s/%s\n", ver, commit, goVersion, runtime.GOOS, runtime.GOARCH)
}
