package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/provisioner/kubetest/guestimage"
	"github.com/vmshelf/vmshelf/provisioner/kubetest/testnode"
)

// DemoConfig is what RunDemo needs from its command.
type DemoConfig struct {
	// Vmshelf is the vmshelf binary to serve with (make's bin/vmshelf).
	Vmshelf string
	// Out is told, in words, what to open and what to click.
	Out io.Writer
	// Log takes the cluster's, the node's and serve's logs.
	Log io.Writer
	// Ready, if set, is told where the demo is once it is up (a browser
	// test drives it from there).
	Ready func(DemoInfo)
}

// DemoInfo is where the running demo is.
type DemoInfo struct {
	PageURL   string // the Machines page
	TokenFile string // the dev box's token, for the page's sign-in
	Image     string // the guest's BIOS disk, to upload
}

// demoStopTimeout bounds the whole stop after Ctrl-C: serve's (30 s),
// the node's domains (1 min), libvirtd's (10 s), the API server's (30 s).
const demoStopTimeout = 3 * time.Minute

// RunDemo runs a buyer's whole journey on this machine until ctx ends:
// the guest's disks (built on the first run), the API server with
// KubeVirt's virt-controller and the test node with libvirtd and QEMU
// (as TestBoot runs them), the stand-in Stripe with its demo payment
// page, and vmshelf serve --dev --vms-enable pointed at them, with a host
// box offering replicas. It says on cfg.Out what to open and click, and
// when ctx ends it stops everything it started: serve, the domains, the
// daemons it started, the API server.
func RunDemo(ctx context.Context, cfg DemoConfig) (err error) {
	if missing := append(guestimage.Missing(), testnode.Missing()...); len(missing) > 0 {
		return fmt.Errorf("the demo needs %s: make deps (.ci/deps) installs them, as root", strings.Join(missing, ", "))
	}
	dir, err := os.MkdirTemp("", "vmshelf-demo-")
	if err != nil {
		return err
	}
	r := &demoRun{log: cfg.Log, dir: dir}
	// The cluster's helpers stop their goroutines when this context ends,
	// which must come before the cleanups.
	runCtx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		if stopErr := r.stop(); err == nil {
			err = stopErr
		}
	}()
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(demoFatal)
			if !ok {
				panic(p)
			}
			err = errors.New(string(f))
		}
	}()
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }

	say("Getting the guest's disk image (the first run builds it from Debian's packages: several minutes; then it is cached)…")
	imgs := guestImages(r, runCtx)
	say("Starting the API server, KubeVirt's virt-controller, the test node (libvirtd, QEMU) and vmshelf serve (about a minute)…")
	c := startBootCluster(r, runCtx, nil)
	e := startEdgeWith(r, c, edgeConfig{bin: cfg.Vmshelf, checkoutPage: true, log: cfg.Log},
		"--vm-cpu", "1", "--vm-memory-mib", "1024", "--vm-disk-gib", "1", "--images-per-tenant", "10")
	host := e.addHost(r)
	e.listing(r, host, 10)
	info := DemoInfo{PageURL: e.ctlBase + "/machines", TokenFile: filepath.Join(e.dataDir, "dev-token"),
		Image: imgs.Path(guestimage.BIOS)}
	say(`
The demo runs. In a browser on this machine:

  1. Open %s
  2. Sign in: paste the dev box's token, the content of
       %s
     (cat it), into "Tenant token" and click "Use token".
  3. Upload the guest image (a Debian 12 with a BIOS boot loader; leave the EFI box unticked);
     once stored it is listed under your images:
       %s
  4. Order one replica of it from the offer of "box1" (a host box the demo made, offering 10).
     Ordering opens the checkout in a new tab: the demo payment page, whose banner says
     it: no money moves. Click "Complete the demo payment": it sends Stripe's signed
     webhook to vmshelf and returns you to the Machines page.
  5. Watch the machine start: "copying the disk" (seconds here: the page may not catch it),
     then "running" (the page refreshes by itself).
  6. Click "Serial console": after a minute or two of emulated boot, the login prompt
     (press Enter if the screen stays empty).

Logs: %s. Ctrl-C stops everything (serve, the VM, the cluster).`,
		info.PageURL, info.TokenFile, info.Image, r.logName())
	if cfg.Ready != nil {
		cfg.Ready(info)
	}
	<-ctx.Done()
	say("Stopping: serve, the VM, the cluster (at most %s; a second Ctrl-C ends at once, and may leave the VM running: virsh list)…", demoStopTimeout)
	return nil
}

// demoFatal is the panic of a demoRun's Fatal: RunDemo recovers it.
type demoFatal string

// demoRun is the demo's TB: Fatal ends RunDemo with the message, Cleanup's
// functions run at its end, last first, and the logs go to log.
type demoRun struct {
	log io.Writer
	dir string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

func (r *demoRun) Helper()      {}
func (r *demoRun) Name() string { return "demo" }
func (r *demoRun) Logf(format string, args ...any) {
	fmt.Fprintf(r.log, time.Now().Format("15:04:05 ")+format+"\n", args...)
}
func (r *demoRun) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	r.Logf(format, args...)
}
func (r *demoRun) Fatal(args ...any) { r.fail(fmt.Sprint(args...)) }
func (r *demoRun) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
}
func (r *demoRun) fail(msg string) {
	r.Errorf("%s", msg)
	panic(demoFatal(msg))
}
func (r *demoRun) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
func (r *demoRun) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// TempDir is a new folder below the demo's, removed at its end.
func (r *demoRun) TempDir() string {
	r.mu.Lock()
	r.temps++
	d := filepath.Join(r.dir, fmt.Sprint(r.temps))
	r.mu.Unlock()
	if err := os.Mkdir(d, 0o700); err != nil {
		r.Fatal(err)
	}
	return d
}

// logName names where the logs go, for the newcomer.
func (r *demoRun) logName() string {
	if f, ok := r.log.(*os.File); ok {
		return f.Name()
	}
	return "the log"
}

// stop runs the cleanups, last first, each bounded by its own waits, the
// whole bounded by demoStopTimeout, then removes the demo's folder.
func (r *demoRun) stop() error {
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	select {
	case <-done:
	case <-time.After(demoStopTimeout):
		return fmt.Errorf("the demo did not stop within %s; look for its processes (pgrep -a qemu; pgrep -a libvirtd)", demoStopTimeout)
	}
	return os.RemoveAll(r.dir)
}
