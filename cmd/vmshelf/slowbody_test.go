package main

// Process-level test of the control plane under clients that send their
// request body at a byte a second: they must not keep a normal request
// waiting.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// slowBodies runs n clients against the control plane at addr until ctx
// ends: each sends a request head (half on the public webhook, half on the
// ticket route with a valid token), then its body a byte at a time, one
// every interval, and connects again when cut. made counts the
// connections made; wait returns once every client has stopped.
func slowBodies(ctx context.Context, addr, token string, n int, interval time.Duration) (made *atomic.Int64, wait func()) {
	var wg sync.WaitGroup
	made = new(atomic.Int64)
	heads := []string{
		"POST /market/stripe/webhook HTTP/1.1\r\nHost: vmshelf\r\nContent-Type: application/json\r\n" +
			"Stripe-Signature: t=1,v1=00\r\nContent-Length: 900000\r\n\r\n",
		"POST /market/vm-images/ticket HTTP/1.1\r\nHost: vmshelf\r\nContent-Type: application/json\r\n" +
			"Authorization: Bearer " + token + "\r\nContent-Length: 60000\r\n\r\n",
	}
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
				if err != nil {
					continue
				}
				made.Add(1)
				trickle(ctx, c, heads[i%2], interval)
				c.Close()
			}
		})
	}
	return made, wg.Wait
}

// trickle writes head and then a byte every interval until a write fails
// (the server closed) or ctx ends.
func trickle(ctx context.Context, c net.Conn, head string, interval time.Duration) {
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, head+"{"); err != nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(" ")); err != nil {
			return
		}
	}
}

// probeLatencies sends n GET /healthz, each on a new connection, every
// gap, and returns their latencies and the errors of those that failed.
func probeLatencies(addr string, n int, gap time.Duration) ([]time.Duration, []error) {
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 2 * time.Second}
	var lat []time.Duration
	var errs []error
	for i := range n {
		start := time.Now()
		resp, err := client.Get("http://" + addr + "/healthz")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("probe %d: %w", i, err))
		} else {
			lat = append(lat, time.Since(start))
		}
		time.Sleep(gap) // pacing the probes, not synchronising
	}
	return lat, errs
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestE2EControlSlowBodies: with the control plane's slots all taken by
// clients sending their body at a byte a second (on the public webhook
// and, with a valid token, on the ticket route), a new /healthz is
// answered within 100 ms at the 99th percentile and never reset: at the
// cap the body reader that has gone longest without a byte makes room.
// Before, a body reader was never evicted: the probes waited for the
// 10 s body timeout of the clients ahead of them, or were reset.
//
// VMSHELF_SLOWBODY_CLIENTS and VMSHELF_SLOWBODY_CAP change the 200
// clients and the cap of 64 (e.g. 2000 and 512 to measure by hand).
func TestE2EControlSlowBodies(t *testing.T) {
	clients, capN := envInt(t, "VMSHELF_SLOWBODY_CLIENTS", 200), envInt(t, "VMSHELF_SLOWBODY_CAP", 64)
	// 200 probes: the 99th percentile is the second slowest, so one
	// scheduling hiccup of a loaded machine is not a failure.
	const probes, gap = 200, 15 * time.Millisecond
	raiseNoFile(t, uint64(4*clients+1000))
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--control-max-conns", strconv.Itoa(capN)},
		"STRIPE_WEBHOOK_SECRET=whsec_slowbody")

	ctx, cancel := context.WithCancel(context.Background())
	made, wait := slowBodies(ctx, s.ctlAddr, s.token, clients, time.Second)
	defer func() { cancel(); wait() }()
	// The flood fills the cap (the first eviction shows it), and is in
	// its steady state once every client has connected and those beyond
	// the cap keep coming back. While 2 000 clients connect at once, this
	// test's own requests may reach serve later than its accept of them
	// by more than the flood's silent connections (both processes share
	// two cores), so a scrape here may be cut like one of those: tried
	// again. The probes run in the steady state.
	for i := 0; ; i++ {
		if evictedControl(s) > 0 {
			break
		}
		if i == 500 {
			t.Fatalf("no control-plane eviction within 10s of %d slow clients against a cap of %d", clients, capN)
		}
		time.Sleep(20 * time.Millisecond) // polling a counter: there is no event to wait on
	}
	for i := 0; made.Load() < int64(clients+capN); i++ {
		if i == 2000 {
			t.Fatalf("%d connections of %d slow clients after 20s", made.Load(), clients)
		}
		time.Sleep(10 * time.Millisecond) // polling a count: there is no event to wait on
	}
	lat, errs := probeLatencies(s.ctlAddr, probes, gap)
	cancel()
	wait()

	p50, p90, p99 := percentile(lat, 0.5), percentile(lat, 0.9), percentile(lat, 0.99)
	t.Logf("%d slow-body clients (%d connections), cap %d: /healthz p50 %v p90 %v p99 %v max %v, %d of %d failed",
		clients, made.Load(), capN, p50, p90, p99, percentile(lat, 1), len(errs), probes)
	for _, err := range errs {
		t.Errorf("a /healthz probe failed under the slow bodies: %v", err)
	}
	if p99 > 100*time.Millisecond {
		t.Errorf("/healthz p99 %v under %d slow-body clients, want ≤ 100ms", p99, clients)
	}
	s.alive(t)
}

// evictedControl is vmshelf_connections_evicted_total{plane="control"},
// or 0 if the scrape failed.
func evictedControl(s *server) float64 {
	resp, err := httpClient.Get(s.ctlBase + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0
	}
	v, _ := metricValue(mfs, "vmshelf_connections_evicted_total", map[string]string{"plane": "control"})
	return v
}

// envInt is the integer in variable name, or def when unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive whole number", name, v)
	}
	return n
}
