// Package slowbody is the flood of the slow-body attack on the control
// plane and the probe that measures what it costs a normal request: many
// clients that send a request head and then its body a byte a second,
// connecting again whenever cut, and fresh GET /healthz requests timed
// beside them. The end-to-end test and the bench share it, so that what
// the test holds and what the bench measures are one attack.
package slowbody

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// WebhookHead is the Stripe webhook's request head with a body of 900 000
// bytes announced: the control plane's public route with the largest body.
const WebhookHead = "POST /market/stripe/webhook HTTP/1.1\r\nHost: vmshelf\r\nContent-Type: application/json\r\n" +
	"Stripe-Signature: t=1,v1=00\r\nContent-Length: 900000\r\n\r\n"

// TicketHead is the ticket route's request head with token as the
// tenant's bearer token and a body of 60 000 bytes announced.
func TicketHead(token string) string {
	return "POST /market/vm-images/ticket HTTP/1.1\r\nHost: vmshelf\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer " + token + "\r\nContent-Length: 60000\r\n\r\n"
}

// Flood runs n clients against addr until ctx ends; client i sends
// heads[i % len(heads)], then its body a byte every interval, and
// connects again when cut. Made counts the connections made; Wait returns
// once every client has stopped.
type Flood struct {
	Made atomic.Int64
	wg   sync.WaitGroup
}

// Start starts the flood's clients.
func Start(ctx context.Context, addr string, n int, interval time.Duration, heads ...string) *Flood {
	f := &Flood{}
	for i := range n {
		head := heads[i%len(heads)]
		f.wg.Go(func() {
			for ctx.Err() == nil {
				c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
				if err != nil {
					// The backlog is full, or the flood ends: not again at once.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				f.Made.Add(1)
				trickle(ctx, c, head, interval)
				c.Close()
			}
		})
	}
	return f
}

// Wait returns once every client of the flood has stopped (its ctx ended).
func (f *Flood) Wait() { f.wg.Wait() }

// trickle writes head and its body's first byte, then a byte every
// interval until a write fails (the server cut the connection) or ctx ends.
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

// Probe sends n GET /healthz to addr, each on a new connection, gap apart,
// and returns the latencies of those answered 200 (from before the dial
// to the end of the answer), sorted, and the errors of the others.
func Probe(addr string, n int, gap time.Duration) ([]time.Duration, []error) {
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
	slices.Sort(lat)
	return lat, errs
}

// Percentile is the p-th (0..1) of sorted latencies, 0 for none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}
