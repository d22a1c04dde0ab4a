package repotest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// TestReadmeOnCleanClone does what a new user does with README.md: clone
// the repository, `make run` in one terminal, paste every ```sh block into
// another, in README order, and compare what the commands print with what
// the README says they print.
//
// The clone is the working tree as it is: `git clone` of the repository,
// then every file `git ls-files -co --exclude-standard` lists copied over
// it (uncommitted edits are tested too), and nothing else: no bin/, no
// vmshelf-data, no node_modules.
//
// Each block runs literally in the clone's root as one `bash` script with
// `set -eo pipefail` (a failed command, also one in the middle of a pipe,
// stops the block and is reported with its README line). Between its
// commands the test inserts only marker lines (printf of the README line
// to stdout and stderr), so that each command's output is known; the
// commands themselves are the README's. Each block gets a fresh shell, as
// a reader may open a new terminal for it: a block must not rely on
// another block's variables.
//
// What the README starts "in a second terminal" runs in the background as
// the README writes it, in a process group of its own that the test ends
// with SIGTERM (then SIGKILL): `make run`, and the market's block that
// starts stripe-mock and serve (readmeRunServers; the block gets `set -e`
// first, so that a failed `make build` does not go on to start the binary
// an earlier `make run` left). The test waits until the server's addresses
// accept and /readyz answers 200. A block whose prose says "with `make
// run` running" gets `make run` back first. The README's addresses are
// fixed (127.0.0.1:8480, :8481, stripe-mock's :12111, :12112): when one is
// taken the test fails under CI=true and skips loudly elsewhere, naming
// the process that holds it.
//
// Commands not meant to be pasted are skipped by readmeRunSkipped, each
// with its reason; every other command runs, and a new block runs without
// a change here.
//
// # What is checked
//
// The convention for comments the test checks:
//
//   - A comment line starting `# →` names the answer of the command above
//     it (for `VAR=$(…)`, the value the command assigned to VAR). An HTTP
//     status may come first; the first {…} of the comment (it may go on
//     over the following comment lines) is the answer's JSON object: every
//     key it names must be in the answer, with the value written, where
//     "…" is any string (or, inside a string, any text: "http://host/…")
//     and an unquoted … any value; without a trailing `,…` member the
//     answer has exactly the keys named.
//   - A command ending in a literal `echo WORD` (as in `cmp a b && echo
//     identical`) must print WORD as its last line: `set -e` does not stop
//     at a failure in the middle of an && chain, the missing word does.
//   - A comment `# lists "NAME"` on a command's line: its output contains
//     the JSON string "NAME".
//   - JSON after an arrow in a step heading (`# 2. … → 201 {…}`) is
//     refused: it would not be checked; write it as a `# →` line under
//     its command.
//
// And from the README's prose: each server prints where the dev token is
// ("vmshelf-data/dev-token") and never prints the token, nor a
// STRIPE_SECRET_KEY value the README sets.
//
//   - A `# →` comment that starts with an HTTP status and a comma and names
//     no {…} (`# → 204, Upload-Offset: N`) is the last line the command
//     prints, where N is any number and … any text (the tus steps print it
//     with curl's -w).
//   - Whatever a command prints, on stdout or stderr, ends with a newline:
//     an answer without one leaves the reader's prompt glued to it.
//
// And the blocks fail loudly: once the README's sequence has filled the dev
// box's image quota (before the block that lists the images with `vmshelf
// images`), the first walk-through block runs again and must stop at its
// ticket request, with the edge's refusal (reason imageQuota) printed and
// no command after it run.
//
// Not checked, as no command's output shows it: the HTTP statuses before
// a JSON answer (curl prints bodies only); "prints box1's token once", "rotates; prints the new token
// once", "printed once" (fetch-url); "progress on stderr"; the market
// status prose ("the order awaits payment at its checkout_url; the offer
// has 2 replicas free", which TestE2EReadmeMarket checks).
func TestReadmeOnCleanClone(t *testing.T) {
	began := time.Now()
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"bash", "git", "make", "go", "curl"} {
		needTool(t, tool)
	}
	// Named otherwise than their Debian packages (toolPackage is for this
	// package's other tests).
	for _, tool := range []struct{ name, install string }{
		{"qemu-img", "apt-get install qemu-utils"}, {"cmp", "apt-get install diffutils"},
	} {
		if _, err := exec.LookPath(tool.name); err != nil {
			readmeRunMissing(t, tool.name, tool.install, err)
		}
	}
	readmeRunNeedHTTPDriver(t)
	readmeRunNeedStripeMock(t, string(readme))
	blocks := readmeRunParse(t, string(readme)) // bash reads where each command ends
	makeRun := readmeRunPlan(t, blocks)
	for _, addr := range readmeRunAddrs() {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			msg := fmt.Sprintf("README's address %s is taken (%s): the test runs the README's blocks on their own addresses; stop it first", addr, readmeRunHolder(addr))
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip("SKIPPED: " + msg)
		}
		l.Close()
	}

	dir := readmeRunClone(t, root)
	env := readmeRunEnv()
	cloned := time.Since(began)

	var (
		current *readmeRunProc
		servers []*readmeRunProc // every one started, for the log checks
	)
	t.Cleanup(func() {
		if current != nil {
			current.stop(t)
		}
		for _, addr := range readmeRunAddrs() {
			if l, err := net.Listen("tcp", addr); err != nil {
				t.Errorf("%s is still taken after the test stopped its servers (%s)", addr, readmeRunHolder(addr))
			} else {
				l.Close()
			}
		}
	})
	// switchTo stops what runs and starts script as server srv, waiting
	// until it is ready.
	switchTo := func(t *testing.T, script string, srv readmeRunServer) {
		t.Helper()
		if current != nil && current.srv.match == srv.match {
			return
		}
		if current != nil {
			stopping := time.Now()
			current.stop(t)
			t.Logf("%q stopped after %v", current.srv.match, time.Since(stopping).Round(time.Millisecond))
			current = nil
		}
		began := time.Now()
		current = readmeRunStart(t, dir, env, script, srv)
		servers = append(servers, current)
		current.waitReady(t, readmeRunBudget(t, 5*time.Minute))
		t.Logf("%q ready after %v", srv.match, time.Since(began).Round(time.Millisecond))
	}

	var firstReady time.Duration
	for _, b := range blocks {
		if len(b.cmds) > 0 && strings.HasPrefix(b.cmds[0].text, "./bin/vmshelf images ") {
			walk := readmeRunWalkThrough(t, blocks)
			t.Run(fmt.Sprintf("the walk-through at the image quota (README.md:%d)", walk.line), func(t *testing.T) {
				readmeRunAtQuota(t, dir, env, walk)
			})
		}
		t.Run(fmt.Sprintf("%s (README.md:%d)", b.heading, b.line), func(t *testing.T) {
			if srv, ok := readmeRunServerFor(b.firstLine()); ok {
				switchTo(t, "set -e\n"+b.text, srv)
				return
			}
			if b.needsMakeRun {
				switchTo(t, makeRun.text, readmeRunServers[0])
			}
			var pending []readmeRunCmd
			for _, c := range b.cmds {
				if why, ok := readmeRunSkipped[c.bare()]; ok {
					t.Logf("README.md:%d: %q skipped: %s", c.line, c.bare(), why)
					continue
				}
				if srv, ok := readmeRunServerFor(c.bare()); ok {
					readmeRunBlockRun(t, dir, env, pending)
					pending = nil
					switchTo(t, c.text, srv)
					if firstReady == 0 {
						firstReady = time.Since(began)
					}
					continue
				}
				pending = append(pending, c)
			}
			readmeRunBlockRun(t, dir, env, pending)
		})
	}

	// README: "It prints where the dev tenant's token is; the token itself
	// is never printed or logged."
	token, err := os.ReadFile(filepath.Join(dir, "vmshelf-data", "dev-token"))
	if err != nil {
		t.Fatalf("after the README's blocks: %v", err)
	}
	secrets := map[string]string{"the dev token": strings.TrimSpace(string(token))}
	for _, m := range regexp.MustCompile(`STRIPE_SECRET_KEY=(\S+)`).FindAllStringSubmatch(string(readme), -1) {
		secrets["STRIPE_SECRET_KEY"] = m[1]
	}
	for _, s := range servers {
		out := s.out.String()
		if !strings.Contains(out, "vmshelf-data/dev-token") {
			t.Errorf("%q does not say where the dev token is; it printed:\n%s", s.srv.match, readmeRunShow(out))
		}
		for what, v := range secrets {
			if v != "" && strings.Contains(out, v) {
				t.Errorf("%q printed %s", s.srv.match, what)
			}
		}
	}
	t.Logf("the README ran in %v (clone %v, first server ready at %v)",
		time.Since(began).Round(time.Millisecond), cloned.Round(time.Millisecond), firstReady.Round(time.Millisecond))
}

