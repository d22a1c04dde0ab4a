package repotest

// Tests of .ci/deps and `make test` on machines that lack the tools the
// tests use: make test stops at once naming them and the commands that
// install them, or installs them and goes on; it never runs the tests
// with tools missing, where they would skip. The machines are fakes: a
// PATH of a few real tools plus stand-ins for apt-get, npm and go that
// record how they were called and "install" by dropping stub commands
// into that PATH.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
	"github.com/vmshelf/vmshelf/internal/testkit/traefiktest"
)

// debian is .ci/deps's list of Debian packages, in its install order, with
// the commands each brings. qemu-block-extra brings qemu-img's http driver,
// which the fake qemu-img finds as a marker file beside it.
var debian = []struct {
	pkg  string
	cmds []string
}{
	{"qemu-utils", []string{"qemu-img", "qemu-io"}},
	{"qemu-block-extra", []string{".qemu-block-extra"}},
	{"qemu-system-x86", []string{"qemu-system-x86_64"}},
	{"nbdkit", []string{"nbdkit"}},
	{"curl", []string{"curl"}},
	{"strace", []string{"strace"}},
	{"e2fsprogs", []string{"mkfs.ext4"}},
	{"prometheus", []string{"prometheus", "promtool"}},
	{"nodejs", []string{"node"}},
	{"npm", []string{"npm"}},
	{"chromium", []string{"chromium"}},
	{"nginx", []string{"nginx"}},
	{"wrk", []string{"wrk"}},
	{"postgresql", []string{"initdb", "pg_ctl"}},
	{"skopeo", []string{"skopeo"}},
	{"umoci", []string{"umoci"}},
	{"libvirt-daemon-system", []string{"libvirtd", "virtlogd"}},
	{"libvirt-clients", []string{"virsh"}},
	{"ovmf", []string{"/usr/share/OVMF/OVMF_CODE.fd"}},
	{"xorriso", []string{"xorrisofs"}},
	{"mmdebstrap", []string{"mmdebstrap"}},
	{"fdisk", []string{"sfdisk"}},
	{"dosfstools", []string{"mkfs.vfat"}},
	{"mtools", []string{"mmd", "mcopy"}},
	{"grub-pc-bin", []string{"/usr/lib/grub/i386-pc/boot.img", "grub-mkimage"}},
	{"grub-efi-amd64-bin", []string{"/usr/lib/grub/x86_64-efi/linux.mod", "grub-mkstandalone"}},
}

// missingNames is how .ci/deps names each thing when all are missing.
var missingNames = []string{"qemu-img", "qemu-io", "qemu-img's http driver", "qemu-system-x86_64", "nbdkit", "curl", "strace",
	"mkfs.ext4", "prometheus", "promtool", "node", "npm", "chromium", "nginx", "wrk", "initdb", "pg_ctl", "skopeo", "umoci",
	"libvirtd", "virtlogd", "virsh", "/usr/share/OVMF/OVMF_CODE.fd", "xorrisofs", "mmdebstrap", "sfdisk", "mkfs.vfat", "mmd", "mcopy",
	"/usr/lib/grub/i386-pc", "grub-mkimage", "/usr/lib/grub/x86_64-efi", "grub-mkstandalone", "stripe-mock", "tusd", "versitygw", traefiktest.Binary}

// tusdInstall is how .ci/deps installs the bench's tusd (bench/README.md
// names the same version).
const tusdInstall = "go install github.com/tus/tusd/v2/cmd/tusd@v2.9.1"

// versitygwInstall is how .ci/deps installs the S3 tests' server
// (imagestore/s3/s3test.Install says the same).
const versitygwInstall = s3test.Install

// traefikBuild is how .ci/deps builds Traefik, as the fake go records it:
// the module downloaded, then built where the module cache holds it
// (MODULE) into Go's bin directory (GOBIN), named by its version.
var traefikBuild = []string{
	"go mod download -json github.com/traefik/traefik/v3@" + traefiktest.Version,
	"go -C MODULE build -trimpath -o GOBIN/" + traefiktest.Binary + " ./cmd/traefik",
}

