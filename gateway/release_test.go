package gateway

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
)

// assertReleased checks that the ticket in an upload URL was ended by a
// refusal: cancelled (so no longer counted, and refused as used), not
// consumed by a transfer.
func (e *env) assertReleased(uploadURL string) {
	e.t.Helper()
	ctx := context.Background()
	tk, err := e.st.Ticket(ctx, imagestore.HashSecret(capabilityOf(uploadURL)))
	if err != nil {
		e.t.Fatalf("ticket of %s: %v", uploadURL[len(e.base):][:30], err)
	}
	if tk.UsedAt.IsZero() {
		e.t.Errorf("ticket %s is unused after a refusal that ends it", tk.UploadID)
	}
	if err := e.st.CancelTicket(ctx, tk.TenantID, tk.UploadID, e.clock.Now()); !errors.Is(err, imagestore.ErrTicketCancelled) {
		e.t.Errorf("ticket %s: CancelTicket = %v, want ErrTicketCancelled (released, not used by a transfer)", tk.UploadID, err)
	}
}

// countingStore counts the CancelTicket calls the gateway makes.
type countingStore struct {
	imagestore.Store
	cancels *atomic.Int64
}

func (c countingStore) CancelTicket(ctx context.Context, tenantID int64, uploadID string, now time.Time) error {
	c.cancels.Add(1)
	return c.Store.CancelTicket(ctx, tenantID, uploadID, now)
}