// readmeRunWalkThrough is the first block under "Walk-through with curl".
func readmeRunWalkThrough(t *testing.T, blocks []readmeRunBlock) readmeRunBlock {
	t.Helper()
	for _, b := range blocks {
		if b.heading == "Walk-through with curl" {
			return b
		}
	}
	t.Fatal(`README.md has no block under "## Walk-through with curl"`)
	return readmeRunBlock{}
}

// readmeRunSkipped are the commands of README's blocks that a reader does
// not paste while following it, by their text without a trailing comment,
// each with the reason.
var readmeRunSkipped = map[string]string{
	"make test": "runs every test of the repository, this one included (it would recurse); CI runs it anyway",
}

// readmeRunServer is what the README starts in a terminal of its own and
// keeps running while the next blocks are pasted elsewhere.
type readmeRunServer struct {
	// match is the command (without its trailing comment), or the first
	// line of a block that is started as a whole.
	match string
	// ready are the addresses that accept connections once it is up; the
	// control plane's /readyz must also answer 200.
	ready []string
}

const (
	readmeRunDataAddr    = "127.0.0.1:8480"
	readmeRunControlAddr = "127.0.0.1:8481"
)

// readmeRunServers: the first is `make run`, which a block whose prose
// says "with `make run` running" gets back.
var readmeRunServers = []readmeRunServer{
	{match: "make run", ready: []string{readmeRunDataAddr, readmeRunControlAddr}},
	{match: "# the market: start Stripe's API mock and serve",
		ready: []string{"127.0.0.1:12111", "127.0.0.1:12112", readmeRunDataAddr, readmeRunControlAddr}},
}

