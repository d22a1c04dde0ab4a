package testnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LibvirtURI is the libvirt connection the node uses: the system
// instance, whose QEMU runs as Debian's libvirt-qemu user.
const LibvirtURI = "qemu:///system"

// libvirtStartTimeout bounds the wait for a libvirtd this package started
// to answer.
const libvirtStartTimeout = 30 * time.Second

// LibvirtTools are the commands the node runs, and the Debian package of
// each (.ci/deps installs the same).
var LibvirtTools = map[string]string{
	"libvirtd":           "libvirt-daemon-system", // the daemon, its configuration and the libvirt-qemu user
	"virtlogd":           "libvirt-daemon-system",
	"virsh":              "libvirt-clients",
	"qemu-system-x86_64": "qemu-system-x86",
	"qemu-img":           "qemu-utils",
	"nbdkit":             "nbdkit",
	"xorrisofs":          "xorriso",
}

// OVMFDir is where Debian's ovmf package puts the UEFI firmware KubeVirt's
// converter looks for.
const OVMFDir = "/usr/share/OVMF"

// Missing names each tool the node needs that is not installed, with its
// Debian package, the UEFI firmware if it is missing, and root if the
// process is not root (libvirt's system instance and the disks' owners).
func Missing() []string {
	var out []string
	for _, tool := range sortedKeys(LibvirtTools) {
		if _, err := exec.LookPath(tool); err != nil {
			out = append(out, fmt.Sprintf("%s (Debian package %s)", tool, LibvirtTools[tool]))
		}
	}
	if _, err := os.Stat(OVMFDir + "/OVMF_CODE.fd"); err != nil {
		out = append(out, OVMFDir+"/OVMF_CODE.fd (Debian package ovmf)")
	}
	if os.Geteuid() != 0 {
		out = append(out, "root (libvirt's system instance)")
	}
	return out
}

// Libvirt is a connection to libvirtd's system instance: one that was
// already running, or one StartLibvirt started (with its virtlogd) and
// Close stops. There is no systemd to start it on demand here.
type Libvirt struct {
	daemons []*exec.Cmd
	waits   []chan error
}

// StartLibvirt connects to the running libvirtd, or starts virtlogd and
// libvirtd in the foreground as children of this process (their stock
// configuration) and waits, bounded, until libvirtd answers.
func StartLibvirt(ctx context.Context, logf func(string, ...any)) (*Libvirt, error) {
	l := &Libvirt{}
	if _, err := l.virsh(ctx, "version"); err == nil {
		logf("testnode: libvirtd is running; using it")
		return l, nil
	}
	for _, d := range []string{"virtlogd", "libvirtd"} {
		cmd := exec.Command(d)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		// If this process dies, so do they; their domains die with libvirtd's
		// QEMU children only when the node destroys them (Close).
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if d == "libvirtd" {
			withoutKVM(cmd)
		}
		if err := cmd.Start(); err != nil {
			l.Close()
			return nil, fmt.Errorf("testnode: start %s: %w", d, err)
		}
		w := make(chan error, 1)
		go func() { w <- cmd.Wait() }()
		l.daemons, l.waits = append(l.daemons, cmd), append(l.waits, w)
	}
	deadline := time.Now().Add(libvirtStartTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-l.waits[1]:
			l.waits[1] <- err
			l.Close()
			return nil, fmt.Errorf("testnode: libvirtd exited while starting: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if _, last = l.virsh(ctx, "version"); last == nil {
			logf("testnode: started virtlogd and libvirtd")
			return l, nil
		}
	}
	l.Close()
	return nil, fmt.Errorf("testnode: libvirtd did not answer within %s: %v", libvirtStartTimeout, last)
}

// withoutKVM makes cmd (libvirtd) see /dev/null where /dev/kvm is, in a
// mount namespace of its own, on a host that has /dev/kvm. The node's
// domains run under software emulation, as KubeVirt's useEmulation asks;
// a /dev/kvm that QEMU can open while libvirt's check (as the qemu user)
// finds it unusable makes libvirt 9.0 throw its capabilities away and
// probe QEMU again on every lookup ("KVM was enabled when probing …, but
// it is not available now"), and a define then never returns.
func withoutKVM(cmd *exec.Cmd) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return
	}
	// Go makes the new namespace's mounts private before the exec, so the
	// bind mount stays inside it.
	cmd.Path, cmd.Args = "/bin/sh", []string{"sh", "-c", "mount --bind /dev/null /dev/kvm && exec libvirtd"}
	cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
}

