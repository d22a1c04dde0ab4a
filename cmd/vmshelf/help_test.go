package main

// The command line's help and its usage errors, against the built binary:
// every command answers -h with its golden text, every flag and variable is
// in it, and every mistake is one line naming the form wanted.

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vmshelf/vmshelf/internal/cli"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/help/*.golden from the binary's -h output")

// helpPaths are the command lines that answer -h, from the commands table
// itself: a command added there is in every test below (and fails
// TestHelp until its golden file is written with -update). nil is
// "vmshelf" alone.
func helpPaths() (paths [][]string) {
	paths = append(paths, nil)
	var walk func(prefix []string, cmds []cli.Command)
	walk = func(prefix []string, cmds []cli.Command) {
		for _, c := range cmds {
			p := append(prefix[:len(prefix):len(prefix)], c.Name)
			switch {
			case c.Sub != nil:
				paths = append(paths, p)
				walk(p, c.Sub)
			case c.Run != nil: // a row whose command is not built yet has no help to show
				paths = append(paths, p)
			}
		}
	}
	walk(nil, commands)
	return paths
}

// goldenName is the file of a command's help: testdata/help/tenant-add.golden.
func goldenName(path []string) string {
	if len(path) == 0 {
		return "vmshelf.golden"
	}
	return strings.Join(path, "-") + ".golden"
}