func readmeRunServerFor(match string) (readmeRunServer, bool) {
	for _, s := range readmeRunServers {
		if s.match == match {
			return s, true
		}
	}
	return readmeRunServer{}, false
}

// readmeRunAddrs are the addresses of every server, once each.
func readmeRunAddrs() []string {
	var addrs []string
	for _, s := range readmeRunServers {
		for _, a := range s.ready {
			if !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	return addrs
}

// readmeRunBlock is one ```sh block of README.md.
type readmeRunBlock struct {
	line         int    // README line of its first line
	heading      string // the section's heading
	text         string // as written
	needsMakeRun bool   // its prose says "with `make run` running"
	cmds         []readmeRunCmd
}

func (b readmeRunBlock) firstLine() string {
	first, _, _ := strings.Cut(b.text, "\n")
	return first
}

// readmeRunCmd is one command of a block.
type readmeRunCmd struct {
	line  int    // README line where it starts
	text  string // as written, its continuation lines included
	want  string // the JSON object its `# →` comment names, or ""
	last  string // the last line its `# → NNN, …` comment names, or ""
	echo  string // the word its trailing literal echo prints, or ""
	lists string // the name its `# lists "NAME"` comment promises, or ""
}

// bare is the command without a trailing comment, for matching.
func (c readmeRunCmd) bare() string {
	s := c.text
	if i := strings.Index(s, " #"); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// assigned is the variable a `VAR=…` command sets, or "".
func (c readmeRunCmd) assigned() string {
	if m := readmeRunAssign.FindStringSubmatch(c.text); m != nil {
		return m[1]
	}
	return ""
}

var (
	readmeRunAssign = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=`)
	readmeRunEcho   = regexp.MustCompile(`(?:^|&&|;)\s*echo\s+([A-Za-z][A-Za-z0-9 ._-]*?)\s*$`)
	readmeRunLists  = regexp.MustCompile(`\s#.*\blists "([^"]+)"`)
	// readmeRunStatusLine is a `# →` comment that names a printed line:
	// an HTTP status, a comma, and more.
	readmeRunStatusLine = regexp.MustCompile(`^[1-5][0-9][0-9], `)
)

// readmeRunLastLine says whether out's last line is what want (a `# → NNN,
// …` comment) names: N any number, … any text.
func readmeRunLastLine(want, out string) bool {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	pattern := regexp.QuoteMeta(want)
	pattern = regexp.MustCompile(`\bN\b`).ReplaceAllString(pattern, `[0-9]+`)
	pattern = strings.ReplaceAll(pattern, "…", ".*")
	return regexp.MustCompile("^" + pattern + "$").MatchString(lines[len(lines)-1])
}

// readmeRunParse reads README's ```sh blocks and splits each into its
// commands, with what the comments say they print.
func readmeRunParse(t *testing.T, readme string) []readmeRunBlock {
	t.Helper()
	lines := strings.Split(readme, "\n")
	var (
		blocks  []readmeRunBlock
		heading string
		prose   []string
	)
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if h, ok := strings.CutPrefix(l, "## "); ok {
			heading, prose = h, nil
		}
		if lang, ok := strings.CutPrefix(l, "```"); ok && (lang == "bash" || lang == "shell" || lang == "console") {
			t.Errorf("README.md:%d: a ```%s block: only ```sh blocks are run; write it as ```sh", i+1, lang)
		}
		if l != "```sh" {
			prose = append(prose, l)
			continue
		}
		b := readmeRunBlock{line: i + 2, heading: heading,
			needsMakeRun: strings.Contains(strings.ToLower(strings.Join(prose, " ")), "with `make run` running")}
		var body []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("README.md:%d: the ```sh block is not closed", b.line-1)
		}
		b.text = strings.Join(body, "\n") + "\n"
		b.cmds = readmeRunCommands(t, b.line, body)
		blocks, prose = append(blocks, b), nil
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```sh block")
	}
	return blocks
}

// readmeRunCommands splits a block's lines (the first at README line
// first) into commands: a command goes on until bash reads it as complete.
func readmeRunCommands(t *testing.T, first int, body []string) []readmeRunCmd {
	t.Helper()
	var cmds []readmeRunCmd
	for i := 0; i < len(body); {
		trimmed := strings.TrimSpace(body[i])
		switch {
		case trimmed == "":
			i++
		case strings.HasPrefix(trimmed, "#"):
			j := i
			for j < len(body) && strings.HasPrefix(strings.TrimSpace(body[j]), "#") {
				j++
			}
			for k := i; k < j; k++ {
				c := strings.TrimSpace(body[k])
				if answer, ok := strings.CutPrefix(c, "# →"); ok {
					if len(cmds) == 0 {
						t.Errorf("README.md:%d: a `# →` comment before any command", first+k)
						break
					}
					for _, more := range body[k+1 : j] {
						answer += " " + strings.TrimPrefix(strings.TrimSpace(more), "#")
					}
					c := &cmds[len(cmds)-1]
					c.want, _ = readmeRunObject(answer)
					if a := strings.TrimSpace(answer); c.want == "" && readmeRunStatusLine.MatchString(a) {
						c.last = a
					}
					break
				}
				if _, after, ok := strings.Cut(c, "→"); ok && strings.Contains(after, "{") {
					t.Errorf("README.md:%d: JSON after → in a step heading is not checked; write it as a `# → …` line under its command: %s", first+k, c)
				}
			}
			i = j
		default:
			c := readmeRunCmd{line: first + i, text: body[i]}
			for i++; !readmeRunComplete(t, c.text); i++ {
				if i == len(body) {
					t.Fatalf("README.md:%d: the command does not end within its block:\n%s", c.line, c.text)
				}
				c.text += "\n" + body[i]
			}
			if m := readmeRunEcho.FindStringSubmatch(c.bare()); m != nil {
				c.echo = m[1]
			}
			if m := readmeRunLists.FindStringSubmatch(c.text); m != nil {
				c.lists = m[1]
			}
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// readmeRunComplete says whether bash reads text as a whole command (a
// continued line, an open quote, $( or pipe is not).
func readmeRunComplete(t *testing.T, text string) bool {
	t.Helper()
	if strings.HasSuffix(strings.TrimRight(text, " \t"), "\\") {
		return false
	}
	err := exec.Command("bash", "-n", "-c", text).Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("bash -n: %v", err)
	}
	return err == nil
}