// npmDirs are the folders .ci/deps runs npm ci in.
var npmDirs = []string{"cmd/vmshelf/testdata/tusjs", "cmd/vmshelf/testdata/browser"}

const refusal = "E: Unable to correct problems, you have held broken packages."

func aptInstall(pkg string) string {
	return "apt-get install -y --no-install-recommends --no-remove " + pkg
}
func npmCI(dir string) string {
	return "npm ci --prefix " + dir + " --no-audit --no-fund --loglevel=error"
}

// sudo is what .ci/deps puts before the apt-get commands it prints: nothing
// for root.
func sudo() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "sudo "
}

// sudoRun is what .ci/deps puts before the apt-get commands it runs.
func sudoRun() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "sudo -n "
}

// machine is a fake machine for .ci/deps: the script and the npm lock
// files in a tree of their own, and a PATH directory (bin) with bash and
// the fakes.
type machine struct {
	tree, bin, log string
}

// setup says what the fake machine has and what its apt-get does.
type setup struct {
	has             []string // Debian packages installed at the start
	node            string   // what node --version says (default v20.20.2)
	nodeElsewhere   bool     // node and npm there from the start, not from Debian
	nodejsBringsNpm bool     // the nodejs package brings npm (NodeSource's does)
	refuse          []string // packages apt-get refuses, exit 100
	npmDone         bool     // node_modules installed and newer than the lock files
	goTools         bool     // stripe-mock, tusd, versitygw and Traefik on PATH
}

// stubs writes the commands pkg brings into dir.
func (m *machine) stubs(t *testing.T, dir, pkg string, s setup) {
	t.Helper()
	for _, p := range debian {
		if p.pkg != pkg {
			continue
		}
		cmds := p.cmds
		if pkg == "nodejs" && s.nodejsBringsNpm {
			cmds = append(cmds, "npm")
		}
		for _, c := range cmds {
			m.stub(t, dir, c, s)
		}
	}
}

