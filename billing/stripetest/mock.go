package stripetest

// Stripe's own API mock, stripe-mock, for the tests that check request
// shapes against Stripe's OpenAPI: the billing package's and the README
// walk-through's. It keeps no state; Server (stripetest.go) is the
// stand-in that remembers.

import (
	"bufio"
	"bytes"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/gobin"
)

// MockInstall is how a developer gets stripe-mock (README and .ci/run
// say the same).
const MockInstall = "go install github.com/stripe/stripe-mock@v0.203.0"

// MockPath finds stripe-mock on PATH or where go install puts it.
// Missing, it fails the test in CI and skips it loudly elsewhere.
func MockPath(t testing.TB) string {
	t.Helper()
	return gobin.Need(t, "stripe-mock", "Stripe's API mock", MockInstall)
}

// StartMock runs the stripe-mock at bin (MockPath's) on loopback ports of the kernel's
// choosing and returns its HTTP base once the port accepts. The ports are
// read from its "Listening for HTTP at address" line, so no port is
// guessed and none raced for.
func StartMock(t testing.TB, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:", "-https-addr", "127.0.0.1:")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting stripe-mock: %v", err)
	}
	addr := make(chan string, 1)
	var lines []string // what it said, for a failure
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		// Drains its output to the end, or stripe-mock, which logs every
		// request, would block on a full pipe.
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mu.Lock()
			if len(lines) < 50 {
				lines = append(lines, sc.Text())
			}
			mu.Unlock()
			if a, ok := strings.CutPrefix(sc.Text(), "Listening for HTTP at address: "); ok {
				select {
				case addr <- strings.TrimSpace(a):
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	said := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n") + stderr.String()
	}

	// Loading its OpenAPI spec takes a few seconds on a small machine.
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	var a string
	select {
	case a = <-addr:
	case <-done:
		t.Fatalf("stripe-mock ended before listening:\n%s", said())
	case <-deadline.C:
		t.Fatalf("stripe-mock did not listen within 60 s:\n%s", said())
	}
	// The line comes after the listen; a bounded poll confirms the port
	// accepts before the first call.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
			return "http://" + a
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("stripe-mock at %s does not accept: %v\n%s", a, err, said())
		}
	}
}