// readmeRunObject reads the first {…} of an answer comment: as written,
// and as JSON, in which an unquoted … is readmeRunAny, as a value or,
// before a closing }, as a member ("…":0: more members may come).
func readmeRunObject(answer string) (written, template string) {
	start := strings.Index(answer, "{")
	if start < 0 {
		return "", ""
	}
	wild, _ := json.Marshal(readmeRunAny)
	var b strings.Builder
	depth, inString, escaped := 0, false, false
	rs := []rune(answer[start:])
	for i, r := range rs {
		switch {
		case escaped:
			escaped = false
		case inString && r == '\\':
			escaped = true
		case r == '"':
			inString = !inString
		case inString:
		case r == '…':
			before := strings.TrimRight(b.String(), " ")
			after := strings.TrimLeft(string(rs[i+1:]), " ")
			b.Write(wild)
			if strings.HasPrefix(after, "}") && (strings.HasSuffix(before, ",") || strings.HasSuffix(before, "{")) {
				b.WriteString(":0")
			}
			continue
		case r == '{':
			depth++
		case r == '}':
			depth--
			if depth == 0 {
				b.WriteRune(r)
				return string(rs[:i+1]), b.String()
			}
		}
		b.WriteRune(r)
	}
	return string(rs), b.String() // unbalanced: the JSON parse says so
}

// readmeRunPlan checks that every skipped command and every server of the
// test's tables is in the README once (a stale entry would quietly run
// nothing) and returns the `make run` command as written.
func readmeRunPlan(t *testing.T, blocks []readmeRunBlock) readmeRunCmd {
	t.Helper()
	seen := map[string][]readmeRunCmd{}
	for _, b := range blocks {
		if first := b.firstLine(); strings.HasPrefix(first, "#") { // a block named by its first comment
			seen[first] = append(seen[first], readmeRunCmd{line: b.line, text: b.text})
		}
		for _, c := range b.cmds {
			seen[c.bare()] = append(seen[c.bare()], c)
		}
	}
	for cmd := range readmeRunSkipped {
		if len(seen[cmd]) != 1 {
			t.Errorf("README's blocks have %q %d times; readmeRunSkipped wants it once", cmd, len(seen[cmd]))
		}
	}
	for _, s := range readmeRunServers {
		if len(seen[s.match]) != 1 {
			t.Fatalf("README's blocks have %q %d times; readmeRunServers wants it once", s.match, len(seen[s.match]))
		}
	}
	return seen[readmeRunServers[0].match][0]
}