func (m *machine) stub(t *testing.T, dir, cmd string, s setup) {
	t.Helper()
	p := filepath.Join(dir, cmd)
	switch {
	case strings.HasPrefix(cmd, "/"):
		// A file, not a command: below root, where VMSHELF_FILES_ROOT
		// (childEnv) has .ci/deps look.
		p = filepath.Join(dir, "root", cmd)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	switch cmd {
	case ".qemu-block-extra":
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	case "qemu-img":
		// What the real one answers to .ci/deps's probe, with and without
		// its http driver.
		writeScript(t, p, fmt.Sprintf(`if [[ -e %q ]]; then echo "qemu-img: Could not open 'json:...': CURL: Error opening file: Failed to connect" >&2
else echo "qemu-img: Could not open 'json:...': Unknown protocol 'http'" >&2; fi
exit 1
`, filepath.Join(m.bin, ".qemu-block-extra")))
	case "node":
		v := s.node
		if v == "" {
			v = "v20.20.2"
		}
		writeScript(t, p, "[[ $1 == --version ]] && echo "+v+"\n")
	case "npm":
		writeScript(t, p, fmt.Sprintf(`case $1 in --version) echo 10.9.2; exit 0;; ci) ;; *) exit 1;; esac
echo "npm $*" >>%q
while (($#)); do [[ $1 == --prefix ]] && dir=$2; shift; done
%s -p "$dir/node_modules" && echo '{}' >"$dir/node_modules/.package-lock.json"
`, m.log, needTool(t, "mkdir")))
	default:
		writeScript(t, p, "exit 0\n")
	}
}

// newMachine lays out a fake machine as s says.
func newMachine(t *testing.T, s setup) *machine {
	t.Helper()
	root := repoRoot(t)
	m := &machine{tree: t.TempDir(), bin: pathDir(t, "bash")}
	m.log = filepath.Join(t.TempDir(), "calls")
	copyFile(t, filepath.Join(root, ".ci", "deps"), filepath.Join(m.tree, ".ci", "deps"))
	for _, d := range npmDirs {
		for _, f := range []string{"package.json", "package-lock.json"} {
			copyFile(t, filepath.Join(root, d, f), filepath.Join(m.tree, d, f))
		}
		if s.npmDone {
			copyFile(t, filepath.Join(root, d, "package-lock.json"), filepath.Join(m.tree, d, "node_modules", ".package-lock.json"))
		}
	}
	for _, pkg := range s.has {
		m.stubs(t, m.bin, pkg, s)
	}
	if s.nodeElsewhere {
		m.stub(t, m.bin, "node", s)
		m.stub(t, m.bin, "npm", s)
	}
	if s.goTools {
		m.stub(t, m.bin, "stripe-mock", s)
		m.stub(t, m.bin, "tusd", s)
		m.stub(t, m.bin, "versitygw", s)
		m.stub(t, m.bin, traefiktest.Binary, s)
	}

	// The packages apt-get has, each a folder of the stubs it installs.
	pkgs := t.TempDir()
	for _, p := range debian {
		dir := filepath.Join(pkgs, p.pkg)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		m.stubs(t, dir, p.pkg, s)
	}
	writeScript(t, filepath.Join(m.bin, "apt-get"), fmt.Sprintf(`echo "apt-get $*" >>%[1]q
[[ $1 == update ]] && exit 0
pkg=${!#}
for r in %[2]s; do [[ $pkg == "$r" ]] && { echo %[3]q >&2; exit 100; }; done
[[ -d %[4]q/$pkg ]] || { echo "E: Unable to locate package $pkg" >&2; exit 100; }
echo "Setting up $pkg ..."
%[5]s -a %[4]q/$pkg/. %[6]q/
`, m.log, strings.Join(s.refuse, " "), refusal, pkgs, needTool(t, "cp"), m.bin))
	// go: env answers as go env GOBIN GOPATH does (no GOBIN); install
	// drops a stub named as the package's command (stripe-mock, tusd);
	// mod download -json names a module directory, and a build there
	// drops Traefik's stub where -o says; anything else is not for this
	// test.
	stubs, module := t.TempDir(), t.TempDir()
	m.stub(t, stubs, "stripe-mock", s)
	m.stub(t, stubs, "tusd", s)
	m.stub(t, stubs, "versitygw", s)
	m.stub(t, stubs, traefiktest.Binary, s)
	gopath := filepath.Join(m.tree, "gopath")
	writeScript(t, filepath.Join(m.bin, "go"), fmt.Sprintf(`case $1 in
env) echo; echo %[1]q;;
install) echo "go $*" >>%[2]q; name=${2%%@*}; %[3]s %[4]q/"${name##*/}" %[5]q/;;
mod) [[ $2 == download && $3 == -json ]] || exit 97
  echo "go $*" >>%[2]q; printf '{\n\t"Path": "%%s",\n\t"Dir": "%%s"\n}\n' "${4%%@*}" %[6]q;;
-C) [[ $2 == %[6]q && $3 == build ]] || exit 97
  line="go $*"; line=${line/%[6]q/MODULE}; echo "${line/%[1]q"/bin"/GOBIN}" >>%[2]q
  out=; prev=; for a in "$@"; do [[ $prev == -o ]] && out=$a; prev=$a; done
  %[7]s -p "${out%%/*}" && %[3]s %[4]q/"${out##*/}" "$out";;
*) echo "go $1 is not for this test" >&2; exit 97;;
esac
`, gopath, m.log, needTool(t, "cp"), stubs, m.bin, module, needTool(t, "mkdir")))
	// Not root, .ci/deps goes through sudo -n: this one lets it.
	writeScript(t, filepath.Join(m.bin, "sudo"), `[[ $1 == -n ]] && shift; [[ $1 == true ]] && exit 0; exec "$@"`+"\n")
	return m
}

// calls is what apt-get, npm ci and go install were asked, in order.
func (m *machine) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(m.log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// installs is apt-get update and then one install per package, as .ci/deps
// calls them for pkgs.
func installs(pkgs ...string) []string {
	calls := []string{"apt-get update"}
	for _, p := range pkgs {
		calls = append(calls, aptInstall(p))
	}
	return calls
}

var allPkgs = func() []string {
	var all []string
	for _, p := range debian {
		all = append(all, p.pkg)
	}
	return all
}()

func without(all []string, drop ...string) []string {
	var kept []string
	for _, p := range all {
		if !slices.Contains(drop, p) {
			kept = append(kept, p)
		}
	}
	return kept
}

// TestDepsInstalls: .ci/deps installs each missing Debian package with an
// apt-get of its own (one refused package refuses only itself), skips
// what an earlier install or another source already brought, runs npm ci
// where node_modules is missing and go install for stripe-mock and tusd, then
// checks again: all there is exit 0, anything still missing is exit 1
// naming it and the command that installs it.
func TestDepsInstalls(t *testing.T) {
	goInstall := stripetest.MockInstall
	npmCIs := []string{npmCI(npmDirs[0]), npmCI(npmDirs[1])}
	root := os.Geteuid() == 0
	tests := []struct {
		name    string
		setup   setup
		env     []string
		calls   []string
		ok      bool     // exit 0 (as root; not root, the script asks for root and exits 1)
		says    []string // in its output
		allHere string   // in its output as root, where ok
		notSays []string
	}{
		{
			name:    "nothing there: everything installed, one package at a time",
			calls:   slices.Concat(installs(allPkgs...), npmCIs, slices.Concat([]string{goInstall, tusdInstall, versitygwInstall}, traefikBuild)),
			ok:      true,
			says:    []string{"deps: " + sudoRun() + aptInstall("qemu-block-extra") + "\n"},
			allHere: "deps: everything the tests use is here now\n",
		},
		{
			name:  "apt-get refuses npm: the others are installed all the same",
			setup: setup{refuse: []string{"npm"}},
			// No npm ci without npm; stripe-mock does not need it.
			calls: slices.Concat(installs(allPkgs...), slices.Concat([]string{goInstall, tusdInstall, versitygwInstall}, traefikBuild)),
			says: []string{
				"apt-get install npm failed: " + refusal,
				"  npm: Debian package npm",
				"\n  tus-js-client: cmd/vmshelf/testdata/tusjs/node_modules is missing",
				"\n  playwright-core: cmd/vmshelf/testdata/browser/node_modules is missing",
				"\n  " + sudo() + aptInstall("npm") + "\n",
				"\n  npm ci --prefix cmd/vmshelf/testdata/tusjs --no-audit --no-fund\n",
				"\n  npm ci --prefix cmd/vmshelf/testdata/browser --no-audit --no-fund\n",
				"Debian's npm is refused beside this node (v20.20.2)",
			},
			notSays: []string{"  chromium:", "  nginx:", "  node:", "stripe-mock:", "tusd:", "versitygw:", "\n  " + goInstall + "\n"},
		},
		{
			name:  "Node.js and npm from elsewhere: Debian's nodejs and npm are left alone",
			setup: setup{nodeElsewhere: true},
			calls: slices.Concat(installs(without(allPkgs, "nodejs", "npm")...), npmCIs, slices.Concat([]string{goInstall, tusdInstall, versitygwInstall}, traefikBuild)),
			ok:    true,
		},
		{
			name:  "the nodejs package brings npm: Debian's npm is not installed on top",
			setup: setup{nodejsBringsNpm: true},
			calls: slices.Concat(installs(without(allPkgs, "npm")...), npmCIs, slices.Concat([]string{goInstall, tusdInstall, versitygwInstall}, traefikBuild)),
			ok:    true,
		},
		{
			name:  "some there: only the others are installed",
			setup: setup{has: []string{"qemu-utils", "curl", "strace", "e2fsprogs", "nodejs", "npm"}, npmDone: true, goTools: true},
			calls: installs("qemu-block-extra", "qemu-system-x86", "nbdkit", "prometheus", "chromium", "nginx", "wrk", "postgresql", "skopeo", "umoci",
				"libvirt-daemon-system", "libvirt-clients", "ovmf", "xorriso", "mmdebstrap", "fdisk", "dosfstools", "mtools", "grub-pc-bin", "grub-efi-amd64-bin"),
			ok: true,
		},
		{
			name:  "a node older than playwright-core needs",
			setup: setup{node: "v18.19.0", nodeElsewhere: true},
			calls: slices.Concat(installs(without(allPkgs, "nodejs", "npm")...), npmCIs, slices.Concat([]string{goInstall, tusdInstall, versitygwInstall}, traefikBuild)),
			says:  []string{"node v18.19.0 is older than 20, which playwright-core needs: install Node.js 20 or later"},
		},
		{
			name:    "everything there: nothing asked",
			setup:   setup{has: allPkgs, npmDone: true, goTools: true},
			ok:      true,
			allHere: "deps: everything the tests use is here\n",
		},
		{
			name: "VMSHELF_INSTALL=0: nothing installed, the commands said",
			env:  []string{"VMSHELF_INSTALL=0"},
			says: []string{
				"\n  " + sudo() + "apt-get update\n",
				"\n  " + sudo() + aptInstall(strings.Join(allPkgs, " ")) + "\n",
				"\n  npm ci --prefix cmd/vmshelf/testdata/tusjs --no-audit --no-fund\n",
				"\n  npm ci --prefix cmd/vmshelf/testdata/browser --no-audit --no-fund\n",
				"\n  " + goInstall + "\n",
				"\n  " + tusdInstall + "\n",
				"\n  " + versitygwInstall + "\n",
				"\n  " + traefiktest.Install + "\n",
				"deps: VMSHELF_INSTALL=0: nothing was installed",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine(t, tc.setup)
			r := runIn(t, 30*time.Second, m.tree, childEnv(m.bin, tc.env...), filepath.Join(m.bin, "bash"), ".ci/deps")
			if got := m.calls(t); !slices.Equal(got, tc.calls) {
				t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.calls, "\n  "))
			}
			wantCode := 1
			if tc.ok && root {
				wantCode = 0
			}
			if r.code != wantCode {
				t.Errorf("exit %d, want %d", r.code, wantCode)
			}
			for _, s := range tc.says {
				if !strings.Contains(r.out, s) {
					t.Errorf("output lacks %q", s)
				}
			}
			if tc.ok && root && tc.allHere != "" && !strings.Contains(r.out, tc.allHere) {
				t.Errorf("output lacks %q", tc.allHere)
			}
			for _, s := range tc.notSays {
				if strings.Contains(r.out, s) {
					t.Errorf("output has %q", s)
				}
			}
			if !root && !strings.Contains(r.out, `sudo env "PATH=$PATH:/usr/sbin:/sbin" make test`) {
				t.Errorf("not root, the output does not say to run the tests as root")
			}
			if t.Failed() {
				t.Logf(".ci/deps printed:\n%s", r.out)
			}
		})
	}
}

