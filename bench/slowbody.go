package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/slowbody"
)

// The slowbody phase: how much a flood of clients that send the Stripe
// webhook's body at a byte a second costs a normal request of the control
// plane. A fresh GET /healthz (a new connection each) is timed on an edge
// with no load, then under the flood, with the flood's generator at the
// lowest CPU priority and at the same priority as serve: the generator
// shares the machine's two cores, so the two rows tell its cost from
// serve's.

const (
	slowBodyProbes = 200
	slowBodyGap    = 15 * time.Millisecond
	// slowBodyCap is serve's --control-max-conns here: its default.
	slowBodyCap = 512
)

// slowBodyClients is the flood's size: 2 000 clients, 1 000 in a quick run (still twice the cap).
func slowBodyClients(quick bool) int { return map[bool]int{false: 2000, true: 1000}[quick] }

// slowBodyRow is the row of the probes under the flood of n clients, its
// generator niced or not.
func slowBodyRow(n int, niced bool) string {
	if niced {
		return fmt.Sprintf("/healthz, %d slow webhook bodies, generator at nice 19", n)
	}
	return fmt.Sprintf("/healthz, %d slow webhook bodies, generator at serve's priority", n)
}

func (b *bench) phaseSlowBody() error {
	clients := slowBodyClients(b.opt.quick)
	unloaded, niced, same := "/healthz, no load", slowBodyRow(clients, true), slowBodyRow(clients, false)
	t := b.rep.table("slowbody", "Control plane under slow webhook bodies",
		fmt.Sprintf("%d probes of `GET /healthz`, each on a new connection, %d ms apart, on a vmshelf with `STRIPE_WEBHOOK_SECRET` set and `--control-max-conns %d` (the default): "+
			"first with no other load, then while %d clients each send `POST /market/stripe/webhook` with `Content-Length: 900000` and then its body a byte a second, connecting again whenever cut "+
			"(at the cap the control plane cuts the body reader that has gone longest without a byte). The generator is the bench binary re-run as `bench slowbody ADDR N`, "+
			"started with `nice -n 19` or at serve's own priority: it shares the two cores with serve, and the two rows tell its cost from serve's. "+
			"The probes start once every client has connected and %d more connections were made (the flood's steady state). Latency: from before the dial to the end of the answer. "+
			"Server CPU: the vmshelf process during the probes, in cores.", slowBodyProbes, slowBodyGap.Milliseconds(), slowBodyCap, clients, slowBodyCap),
		Metric{Key: "p50", Label: "p50 ms", Unit: "ms", Better: "lower", digits: 2},
		Metric{Key: "p99", Label: "p99 ms", Unit: "ms", Better: "lower", digits: 2},
		Metric{Key: "max", Label: "max ms", Unit: "ms", Better: "lower", digits: 1},
		Metric{Key: "failed", Label: "failed probes", digits: 0},
		Metric{Key: "cores", Label: "server CPU cores", Unit: "cores", Better: "lower", digits: 2},
	)
	v, err := startVmshelfWith(b.vmBin, b.dir, "vmshelf-slowbody", 1, []string{"--control-max-conns", strconv.Itoa(slowBodyCap)},
		[]string{"STRIPE_WEBHOOK_SECRET=whsec_bench_slowbody"})
	if err != nil {
		return fmt.Errorf("starting vmshelf with a webhook secret: %w", err)
	}
	defer v.stop()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	items := []string{unloaded, niced, same}
	for _, s := range items {
		t.row(s, "vmshelf")
	}
	for r := range b.opt.reps {
		for _, s := range rotate(items, r) {
			logf("  slowbody rep %d: %s", r+1, s)
			settle()
			var gen *slowBodyGen
			if s != unloaded {
				if gen, err = startSlowBodyGen(self, v.ctlAddr, clients, s == niced); err != nil {
					b.fail("slowbody %s rep %d: %v", s, r+1, err)
					continue
				}
			}
			pr := b.startPerf("slowbody", v.proc.pids())
			m := startMeter(v.proc.pids)
			probes, errs := slowbody.Probe(v.ctlAddr, slowBodyProbes, slowBodyGap)
			use := m.end()
			lat, failed := make([]float64, len(probes)), len(errs)
			for i, d := range probes {
				lat[i] = float64(d) / float64(time.Millisecond)
			}
			pr.stop()
			if gen != nil {
				gen.stop()
			}
			if len(lat) == 0 {
				b.fail("slowbody %s rep %d: every probe failed", s, r+1)
				continue
			}
			if failed > 0 {
				b.fail("slowbody %s rep %d: %d of %d /healthz probes failed", s, r+1, failed, slowBodyProbes)
			}
			p := func(q float64) float64 { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
			logf("    → p50 %.2f ms, p99 %.2f ms, max %.1f ms, %d failed, serve %.2f cores", p(0.5), p(0.99), lat[len(lat)-1], failed, use.CPU/use.Wall)
			t.add(s, "vmshelf", "p50", p(0.5))
			t.add(s, "vmshelf", "p99", p(0.99))
			t.add(s, "vmshelf", "max", lat[len(lat)-1])
			t.add(s, "vmshelf", "failed", float64(failed))
			t.add(s, "vmshelf", "cores", use.CPU/use.Wall)
		}
	}
	for _, s := range []string{niced, same} {
		t.ratio("p99", s, unloaded, "p99")
	}
	return nil
}

// slowBodyGen is a running `bench slowbody` process.
type slowBodyGen struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startSlowBodyGen starts `bench slowbody ADDR N` (under nice -n 19 when
// niced) and waits, at most a minute, for its steady state: every client
// connected and slowBodyCap more connections made.
func startSlowBodyGen(self, addr string, n int, niced bool) (*slowBodyGen, error) {
	argv := []string{self, "slowbody", addr, strconv.Itoa(n)}
	if niced {
		argv = append([]string{"nice", "-n", "19"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &slowBodyGen{cmd: cmd, done: make(chan struct{})}
	steady := make(chan struct{})
	go func() {
		defer close(g.done)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			var made int
			if _, err := fmt.Sscanf(sc.Text(), "made %d", &made); err == nil && made >= n+slowBodyCap {
				once.Do(func() { close(steady) })
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-steady:
		return g, nil
	case <-g.done:
		return nil, fmt.Errorf("the slow-body generator ended before its steady state")
	case <-time.After(time.Minute):
		g.stop()
		return nil, fmt.Errorf("the slow-body generator made fewer than %d connections in a minute", n+slowBodyCap)
	}
}

func (g *slowBodyGen) stop() {
	_ = g.cmd.Process.Kill()
	<-g.done
}

// runSlowBody is the "slowbody" subcommand: n clients send the webhook's
// head to addr and then its body a byte a second, each connecting again
// when cut, until the process is killed; every 200 ms it prints "made K",
// the connections made so far.
func runSlowBody(addr string, n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(n)+256 {
		lim.Cur = min(lim.Max, uint64(n)+256)
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	flood := slowbody.Start(context.Background(), addr, n, time.Second, slowbody.WebhookHead)
	w := bufio.NewWriter(os.Stdout)
	for {
		time.Sleep(200 * time.Millisecond)
		fmt.Fprintf(w, "made %d\n", flood.Made.Load())
		if err := w.Flush(); err != nil {
			return err
		}
	}
}

// slowBodyArgs parses the subcommand's arguments: ADDR N.
func slowBodyArgs(args []string) (string, int, error) {
	if len(args) != 2 {
		return "", 0, fmt.Errorf("usage: bench slowbody ADDR N")
	}
	n, err := strconv.Atoi(args[1])
	if err != nil || n < 1 {
		return "", 0, fmt.Errorf("bench slowbody: N %q is not a positive number", args[1])
	}
	if _, _, err := net.SplitHostPort(args[0]); err != nil || strings.TrimSpace(args[0]) == "" {
		return "", 0, fmt.Errorf("bench slowbody: ADDR %q: %v", args[0], err)
	}
	return args[0], n, nil
}