// readmeRunClone makes the clean clone: `git clone` of root at its HEAD,
// then the working tree's files over it, so that it holds exactly what
// `git ls-files -co --exclude-standard` lists. It is removed at the end.
//
// Its path is fixed for root (one clone at a time, guarded by a lock),
// not a new temp dir each run: Go keys the compiled packages of the main
// module by their directory, so in a new directory `make run` would
// compile all of vmshelf's packages again; at a fixed one a warm cache
// leaves it a link.
func readmeRunClone(t *testing.T, root string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "vmshelf-readme-"+hex.EncodeToString(sum[:6]))
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		msg := fmt.Sprintf("another TestReadmeOnCleanClone of %s holds %s.lock (%v)", root, dir, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the clone: %v", err)
		}
		os.Remove(lock.Name())
		lock.Close()
	})
	// What a run killed before its cleanup left.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	git := func(dir string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = readmeRunEnv()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %q in %s: %v\n%s", args, dir, err, stderr.String())
		}
		return out
	}
	var names []string
	if readmeRunIsWorkTree(root) {
		head := strings.TrimSpace(string(git(root, "rev-parse", "HEAD")))
		git(root, "clone", "--quiet", "--no-checkout", root, dir)
		git(dir, "checkout", "--quiet", "--detach", head)
		names = strings.Split(string(git(root, "ls-files", "-z", "-co", "--exclude-standard")), "\x00")
	} else {
		// .ci/mutate's copy of the tree, which has no .git: it holds what
		// `git ls-files -co` listed already (and links to npm's installs).
		t.Logf("%s is not a git work tree: its files are copied as they are", root)
		names = readmeRunTreeFiles(t, root)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	files := map[string]bool{}
	for _, name := range names {
		if name == "" || files[name] {
			continue
		}
		src := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree: removed from the clone below
		}
		if err != nil {
			t.Fatal(err)
		}
		files[name] = true
		dst := filepath.Join(dir, name)
		if fi.Mode()&fs.ModeSymlink == 0 {
			copyFile(t, src, dst)
			continue
		}
		target, err := os.Readlink(src)
		if err == nil {
			os.Remove(dst)
			err = os.MkdirAll(filepath.Dir(dst), 0o755)
		}
		if err == nil {
			err = os.Symlink(target, dst)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			if rel == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		if !files[filepath.ToSlash(rel)] {
			return os.Remove(path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("removing from the clone what the working tree deleted: %v", err)
	}
	return dir
}

// readmeRunIsWorkTree says whether root is the top of a git work tree
// (and not a directory inside another one, or none).
func readmeRunIsWorkTree(root string) bool {
	cmd := exec.Command("git", "rev-parse", "--show-toplevel")
	cmd.Dir, cmd.Env = root, readmeRunEnv()
	out, err := cmd.Output()
	if err != nil {
		return false
	}
	top, err1 := filepath.EvalSymlinks(strings.TrimSpace(string(out)))
	real, err2 := filepath.EvalSymlinks(root)
	return err1 == nil && err2 == nil && top == real
}

// readmeRunTreeFiles lists root's files as git would for a clean tree:
// without .git, node_modules, bin/ and vmshelf-data/.
func readmeRunTreeFiles(t *testing.T, root string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		switch {
		case d.Name() == ".git" || d.Name() == "node_modules" || rel == "bin" || rel == "vmshelf-data":
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case d.IsDir():
			return nil
		}
		names = append(names, rel)
		return nil
	})
	if err != nil {
		t.Fatalf("listing %s: %v", root, err)
	}
	return names
}

// readmeRunEnv is the environment of a new user's shell: the developer's,
// without what would make the blocks behave otherwise than for that user:
// vmshelf's and Stripe's settings, CONTROL (the market walk-through's
// override), git's repository variables, and the outer make's jobserver
// when `make test` runs this test. Loopback never goes through a proxy.
func readmeRunEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "VMSHELF_"), strings.HasPrefix(k, "STRIPE_"), strings.HasPrefix(k, "GIT_"),
			k == "CONTROL", k == "MAKEFLAGS", k == "MAKELEVEL", k == "MFLAGS", k == "MAKEOVERRIDES",
			strings.EqualFold(k, "no_proxy"):
			continue
		}
		env = append(env, kv)
	}
	noProxy := "127.0.0.1,localhost"
	if v := os.Getenv("no_proxy"); v != "" {
		noProxy += "," + v
	}
	return append(env, "no_proxy="+noProxy, "NO_PROXY="+noProxy)
}

// readmeRunBudget is d, or less when the test's deadline is nearer, so
// that the cleanup still runs (a test killed at -timeout leaves its
// servers running).
func readmeRunBudget(t *testing.T, d time.Duration) time.Duration {
	if deadline, ok := t.Deadline(); ok {
		if left := time.Until(deadline) - 30*time.Second; left < d {
			return max(left, time.Second)
		}
	}
	return d
}

// readmeRunBlockRun runs cmds, a block's commands in order, as one bash
// script in dir and checks what each printed.
func readmeRunBlockRun(t *testing.T, dir string, env []string, cmds []readmeRunCmd) {
	t.Helper()
	if len(cmds) == 0 {
		return
	}
	r := readmeRunRun(t, dir, env, cmds)
	if r.err != nil {
		t.Errorf("README.md:%d: %s\nfailed (%v); its stderr:\n%s\nits stdout:\n%s", r.failed.line, r.failed.text, r.err,
			readmeRunShow(r.errs[r.failed.line]), readmeRunShow(r.outs[r.failed.line]))
	}
	for _, c := range cmds[:r.ran] {
		readmeRunCheck(t, c, r)
	}
}

// readmeRunResult is what a block's script printed, cut by command.
type readmeRunResult struct {
	outs, errs, vars map[int]string // by README line
	err              error          // the script's
	failed           readmeRunCmd   // the command that failed, if err
	ran              int            // how many commands ran to their end
}