// goRecorder is a go for PATH that runs the real one for `go env` (what
// .ci/deps asks) and refuses anything else, writing to log what it was
// asked and CI's value, so that a test sees whether make got past
// .ci/deps and with which environment.
func goRecorder(t *testing.T, bin, log string) {
	t.Helper()
	writeScript(t, filepath.Join(bin, "go"), fmt.Sprintf(`[[ $1 == env ]] && exec %q "$@"
echo "go $* CI=${CI-}" >>%q
echo "go $1: not for this test" >&2
exit 97
`, needTool(t, "go"), log))
}

// TestMakeTestStopsWithoutTools is make test, in this repository, on a
// machine that has go, make, bash and git and none of the test's other
// tools, with installing turned off: it must stop within seconds, before
// go vet or go test ran, naming each missing tool and the commands that
// install them.
func TestMakeTestStopsWithoutTools(t *testing.T) {
	root := repoRoot(t)
	bin := pathDir(t, "make", "bash", "sh", "git")
	log := filepath.Join(t.TempDir(), "go-calls")
	goRecorder(t, bin, log)
	// GOPATH of its own: the stripe-mock go install put in this machine's
	// GOPATH/bin is not there.
	env := childEnv(bin, "VMSHELF_INSTALL=0", "GOPATH="+t.TempDir())
	r := runIn(t, 60*time.Second, root, env, filepath.Join(bin, "make"), "test")
	t.Logf("make test: exit %d after %v", r.code, r.elapsed.Round(time.Millisecond))
	if r.code == 0 {
		t.Fatalf("make test passed without its tools:\n%s", r.out)
	}
	if b, err := os.ReadFile(log); err == nil {
		t.Errorf("make test went past the tool check: %s\n%s", b, r.out)
	}
	if r.elapsed > 30*time.Second {
		t.Errorf("make test took %v to stop", r.elapsed)
	}
	for _, name := range missingNames {
		if !strings.Contains(r.out, "\n  "+name+": ") {
			t.Errorf("make test's output does not name %s", name)
		}
	}
	want := []string{
		"\n  " + sudo() + "apt-get update\n",
		"\n  " + sudo() + aptInstall(strings.Join(allPkgs, " ")) + "\n",
		"\n  " + stripetest.MockInstall + "\n",
		"\n  " + tusdInstall + "\n",
		"\n  " + versitygwInstall + "\n",
		"\n  " + traefiktest.Install + "\n",
	}
	// npm ci where this checkout's node_modules is missing or stale (where
	// make test installed it, it is not).
	for _, d := range npmDirs {
		cmd := "\n  npm ci --prefix " + d + " --no-audit --no-fund\n"
		lock, err := os.Stat(filepath.Join(root, d, "package-lock.json"))
		if err != nil {
			t.Fatal(err)
		}
		if done, err := os.Stat(filepath.Join(root, d, "node_modules", ".package-lock.json")); err != nil || lock.ModTime().After(done.ModTime()) {
			want = append(want, cmd)
		} else if strings.Contains(r.out, cmd) {
			t.Errorf("make test asks for %q, but %s/node_modules is up to date", cmd, d)
		}
	}
	for _, w := range want {
		if !strings.Contains(r.out, w) {
			t.Errorf("make test's output lacks %q", w)
		}
	}
	if t.Failed() {
		t.Logf("make test printed:\n%s", r.out)
	}
}

