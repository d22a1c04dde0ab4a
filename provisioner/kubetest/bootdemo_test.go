package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// pageHarness is cmd/vmshelf's browser harness (lib.mjs, playwright-core
// in its node_modules), which the demo's scenario shares.
const pageHarness = "../../cmd/vmshelf/testdata/browser"

// demoTimeout bounds TestBootDemo: the cluster, the upload, one guest's
// boot in software emulation to its login prompt (minutes; more on a
// machine that boots other guests at once), and the stop.
const demoTimeout = 45 * time.Minute

// TestBootDemo: make demo's runner (RunDemo, what cmd/demo runs), walked
// through in headless Chromium as its printed steps say: sign in with
// the dev token (the page says no money moves), upload the guest's BIOS
// disk it names, order a replica from the offer, pay on the stand-in's
// demo page (its banner says no money moves; its button posts Stripe's
// signed webhook and returns to the Machines page), watch the machine
// until it runs, and see the login prompt on its serial console. Then
// the runner stops as at Ctrl-C: within its bound (its cleanups stop
// serve, destroy the domain and stop the daemons it started), and its
// folder is gone.
func TestBootDemo(t *testing.T) {
	needBoot(t)
	chromium := needBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), demoTimeout)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	out, log := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	ready := make(chan DemoInfo, 1)
	ended := make(chan error, 1)
	bin := buildVmshelf(t)
	go func() {
		ended <- RunDemo(runCtx, DemoConfig{Vmshelf: bin, Out: out, Log: log,
			Ready: func(i DemoInfo) { ready <- i }})
	}()
	// However the test ends, the runner stops before it returns: nothing
	// of the demo outlives the test.
	t.Cleanup(func() {
		stop()
		select {
		case <-ended:
		case <-time.After(demoStopTimeout + time.Minute):
			t.Errorf("the demo did not stop within %s", demoStopTimeout)
		}
	})
	var info DemoInfo
	select {
	case info = <-ready:
	case err := <-ended:
		ended <- err // for the cleanup
		t.Fatalf("the demo ended while starting: %v\n%s\nits log's end:\n%s", err, out, tailOf(log.String(), 5000))
	case <-ctx.Done():
		t.Fatalf("the demo did not start within %s:\n%s", demoTimeout, out)
	}
	// What the newcomer reads names what to open, the token and the image.
	for _, want := range []string{info.PageURL, info.TokenFile, info.Image, "Ctrl-C"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's words do not name %q:\n%s", want, out)
		}
	}
	token, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		PageBanner     string   `json:"pageBanner"`
		CheckoutURL    string   `json:"checkoutURL"`
		CheckoutBanner string   `json:"checkoutBanner"`
		ReturnedTo     string   `json:"returnedTo"`
		ReturnedOrders int      `json:"returnedOrders"`
		Seen           []string `json:"seen"`
		Login          string   `json:"login"`
		PageErrors     []string `json:"pageErrors"`
	}
	script := runScenario(t, ctx, chromium, "demo", map[string]string{"PAGE_URL": info.PageURL,
		"PAGE_TOKEN": strings.TrimSpace(string(token)), "PAGE_FILE": info.Image}, &report)
	t.Logf("demo.mjs:\n%s", script)
	t.Logf("the page showed the machine as %q", report.Seen)
	if !strings.Contains(report.PageBanner, "No money moves") {
		t.Errorf("the Machines page's banner %q, want that no money moves", report.PageBanner)
	}
	if report.CheckoutBanner != "Demo: no money moves" || !strings.HasPrefix(report.CheckoutURL, "http://127.0.0.1:") {
		t.Errorf("the checkout %s says %q, want the stand-in's page on loopback saying \"Demo: no money moves\"", report.CheckoutURL, report.CheckoutBanner)
	}
	if report.ReturnedTo != "/machines" || report.ReturnedOrders != 1 {
		t.Errorf("after the payment the tab is at %q listing %d machines, want the Machines page, signed in, with the order", report.ReturnedTo, report.ReturnedOrders)
	}
	if len(report.Seen) == 0 || !strings.HasPrefix(report.Seen[len(report.Seen)-1], "active/running") {
		t.Errorf("the machine's states on the page %q, want it running last", report.Seen)
	}
	if !strings.Contains(report.Login, "login:") || len(report.PageErrors) > 0 {
		t.Errorf("the serial console showed %q; the page's errors %q", report.Login, report.PageErrors)
	}

	// Ctrl-C: everything stops, within the runner's bound.
	stopping := time.Now()
	stop()
	select {
	case err := <-ended:
		ended <- err // for the cleanup
		if err != nil {
			t.Errorf("the demo's stop: %v", err)
		}
		t.Logf("the demo stopped in %s", time.Since(stopping).Round(time.Second))
	case <-time.After(demoStopTimeout + time.Minute):
		t.Fatalf("the demo did not stop within %s", demoStopTimeout)
	}
	if !strings.Contains(out.String(), "Stopping") {
		t.Errorf("the demo did not say it stops:\n%s", out)
	}
	if _, err := os.Stat(filepath.Dir(filepath.Dir(info.TokenFile))); !os.IsNotExist(err) {
		t.Errorf("the demo's folder after its stop: %v", err)
	}
}

// needBrowser: what the page tests' harness needs (node 20 or later,
// Chromium, playwright-core in its node_modules), or a failure under
// CI=true and a skip that names the install command elsewhere. It returns
// Chromium's path.
func needBrowser(t *testing.T) string {
	t.Helper()
	missing := func(msg string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		missing("chromium missing: apt-get install chromium (make deps installs it)")
	}
	if out, err := exec.Command("node", "-e", "process.exit(+process.versions.node.split('.')[0] >= 20 ? 0 : 1)").CombinedOutput(); err != nil {
		missing(fmt.Sprintf("node 20 or later missing (%v %s): make deps names how to install Node.js 20", err, bytes.TrimSpace(out)))
	}
	if _, err := os.Stat(filepath.Join(pageHarness, "node_modules", "playwright-core", "package.json")); err != nil {
		missing("playwright-core is not installed: npm ci --prefix cmd/vmshelf/testdata/browser")
	}
	return chromium
}

// runScenario runs testdata/browser/<scenario>.mjs with env and a fresh
// profile until it exits (bounded by ctx), wants exit 0, and decodes its
// report (the last line of its stdout); it returns the script's log.
func runScenario(t *testing.T, ctx context.Context, chromium, scenario string, env map[string]string, report any) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "browser"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, scenario+".mjs"))
	cmd.Dir = dir
	// The token goes in the environment, never on a command line.
	cmd.Env = append(os.Environ(), "PAGE_PROFILE="+t.TempDir(), "PAGE_CHROMIUM="+chromium)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout bytes.Buffer
	stderr := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	// If the test dies, so does node (and playwright's Chromium); at the
	// deadline SIGTERM lets playwright close Chromium first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s.mjs: %v\n%s", scenario, err, redactToken(stderr.String(), env))
	}
	out := strings.TrimRight(stdout.String(), "\n")
	if err := json.Unmarshal([]byte(out[strings.LastIndex(out, "\n")+1:]), report); err != nil {
		t.Fatalf("%s.mjs's last line is not its report: %v\n%s", scenario, err, out)
	}
	return redactToken(stderr.String(), env)
}

// redactToken hides the page's token in what the test shows.
func redactToken(s string, env map[string]string) string {
	if tok := env["PAGE_TOKEN"]; tok != "" {
		s = strings.ReplaceAll(s, tok, "<token>")
	}
	return s
}