// readmeRunRun runs cmds as one bash script under `set -eo pipefail`, with
// a marker before each command on stdout and stderr.
func readmeRunRun(t *testing.T, dir string, env []string, cmds []readmeRunCmd) readmeRunResult {
	t.Helper()
	var script strings.Builder
	script.WriteString("set -eo pipefail\n")
	for _, c := range cmds {
		fmt.Fprintf(&script, "printf '\\n\\036cmd %d\\036\\n'; printf '\\n\\036cmd %d\\036\\n' >&2\n%s\n", c.line, c.line, c.text)
		if v := c.assigned(); v != "" && c.want != "" {
			fmt.Fprintf(&script, "printf '\\n\\036var %d\\036\\n%%s' \"$%s\"\n", c.line, v)
		}
	}
	stdout, stderr, err := readmeRunScript(t, dir, env, script.String(), readmeRunBudget(t, 2*time.Minute))
	r := readmeRunResult{err: err, ran: len(cmds)}
	r.outs, r.vars = readmeRunSplit(stdout)
	r.errs, _ = readmeRunSplit(stderr)
	if err != nil {
		// The last command whose marker is out is the one that failed.
		r.failed, r.ran = cmds[0], 0
		for i, c := range cmds {
			if _, ok := r.outs[c.line]; ok {
				r.failed, r.ran = c, i
			}
		}
	}
	return r
}

// readmeRunCheck checks what c, which ran to its end, printed against
// what the README says of it.
func readmeRunCheck(t *testing.T, c readmeRunCmd, r readmeRunResult) {
	t.Helper()
	out := r.outs[c.line]
	for what, printed := range map[string]string{"stdout": out, "stderr": r.errs[c.line]} {
		if printed != "" && !strings.HasSuffix(printed, "\n") {
			t.Errorf("README.md:%d: %s\nprinted on %s %q, which ends without a newline", c.line, c.text, what, readmeRunShow(printed))
		}
	}
	if c.want != "" {
		got, what := out, "printed"
		if v := c.assigned(); v != "" {
			got, what = r.vars[c.line], "set "+v+" to"
		}
		if problem := readmeRunMatchAnswer(c.want, got); problem != "" {
			t.Errorf("README.md:%d: %s\n%s %q; the README says %s: %s", c.line, c.text, what, readmeRunShow(got), c.want, readmeRunShow(problem))
		}
	}
	if c.last != "" && !readmeRunLastLine(c.last, out) {
		t.Errorf("README.md:%d: %s\nprinted %q; the README says its last line is %q", c.line, c.text, readmeRunShow(out), c.last)
	}
	if c.echo != "" {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if lines[len(lines)-1] != c.echo {
			t.Errorf("README.md:%d: %s\nprinted %q, not %q; stderr:\n%s", c.line, c.text, readmeRunShow(out), c.echo, readmeRunShow(r.errs[c.line]))
		}
	}
	if c.lists != "" {
		name, _ := json.Marshal(c.lists)
		if !strings.Contains(out, string(name)) {
			t.Errorf("README.md:%d: %s\nprinted %q, which does not list %s", c.line, c.text, readmeRunShow(out), name)
		}
	}
}

// readmeRunAtQuota runs the walk-through block b again once the dev box is
// at its image quota: it must stop at its ticket request, having printed
// the edge's refusal (imageQuota) and curl's error, and run nothing after.
func readmeRunAtQuota(t *testing.T, dir string, env []string, b readmeRunBlock) {
	t.Helper()
	r := readmeRunRun(t, dir, env, b.cmds)
	if r.err == nil {
		t.Fatalf("README.md:%d: the walk-through block went through at the image quota; its output:\n%s", b.line, readmeRunShow(fmt.Sprint(r.outs)))
	}
	if !strings.Contains(r.failed.text, "/market/vm-images/ticket") {
		t.Fatalf("README.md:%d: at the image quota the block stopped at\n%s\nnot at its ticket request; its stderr:\n%s", r.failed.line, r.failed.text, readmeRunShow(r.errs[r.failed.line]))
	}
	said := r.errs[r.failed.line]
	for _, w := range []string{`"reason":"imageQuota"`, "already number 3", "returned error: 409"} {
		if !strings.Contains(said, w) {
			t.Errorf("README.md:%d: at the image quota the ticket request's refusal is not said aloud: no %q in its stderr:\n%s", r.failed.line, w, readmeRunShow(said))
		}
	}
	for _, c := range b.cmds[r.ran+1:] {
		if _, ok := r.outs[c.line]; ok {
			t.Errorf("README.md:%d: ran after the refusal: %s", c.line, c.text)
		}
	}
}

// readmeRunShow is a block's or server's output for a failure message,
// with the secrets it may hold (tickets, tokens: 64 hex digits) cut out.
func readmeRunShow(s string) string {
	return readmeRunSecret.ReplaceAllString(s, "<secret>")
}

var readmeRunSecret = regexp.MustCompile(`[0-9a-f]{64}`)

// readmeRunMarker is what the script prints before each command (cmd
// LINE) and after an assignment whose value is checked (var LINE).
var readmeRunMarker = regexp.MustCompile("\n\x1e(cmd|var) ([0-9]+)\x1e\n")