// TestMakeTestChecksThenStrict: on a machine that has everything, make
// test runs .ci/deps first and then the rest under CI=true (a tool still
// missing fails its test), lint's race build first (through
// buildprogress, which says what a cold build does).
func TestMakeTestChecksThenStrict(t *testing.T) {
	if os.Geteuid() != 0 {
		// .ci/deps asks for root: the tests mount file systems.
		if os.Getenv("CI") == "true" {
			t.Fatal("this test runs make test's tool check, which needs root, as CI has")
		}
		t.Skip("runs make test's tool check, which needs root (run the tests as root, as CI does)")
	}
	m := newMachine(t, setup{has: allPkgs, npmDone: true, goTools: true})
	copyFile(t, filepath.Join(repoRoot(t), "Makefile"), filepath.Join(m.tree, "Makefile"))
	for _, tool := range []string{"make", "sh", "git", "find", "gofmt"} {
		if err := os.Symlink(needTool(t, tool), filepath.Join(m.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(t.TempDir(), "go-calls")
	goRecorder(t, m.bin, log)
	r := runIn(t, 60*time.Second, m.tree, childEnv(m.bin), filepath.Join(m.bin, "make"), "test")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("make test never ran go past .ci/deps (exit %d):\n%s", r.code, r.out)
	}
	if got, want := string(b), "go run ./internal/tools/buildprogress go build -race -v ./... CI=true\n"; got != want {
		t.Errorf("after .ci/deps make test ran %q, want %q", got, want)
	}
	deps, vet := strings.Index(r.out, "deps: everything the tests use is here"), strings.Index(r.out, "go run ./internal/tools/buildprogress")
	if deps < 0 || vet < deps {
		t.Errorf(".ci/deps did not run before lint:\n%s", r.out)
	}
}