// TestHelp: "vmshelf PATH -h" prints the golden help on stdout, nothing on
// stderr, exit 0; --help and "vmshelf help PATH" print the same.
func TestHelp(t *testing.T) {
	dir := filepath.Join("testdata", "help")
	if *updateGolden {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for _, path := range helpPaths() {
		name := goldenName(path)
		want[name] = true
		t.Run(strings.TrimSuffix(name, ".golden"), func(t *testing.T) {
			r := vmshelf(t, append(path, "-h")...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
			}
			file := filepath.Join(dir, name)
			if *updateGolden {
				if err := os.WriteFile(file, []byte(r.stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			golden, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (write it with: go test ./cmd/vmshelf -run TestHelp -update)", err)
			}
			if r.stdout != string(golden) {
				t.Errorf("%s -h differs from %s (go test ./cmd/vmshelf -run TestHelp -update rewrites it):\n%s",
					strings.Join(append([]string{"vmshelf"}, path...), " "), file, r.stdout)
			}
			for i, l := range strings.Split(r.stdout, "\n") {
				if n := utf8.RuneCountInString(l); n > cli.Width {
					t.Errorf("line %d has %d columns, over %d: %q", i+1, n, cli.Width, l)
				}
			}
			for _, other := range [][]string{append(path, "--help"), append([]string{"help"}, path...)} {
				if o := vmshelf(t, other...); o.code != 0 || o.stdout != r.stdout {
					t.Errorf("vmshelf %s: exit %d, and its output differs from -h's:\n%s", strings.Join(other, " "), o.code, o.stdout)
				}
			}
		})
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !want[filepath.Base(f)] {
			t.Errorf("%s is the help of no command; remove it", f)
		}
	}
}

// TestHelpNamesEveryFlag walks the flag set of each command (in process:
// -h returns before a command does anything) and finds each flag in the
// binary's help with its VMSHELF_ variable on the same line, and every
// variable serve reads itself in serve's help.
func TestHelpNamesEveryFlag(t *testing.T) {
	for _, path := range helpPaths() {
		err := cli.Dispatch(context.Background(), "vmshelf", topHelp, commands, append(path, "-h"), io.Discard, io.Discard)
		var h cli.HelpShown
		if !errors.As(err, &h) {
			t.Fatalf("vmshelf %v -h: %v, want its help", path, err)
		}
		if h.Flags == nil { // a group: no flags of its own
			continue
		}
		help := vmshelf(t, append(path, "-h")...).stdout
		h.Flags.VisitAll(func(f *flag.Flag) {
			env := "VMSHELF_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
			line := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(f.Name) + `\b.*$`).FindString(help)
			if line == "" || !strings.Contains(line, env) {
				t.Errorf("vmshelf %s -h: no line for --%s naming %s:\n%s", strings.Join(path, " "), f.Name, env, help)
			}
		})
	}

	src, err := os.ReadFile("serve.go")
	if err != nil {
		t.Fatal(err)
	}
	help := vmshelf(t, "serve", "-h").stdout
	reads := regexp.MustCompile(`(Getenv|LookupEnv|secretFromEnv)\("([A-Z_]+)"\)`).FindAllStringSubmatch(string(src), -1)
	if len(reads) == 0 {
		t.Fatal("found no variable serve.go reads: the pattern is stale")
	}
	for _, m := range reads {
		names := []string{m[2]}
		if m[1] == "secretFromEnv" {
			names = append(names, m[2]+"_FILE")
		}
		for _, n := range names {
			if !regexp.MustCompile(`(?m)^  .*\b` + n + `\b`).MatchString(help) {
				t.Errorf("serve reads %s, but serve -h does not list it under environment:\n%s", n, help)
			}
		}
	}
}

// TestHelpUsageErrors: a mistake is exit 2 and one line on stderr that says
// what was wanted, never the flag list; a missing or unknown command shows
// its group's help first.
func TestHelpUsageErrors(t *testing.T) {
	const id = "0123456789abcdef01234567"
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		group []string // the help shown before the line; nil: the line alone
		want  string
	}{
		{name: "duration", args: []string{"serve", "--idle-timeout", "5"},
			want: `--idle-timeout "5": needs a duration like 60s or 2m`},
		{name: "duration of fetch-url", args: []string{"fetch-url", id, "--ttl=5"},
			want: `--ttl "5": needs a duration like 60s or 2m`},
		{name: "int", args: []string{"serve", "--max-transfers", "many"},
			want: `--max-transfers "many": needs a whole number like 4`},
		{name: "float", args: []string{"check", "disk.qcow2", "--max-virtual-gib", "big"},
			want: `--max-virtual-gib "big": needs a number like 32 or 0.25`},
		{name: "bool", args: []string{"tenant", "add", "box", "--sharing=maybe"},
			want: `--sharing "maybe": needs true or false`},
		{name: "upload int", args: []string{"upload", "--retries", "1.5", "disk.qcow2"},
			want: `--retries "1.5": needs a whole number like 4`},
		{name: "unknown flag", args: []string{"serve", "--foo"},
			want: `unknown flag --foo; see vmshelf serve -h`},
		{name: "unknown flag with a value", args: []string{"tenant", "set", "box", "-colour=red"},
			want: `unknown flag --colour; see vmshelf tenant set -h`},
		{name: "fetch-url ttl of years", args: []string{"fetch-url", id, "--ttl", "100000h"},
			want: `--ttl 100000h0m0s is longer than 744h (31 days), the longest a fetch URL may work: an order's month`},
		{name: "fetch-url ttl a second over", args: []string{"fetch-url", id, "--ttl", "744h1s"},
			want: `--ttl 744h0m1s is longer than 744h (31 days), the longest a fetch URL may work: an order's month`},
		{name: "flag without its value", args: []string{"fetch-url", id, "--ttl"},
			want: `--ttl needs a value, a duration like 60s or 2m; see vmshelf fetch-url -h`},
		{name: "variable duration", args: []string{"serve"}, env: []string{"VMSHELF_IDLE_TIMEOUT=5"},
			want: `VMSHELF_IDLE_TIMEOUT="5": needs a duration like 60s or 2m`},
		{name: "variable int", args: []string{"serve"}, env: []string{"VMSHELF_MAX_TRANSFERS=zero"},
			want: `VMSHELF_MAX_TRANSFERS="zero": needs a whole number like 4`},
		{name: "variable bool", args: []string{"tenant", "add", "box"}, env: []string{"VMSHELF_SHARING=maybe"},
			want: `VMSHELF_SHARING="maybe": needs true or false`},
		{name: "no NAME", args: []string{"tenant", "add"},
			want: `tenant add needs a NAME; see vmshelf tenant add -h`},
		{name: "version argument", args: []string{"version", "extra"},
			want: `version takes no arguments, got "extra"`},
		{name: "no command", args: nil, group: []string{},
			want: `a command is needed`},
		{name: "unknown command", args: []string{"frobnicate"}, group: []string{},
			want: `unknown command "frobnicate"`},
		{name: "help of an unknown command", args: []string{"help", "frobnicate"}, group: []string{},
			want: `unknown command "frobnicate"`},
		{name: "tenant alone", args: []string{"tenant"}, group: []string{"tenant"},
			want: `tenant needs a command: add, list, set, token or rm`},
		{name: "unknown tenant command", args: []string{"tenant", "bogus"}, group: []string{"tenant"},
			want: `unknown tenant command "bogus"`},
		{name: "unknown quarantine command", args: []string{"quarantine", "bogus"}, group: []string{"quarantine"},
			want: `unknown quarantine command "bogus"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if len(args) > 0 && args[0] == "serve" {
				// Should the mistake be missed, serve starts: on ports and a
				// data dir of this test's, and for a bounded time.
				args = append(append([]string{}, args...), "--data-dir", filepath.Join(t.TempDir(), "data"),
					"--data-addr", freeAddr(t), "--control-addr", freeAddr(t))
			}
			r := runWithin(t, 10*time.Second, tc.env, binPath, args...)
			want := "vmshelf: " + tc.want + "\n"
			if tc.group != nil {
				want = vmshelf(t, append(tc.group, "-h")...).stdout + want
			}
			if r.code != 2 || r.stdout != "" || r.stderr != want {
				t.Errorf("vmshelf %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2, no stdout, stderr:\n%s",
					strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, want)
			}
		})
	}
}

// TestHelpVersion: version and --version print the build's version,
// commit and Go version; without VCS information they say so.
func TestHelpVersion(t *testing.T) {
	r := vmshelf(t, "version")
	shape := regexp.MustCompile(`^vmshelf \S+\ncommit (unknown|[0-9a-f]{40}( \(modified\))?(, \S+)?)\ngo1\.\S+ \w+/\w+\n$`)
	if r.code != 0 || r.stderr != "" || !shape.MatchString(r.stdout) {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want exit 0 and three lines like %s", r.code, r.stdout, r.stderr, shape)
	}
	if o := vmshelf(t, "--version"); o.code != 0 || o.stdout != r.stdout {
		t.Errorf("--version: exit %d, %q; want what version prints", o.code, o.stdout)
	}

	for _, tc := range []struct {
		name  string
		bi    *debug.BuildInfo
		ok    bool
		lines []string // the first two; the third is the Go version and platform
	}{
		{"no build information", nil, false, []string{"vmshelf (devel)", "commit unknown"}},
		{"a work tree without VCS information", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, true,
			[]string{"vmshelf (devel)", "commit unknown"}},
		{"a modified work tree", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20260102030405-0123456789ab+dirty"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}, true,
			[]string{"vmshelf v0.0.0-20260102030405-0123456789ab+dirty", "commit 0123456789abcdef0123456789abcdef01234567 (modified), 2026-01-02T03:04:05Z"}},
		{"a clean commit", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.modified", Value: "false"}}}, true,
			[]string{"vmshelf v1.2.3", "commit 0123456789abcdef0123456789abcdef01234567"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Split(strings.TrimSuffix(versionText(tc.bi, tc.ok), "\n"), "\n")
			if len(got) != 3 || got[0] != tc.lines[0] || got[1] != tc.lines[1] || !strings.HasPrefix(got[2], "go1.") {
				t.Errorf("got %q, want %q and a Go version line", got, tc.lines)
			}
		})
	}
}

// TestHelpReadmeCheck runs README's qemu-img line and 'vmshelf check' on
// the image it makes: the verdict line is README's example, word for word.
func TestHelpReadmeCheck(t *testing.T) {
	needTool(t, "qemu-img")
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`vmshelf check FILE`(?s:.*?)`(ok: [^`]*)`").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no example of `vmshelf check FILE`'s ok line")
	}
	example := strings.Join(strings.Fields(string(m[1])), " ")
	var create string
	for _, b := range readmeBlocks(t, "## Walk-through with curl") {
		for _, l := range strings.Split(b, "\n") {
			if strings.HasPrefix(l, "qemu-img create ") {
				create = l
			}
		}
	}
	if !strings.HasSuffix(example, " — scratch/disk.qcow2") || !strings.HasSuffix(create, " scratch/disk.qcow2 1G") {
		t.Fatalf("README's check example %q or its qemu-img line %q no longer names scratch/disk.qcow2", example, create)
	}
	r := runWithin(t, 30*time.Second, nil, "sh", "-c", `cd "$1" && mkdir scratch && `+create+` >/dev/null && "$2" check scratch/disk.qcow2`,
		"sh", t.TempDir(), binPath)
	if r.code != 0 || strings.TrimSuffix(r.stdout, "\n") != example {
		t.Errorf("README's %q then check: exit %d, %q (stderr %q); README says %q", create, r.code, r.stdout, r.stderr, example)
	}
}