// TestRefusalReleasesTicket: an upload refused before its body for the
// request itself (too large, a creation's bytes of another type) ends its
// ticket at once: the tenant's quota has the place back, the answer says
// to ask for a new ticket, and the ticket is refused afterwards like a
// used one, on either route.
func TestRefusalReleasesTicket(t *testing.T) {
	var cancels atomic.Int64
	dir := t.TempDir()
	e := startEnv(t, dir, filepath.Join(dir, "vmshelf.db"), func(c *Config) { c.UploadMax = 1 << 20; c.ImagesPerTenant = 1 },
		func(st imagestore.Store) imagestore.Store { return countingStore{st, &cancels} })
	over := strconv.Itoa(2 << 20)
	// issue asks for a ticket at a quota of one: it fails while the
	// last case's ticket still counts.
	issue := func(what string) string {
		t.Helper()
		secret, now := imagestore.NewSecret(), e.clock.Now()
		err := e.st.CreateTicket(context.Background(), imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: e.tenant.ID,
			Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(secret), 1)
		if err != nil {
			t.Fatalf("a ticket %s at a quota of one: %v", what, err)
		}
		e.remember(secret)
		return e.base + uploadPrefix + secret
	}
	cases := []struct {
		name    string
		refuse  func(u string) (int, []byte)
		status  int
		reason  string
		withPut bool
	}{
		{"PUT with Expect", func(u string) (int, []byte) {
			resp, b := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(u, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+over+"\r\nExpect: 100-continue", nil)
			return resp.StatusCode, b
		}, 413, "tooLarge", true},
		{"PUT without Expect", func(u string) (int, []byte) {
			rc := openRaw(t, e.base, "PUT "+strings.TrimPrefix(u, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+over)
			rc.send(make([]byte, preRead), "the body's first 8 KiB")
			resp, b := rc.answer("a PUT over the limit")
			return resp.StatusCode, b
		}, 413, "tooLarge", true},
		{"tus creation", func(u string) (int, []byte) {
			resp, b := tusReq(t, "POST", u, nil, "Upload-Length", over)
			return resp.StatusCode, b
		}, 413, "tooLarge", false},
		{"tus creation with bytes of another type", func(u string) (int, []byte) {
			resp, b := tusReq(t, "POST", u, bytes.NewReader(make([]byte, 100)), "Upload-Length", "100", "Content-Type", "application/octet-stream")
			return resp.StatusCode, b
		}, 415, "badContentType", false},
	}
	u := issue("at the start")
	for i, c := range cases {
		status, body := c.refuse(u)
		if status != c.status {
			t.Fatalf("%s: %d %s, want %d", c.name, status, body, c.status)
		}
		b := errorOf(t, bytes.NewReader(body))
		if b.Reason != c.reason || !strings.Contains(b.Error, "ask for a new one") {
			t.Errorf("%s: %+v, want %s saying to ask for a new ticket", c.name, b, c.reason)
		}
		e.assertReleased(u)
		if got := cancels.Load(); got != int64(i+1) {
			t.Errorf("%s: %d CancelTicket calls so far, want %d", c.name, got, i+1)
		}
		old := u
		u = issue("after " + c.name) // the place is free again
		// The ended ticket is refused as used, whatever the route.
		resp, rb := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(old, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue", nil)
		if r := errorOf(t, bytes.NewReader(rb)); resp.StatusCode != 410 || r.Reason != "ticketUsed" {
			t.Errorf("%s: a PUT with the ended ticket: %d %+v, want 410 ticketUsed", c.name, resp.StatusCode, r)
		}
		resp, rb = tusReq(t, "POST", old, nil, "Upload-Length", "100")
		if r := errorOf(t, bytes.NewReader(rb)); resp.StatusCode != 410 || r.Reason != "ticketUsed" {
			t.Errorf("%s: a tus creation with the ended ticket: %d %+v, want 410 ticketUsed", c.name, resp.StatusCode, r)
		}
	}
	e.assertNothingLeft()
	if got := testutil.ToFloat64(e.g.metrics.released); got != float64(len(cases)) {
		t.Errorf("vmshelf_tickets_released_total = %v, want %d", got, len(cases))
	}
	if got := testutil.ToFloat64(e.g.metrics.consumed); got != 0 {
		t.Errorf("vmshelf_tickets_consumed_total = %v, want 0: no transfer started", got)
	}
}

// TestRefusalKeepsTicket: refusals before the ticket is known valid write
// nothing (a flood of guessed tickets must not cause store writes), and
// those that ask for a retry, or for a request put right, leave the ticket
// for it.
func TestRefusalKeepsTicket(t *testing.T) {
	var cancels atomic.Int64
	dir := t.TempDir()
	e := startEnv(t, dir, filepath.Join(dir, "vmshelf.db"), func(c *Config) { c.UploadMax = 1 << 20 },
		func(st imagestore.Store) imagestore.Store { return countingStore{st, &cancels} })
	over := strconv.Itoa(2 << 20)
	unknown := e.base + uploadPrefix + imagestore.NewSecret()
	expired, _ := e.ticket()
	e.clock.Advance(time.Hour)
	u, _ := e.ticket() // issued now, unlike the expired one
	for _, c := range []struct {
		name   string
		send   func() int
		status int
	}{
		{"unknown ticket over the limit", func() int {
			resp, _ := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(unknown, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+over+"\r\nExpect: 100-continue", nil)
			return resp.StatusCode
		}, 404},
		{"malformed ticket over the limit", func() int {
			resp, _ := tusReq(t, "POST", e.base+uploadPrefix+"junk", nil, "Upload-Length", over)
			return resp.StatusCode
		}, 404},
		{"expired ticket over the limit", func() int {
			resp, _ := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(expired, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+over+"\r\nExpect: 100-continue", nil)
			return resp.StatusCode
		}, 410},
		{"wrong tus version", func() int {
			resp, _ := tusReq(t, "POST", u, nil, "Upload-Length", over, "Tus-Resumable", "0.2.2")
			return resp.StatusCode
		}, 412},
		{"bad Upload-Length", func() int {
			resp, _ := tusReq(t, "POST", u, nil, "Upload-Length", "-1")
			return resp.StatusCode
		}, 400},
	} {
		if got := c.send(); got != c.status {
			t.Errorf("%s: %d, want %d", c.name, got, c.status)
		}
	}
	if n := cancels.Load(); n != 0 {
		t.Errorf("%d CancelTicket calls for refusals before a valid ticket was known, want 0", n)
	}
	e.assertTicket(u, false)
	e.assertTicket(expired, false)
	// The ticket still starts the upload it was kept for.
	if resp, b := tusReq(t, "POST", u, nil, "Upload-Length", "100"); resp.StatusCode != 201 {
		t.Errorf("creation with the kept ticket: %d %s", resp.StatusCode, b)
	}
}