// readmeRunSplit cuts a script's output at its markers: each command's
// output and each checked variable's value, by README line.
func readmeRunSplit(out string) (cmds, vars map[int]string) {
	cmds, vars = map[int]string{}, map[int]string{}
	ms := readmeRunMarker.FindAllStringSubmatchIndex(out, -1)
	for i, m := range ms {
		end := len(out)
		if i+1 < len(ms) {
			end = ms[i+1][0]
		}
		line, _ := strconv.Atoi(out[m[4]:m[5]])
		if out[m[2]:m[3]] == "cmd" {
			cmds[line] = out[m[1]:end]
		} else {
			vars[line] = out[m[1]:end]
		}
	}
	return cmds, vars
}

// readmeRunScript runs script with bash in dir, in its own process group
// (killed as a whole at the end, so that nothing it started in the
// background stays), within d.
func readmeRunScript(t *testing.T, dir string, env []string, script string, d time.Duration) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err = <-done:
	case <-timer.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		err = fmt.Errorf("did not finish within %v", d)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // what it left in the background
	return out.String(), errOut.String(), err
}

// readmeRunProc is a server the README starts, running in the background.
type readmeRunProc struct {
	srv  readmeRunServer
	cmd  *exec.Cmd
	out  *readmeRunBuffer
	done chan struct{} // closed once the group's output has ended
	err  error         // Wait's, once done
}

// readmeRunStart starts script, as the README writes it, in dir.
func readmeRunStart(t *testing.T, dir string, env []string, script string, srv readmeRunServer) *readmeRunProc {
	t.Helper()
	p := &readmeRunProc{srv: srv, out: &readmeRunBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command("bash", "-c", script)
	p.cmd.Dir, p.cmd.Env = dir, env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Wait returns once every process of the group closed the output
	// (make's serve, the block's stripe-mock), or this long after bash
	// exited with one still holding it.
	p.cmd.WaitDelay = 20 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %q: %v", script, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

// waitReady polls the server's addresses until each accepts and the
// control plane's /readyz answers 200, within d.
func (p *readmeRunProc) waitReady(t *testing.T, d time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	ready := func() bool {
		for _, addr := range p.srv.ready {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return false
			}
			c.Close()
		}
		resp, err := client.Get("http://" + readmeRunControlAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		select {
		case <-p.done:
			t.Fatalf("%q ended before it was ready (%v):\n%s", p.srv.match, p.err, readmeRunShow(p.out.String()))
		case <-deadline.C:
			t.Fatalf("%q was not ready within %v (%s accepting, /readyz 200):\n%s", p.srv.match, d, p.srv.ready, readmeRunShow(p.out.String()))
		case <-tick.C:
		}
	}
}

// stop ends the server's process group as Ctrl-C would end the terminal's
// commands, with SIGTERM, and with SIGKILL if it is not gone within 20 s.
func (p *readmeRunProc) stop(t *testing.T) {
	t.Helper()
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		if errors.Is(p.err, exec.ErrWaitDelay) {
			t.Errorf("%q: a process of its group kept running 20 s after the rest ended:\n%s", p.srv.match, readmeRunShow(p.out.String()))
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%q did not stop within 30 s of SIGTERM:\n%s", p.srv.match, readmeRunShow(p.out.String()))
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// readmeRunBuffer is a server's output, written while the test reads it.
type readmeRunBuffer = syncbuf.Buffer

// readmeRunMatchAnswer compares an answer with the README's object (see
// the convention in TestReadmeOnCleanClone's comment); it returns what
// differs, or "".
func readmeRunMatchAnswer(template, answer string) string {
	_, template = readmeRunObject(template)
	var want any
	if err := readmeRunDecode(template, &want); err != nil {
		return fmt.Sprintf("the README's object is not JSON (with … for any value): %v", err)
	}
	var got any
	if err := readmeRunDecode(strings.TrimSpace(answer), &got); err != nil {
		return fmt.Sprintf("not one JSON value: %v", err)
	}
	return readmeRunMatch("", want, got)
}

func readmeRunDecode(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more after the JSON value")
	}
	return nil
}

// readmeRunAny stands for an unquoted … of the README: any value, or as a
// member of an object, any more members.
const readmeRunAny = "\x00…"

// readmeRunMatch compares got with want at path.
func readmeRunMatch(path string, want, got any) string {
	if want == readmeRunAny {
		return ""
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s is %v, not an object", readmeRunPath(path), got)
		}
		_, open := w[readmeRunAny]
		var problems []string
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range w {
				if k != readmeRunAny && !yield(k) {
					return
				}
			}
		}) {
			v, ok := g[k]
			if !ok {
				problems = append(problems, fmt.Sprintf("no key %q", path+k))
				continue
			}
			if p := readmeRunMatch(path+k+".", w[k], v); p != "" {
				problems = append(problems, p)
			}
		}
		if !open {
			for k := range g {
				if _, ok := w[k]; !ok {
					problems = append(problems, fmt.Sprintf("key %q that the README does not name (end its object with ,… if more may come)", path+k))
				}
			}
		}
		slices.Sort(problems)
		return strings.Join(problems, "; ")
	case string:
		g, ok := got.(string)
		if !ok || !readmeRunGlob(w, g) {
			return fmt.Sprintf("%s is %v, not %q", readmeRunPath(path), got, w)
		}
		return ""
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s is %v, not %v", readmeRunPath(path), got, want)
		}
		return ""
	}
}