// Close stops the daemons StartLibvirt started (none if it found one).
func (l *Libvirt) Close() {
	for i := len(l.daemons) - 1; i >= 0; i-- {
		_ = l.daemons[i].Process.Signal(syscall.SIGTERM)
		select {
		case <-l.waits[i]:
		case <-time.After(10 * time.Second):
			_ = l.daemons[i].Process.Kill()
			<-l.waits[i]
		}
	}
	l.daemons, l.waits = nil, nil
}

// virsh runs virsh on the system instance and returns its output; an
// error carries what virsh said.
func (l *Libvirt) virsh(ctx context.Context, args ...string) ([]byte, error) {
	return l.virshIn(ctx, nil, args...)
}

func (l *Libvirt) virshIn(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "virsh", append([]string{"-c", LibvirtURI}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("virsh %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// lifecycle is one of libvirt's lifecycle events of a domain: its event
// ("Stopped", "Crashed", ...) and detail ("Shutdown", "Destroyed",
// "Crashed", "Panicked", ...).
type lifecycle struct {
	domain, event, detail string
}

// events streams libvirt's lifecycle events of every domain (virsh event
// --loop) to fn until ctx ends or virsh exits; it returns when the stream
// is open, and done is closed when it has ended.
func (l *Libvirt) events(ctx context.Context, fn func(lifecycle)) (done <-chan struct{}, err error) {
	cmd := exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "event", "--all", "--loop", "--event", "lifecycle")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testnode: virsh event: %w", err)
	}
	d := make(chan struct{})
	var once sync.Once
	go func() {
		defer once.Do(func() { close(d) })
		defer func() { _ = cmd.Wait() }()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if e, ok := parseLifecycle(sc.Text()); ok {
				fn(e)
			}
		}
	}()
	return d, nil
}

// parseLifecycle reads virsh's line
// "event 'lifecycle' for domain 'NAME': Stopped Crashed".
func parseLifecycle(line string) (lifecycle, bool) {
	const prefix = "event 'lifecycle' for domain '"
	if !strings.HasPrefix(line, prefix) {
		return lifecycle{}, false
	}
	rest := line[len(prefix):]
	name, what, ok := strings.Cut(rest, "': ")
	if !ok {
		return lifecycle{}, false
	}
	event, detail, _ := strings.Cut(strings.TrimSpace(what), " ")
	return lifecycle{domain: name, event: event, detail: detail}, true
}

// errNoDomain is virsh's answer for a domain that does not exist.
var errNoDomain = errors.New("no such domain")

// destroy stops domain name at once and removes its definition (its NVRAM
// too); a domain that is not there is no error.
func (l *Libvirt) destroy(ctx context.Context, name string) error {
	if out, err := l.virsh(ctx, "destroy", name); err != nil && !noDomain(out) && !strings.Contains(string(out), "not running") {
		return err
	}
	if out, err := l.virsh(ctx, "undefine", "--nvram", name); err != nil && !noDomain(out) {
		return err
	}
	return nil
}

func noDomain(out []byte) bool {
	return strings.Contains(string(out), "failed to get domain") || strings.Contains(string(out), "Domain not found")
}

// domainPrefix is how a node names its domains: its own name and the
// process that runs it, so that two runs on one libvirtd (a demo and a
// test, two developers' tests) keep to their own domains.
func domainPrefix(node string, pid int) string { return fmt.Sprintf("%s-%d_", node, pid) }

// destroyOrphans destroys the domains a run of node left behind: those of
// this process, and those of a process that no longer runs (a run that
// was killed leaves its domains to libvirt, which keeps their QEMU
// running). Another live run's domains stay.
func (l *Libvirt) destroyOrphans(ctx context.Context, node string) error {
	out, err := l.virsh(ctx, "list", "--all", "--name")
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(out)) {
		if !orphaned(name, node, os.Getpid(), processRuns) {
			continue
		}
		if err := l.destroy(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// orphaned reports whether domain name is one node's run in process self
// left, or one of a run whose process no longer runs.
func orphaned(name, node string, self int, runs func(pid int) bool) bool {
	rest, ok := strings.CutPrefix(name, node+"-")
	if !ok {
		return false
	}
	digits, _, ok := strings.Cut(rest, "_")
	pid, err := strconv.Atoi(digits)
	return ok && err == nil && (pid == self || !runs(pid))
}

// processRuns reports whether process pid exists (signal 0 asks without
// sending; EPERM: it exists, another user's).
func processRuns(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