func readmeRunPath(path string) string {
	if path == "" {
		return "the answer"
	}
	return strings.TrimSuffix(path, ".")
}

// readmeRunGlob matches s against pattern, in which … is any text.
func readmeRunGlob(pattern, s string) bool {
	parts := strings.Split(pattern, "…")
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for i, p := range parts[1:] {
		if i == len(parts)-2 {
			return strings.HasSuffix(s, p) && len(s) >= len(p)
		}
		j := strings.Index(s, p)
		if j < 0 {
			return false
		}
		s = s[j+len(p):]
	}
	return s == ""
}

// readmeRunMissing fails the test under CI=true, where a missing tool is a
// broken runner, and skips it loudly elsewhere, naming the install.
func readmeRunMissing(t *testing.T, what, install string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required in CI: %v", what, err)
	}
	t.Skipf("SKIPPED: %s missing (%v): %s", what, err, install)
}

// readmeRunNeedHTTPDriver: the walk-through fetches with qemu-img over
// http. Asked to open a closed loopback port, qemu-img without its curl
// driver says "Unknown driver"/"Unknown protocol"; with it, it cannot
// connect.
func readmeRunNeedHTTPDriver(t *testing.T) {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", `json:{"file.driver":"http","file.url":"http://127.0.0.1:1/probe.qcow2"}`).CombinedOutput()
	if err == nil {
		t.Fatalf("qemu-img info on a closed port succeeded: %s", out)
	}
	if s := string(out); strings.Contains(s, "Unknown driver") || strings.Contains(s, "Unknown protocol") {
		readmeRunMissing(t, "qemu-img's http driver", "apt-get install qemu-block-extra", errors.New(strings.TrimSpace(s)))
	}
}

// readmeRunNeedStripeMock: the market block runs stripe-mock from where
// its `go install` line puts it. Its install runs offline only if the
// module is already there, so it is asked for up front.
func readmeRunNeedStripeMock(t *testing.T, readme string) {
	t.Helper()
	install := regexp.MustCompile(`(?m)^go install github\.com/stripe/stripe-mock@\S+$`).FindString(readme)
	if install == "" {
		t.Fatal("README.md does not install stripe-mock with go install")
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env GOPATH: %v", err)
	}
	bin := filepath.Join(filepath.SplitList(strings.TrimSpace(string(gopath)))[0], "bin", "stripe-mock")
	if _, err := os.Stat(bin); err != nil {
		readmeRunMissing(t, "stripe-mock", install, err)
	}
}

// readmeRunHolder names the process listening on addr's port, from /proc,
// or says it cannot.
func readmeRunHolder(addr string) string {
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.ParseUint(portText, 10, 16)
	sockets := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, p, _ := strings.Cut(f[1], ":")
			if n, err := strconv.ParseUint(p, 16, 16); err == nil && n == port {
				sockets["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(sockets) == 0 {
		return "no listener in /proc/net/tcp: a socket bound without listening?"
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && sockets[target] {
			pid := strings.Split(fd, "/")[2]
			cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			cmd := strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
			if len(cmd) > 120 {
				cmd = cmd[:120] + "…"
			}
			return fmt.Sprintf("held by pid %s: %s", pid, cmd)
		}
	}
	return "held by a process this user cannot see"
}

// TestReadmeRunMatchAnswer pins the convention for `# →` objects.
func TestReadmeRunMatchAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, template, answer string
		ok                     bool
	}{
		{"every key, any values", `{"ticket":"…","size":…}`, `{"ticket":"ab","size":3}`, true},
		{"a literal value", `{"free":5,…}`, `{"free":5,"listing_id":"l1"}`, true},
		{"a literal value differs", `{"free":5,…}`, `{"free":4}`, false},
		{"a key missing", `{"ticket":"…","expires_at":"…"}`, `{"ticket":"ab"}`, false},
		{"a key not named, closed object", `{"ticket":"…"}`, `{"ticket":"ab","more":1}`, false},
		{"a key not named, open object", `{"ticket":"…",…}`, `{"ticket":"ab","more":1}`, true},
		{"… in a string", `{"url":"http://127.0.0.1:8480/upload/…"}`, `{"url":"http://127.0.0.1:8480/upload/t1"}`, true},
		{"… in a string differs", `{"url":"http://127.0.0.1:8480/upload/…"}`, `{"url":"http://127.0.0.1:9/upload/t1"}`, false},
		{`"…" is a string`, `{"ticket":"…"}`, `{"ticket":5}`, false},
		{"unquoted … is any value", `{"size":…}`, `{"size":"x"}`, true},
		{"false is false", `{"efi":false}`, `{"efi":true}`, false},
		{"not JSON", `{"ticket":"…"}`, `201 Created`, false},
		{"two values", `{"ticket":"…"}`, `{"ticket":"a"}{"ticket":"b"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problem := readmeRunMatchAnswer(tc.template, tc.answer)
			if (problem == "") != tc.ok {
				t.Errorf("readmeRunMatchAnswer(%s, %s) = %q; want ok %v", tc.template, tc.answer, problem, tc.ok)
			}
		})
	}
}
