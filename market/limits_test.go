package market

import (
	"net/http"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/imagestore"
)

// session starts a resumable upload for t straight in the store, the way
// the data plane does: a ticket is issued and consumed into a session.
func (e *env) session(t imagestore.Tenant, name string, length int64) imagestore.UploadSession {
	e.t.Helper()
	ctx := e.t.Context()
	ticket, id := imagestore.NewSecret(), imagestore.NewSecret()
	now := e.clock.Now()
	tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: t.ID, Name: name, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := e.st.CreateTicket(ctx, tk, imagestore.HashSecret(ticket), 0); err != nil {
		e.t.Fatalf("CreateTicket: %v", err)
	}
	us, err := e.st.StartSession(ctx, imagestore.HashSecret(ticket), imagestore.HashSecret(id), imagestore.UploadSession{
		Length: length, HashState: []byte{}, CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}, now)
	if err != nil {
		e.t.Fatalf("StartSession: %v", err)
	}
	return us
}

// A tenant at 0 of 3 images with 3 unfinished resumable uploads has no
// room for a fourth: the sessions count, and status shows their bytes.
func TestTicketQuotaCountsSessions(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	s1 := e.session(alice, "one", 1000)
	s2 := e.session(alice, "two", 2000)
	s3 := e.session(alice, "three", 3000)
	if err := e.st.SaveProgress(t.Context(), s2.UploadID, 512, []byte{}, t0.Add(48*time.Hour)); err != nil {
		t.Fatal(err)
	}

	wantError(t, e.post("/market/vm-images/ticket", token, `{"name":"four"}`), http.StatusConflict, "imageQuota")

	r := e.post("/market/vms/status", token, "")
	if r.status != http.StatusOK {
		t.Fatalf("status: %d %s", r.status, r.body)
	}
	var got struct {
		Sessions []sessionInfo `json:"sessions"`
	}
	decode(t, r, &got)
	want := []sessionInfo{
		{s1.UploadID, "one", 0, 1000, t0.Add(24 * time.Hour)},
		{s2.UploadID, "two", 512, 2000, t0.Add(48 * time.Hour)},
		{s3.UploadID, "three", 0, 3000, t0.Add(24 * time.Hour)},
	}
	// Same creation time: the store orders by upload id.
	sortSessions(want)
	if len(got.Sessions) != len(want) {
		t.Fatalf("sessions %+v, want %+v", got.Sessions, want)
	}
	for i := range want {
		g := got.Sessions[i]
		if g.UploadID != want[i].UploadID || g.Name != want[i].Name || g.Offset != want[i].Offset ||
			g.Length != want[i].Length || !g.ExpiresAt.Equal(want[i].ExpiresAt) {
			t.Errorf("session %d: %+v, want %+v", i, g, want[i])
		}
	}

	// One upload finishes: it is an image now, counted once, so the quota
	// is still full; ending another frees a slot.
	if err := e.st.AddImage(t.Context(), imagestore.Image{UploadID: s1.UploadID, TenantID: alice.ID, Name: "one",
		Size: 1000, VirtualSize: 1, SHA256: "00", CreatedAt: t0}, 3); err != nil {
		t.Fatal(err)
	}
	if err := e.st.SaveProgress(t.Context(), s1.UploadID, 1000, []byte{}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	wantError(t, e.post("/market/vm-images/ticket", token, `{"name":"four"}`), http.StatusConflict, "imageQuota")
	if err := e.st.EndSession(t.Context(), s3.UploadID); err != nil {
		t.Fatal(err)
	}
	if r := e.post("/market/vm-images/ticket", token, `{"name":"four"}`); r.status != http.StatusCreated {
		t.Fatalf("after an upload ended: %d %s", r.status, r.body)
	}
	decode(t, e.post("/market/vms/status", token, ""), &got)
	if len(got.Sessions) != 1 || got.Sessions[0].UploadID != s2.UploadID {
		t.Errorf("sessions after one finished and one ended: %+v, want only %s", got.Sessions, s2.UploadID)
	}
}

func sortSessions(s []sessionInfo) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j].UploadID < s[i].UploadID {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

// Tickets are rate-limited per tenant with a token bucket on the
// injected clock: the burst is served, then 429 rateLimited with
// Retry-After in whole seconds, rounded up.
func TestTicketRateLimited(t *testing.T) {
	cases := []struct {
		name        string
		rate        rate.Limit
		burst       int
		retryAfter  string
		refillAfter time.Duration // from the refusal to the next token
	}{
		{"defaults", 0, 0, "1", time.Second},
		{"one every 4 s", 0.25, 2, "4", 4 * time.Second},
		{"four a second", 4, 3, "1", 250 * time.Millisecond},
		{"one every 2.5 s", 0.4, 1, "3", 2500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				cfg.ImagesPerTenant = 1000
				cfg.TicketRate, cfg.TicketBurst = c.rate, c.burst
			})
			_, token := e.tenant("alice", true)
			_, bobToken := e.tenant("bob", true)
			burst := c.burst
			if burst == 0 {
				burst = DefaultTicketBurst
			}
			for i := range burst {
				if r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`); r.status != http.StatusCreated {
					t.Fatalf("ticket %d of the burst: %d %s", i+1, r.status, r.body)
				}
			}
			r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`)
			wantError(t, r, http.StatusTooManyRequests, "rateLimited")
			if ra := r.header.Get("Retry-After"); ra != c.retryAfter {
				t.Errorf("Retry-After %q, want %q", ra, c.retryAfter)
			}
			// Another tenant has its own bucket.
			if r := e.post("/market/vm-images/ticket", bobToken, `{"name":"disk"}`); r.status != http.StatusCreated {
				t.Errorf("bob: %d %s", r.status, r.body)
			}
			// A millisecond before the next token: still refused (and the
			// refusal spent nothing); at it: served. (x/time/rate counts
			// tokens in float64: a nanosecond is below its precision.)
			e.clock.Advance(c.refillAfter - time.Millisecond)
			r = e.post("/market/vm-images/ticket", token, `{"name":"disk"}`)
			wantError(t, r, http.StatusTooManyRequests, "rateLimited")
			if ra := r.header.Get("Retry-After"); ra != "1" {
				t.Errorf("Retry-After a millisecond before the token: %q, want 1 (rounded up)", ra)
			}
			e.clock.Advance(time.Millisecond)
			if r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`); r.status != http.StatusCreated {
				t.Errorf("after the refill: %d %s", r.status, r.body)
			}
		})
	}
}

// The buckets are keyed by tenant and dropped once idle long enough to be
// full again, so the map holds only recently active tenants.
func TestTicketLimiterBounded(t *testing.T) {
	l := newTenantLimiter(1, 10)
	for id := range int64(100) {
		if _, ok := l.take(id, t0); !ok {
			t.Fatalf("tenant %d refused its first token", id)
		}
	}
	if n := l.size(); n != 100 {
		t.Fatalf("%d buckets, want 100", n)
	}
	// 10 s later every bucket is full again: the next request drops them.
	if _, ok := l.take(7, t0.Add(10*time.Second)); !ok {
		t.Fatal("tenant 7 refused after 10 s")
	}
	if n := l.size(); n != 1 {
		t.Errorf("%d buckets after all went idle, want 1", n)
	}
	// A bucket that is not full again is kept: dropping it would give
	// its tenant a fresh burst. Tenant 8 spends its burst 5 s before the
	// next sweep (at t0+20s), tenant 7 is idle from t0+10s on.
	at := t0.Add(15 * time.Second)
	for range 10 {
		if _, ok := l.take(8, at); !ok {
			t.Fatal("tenant 8 refused within its burst")
		}
	}
	at = t0.Add(20 * time.Second)
	for i := range 5 { // 5 tokens came back in 5 s
		if _, ok := l.take(8, at); !ok {
			t.Fatalf("tenant 8 refused token %d of the 5 refilled", i+1)
		}
	}
	if _, ok := l.take(8, at); ok {
		t.Error("tenant 8 got a 6th token 5 s after spending its burst: its bucket was dropped while not full")
	}
	if n := l.size(); n != 1 {
		t.Errorf("%d buckets, want 1 (tenant 7 idle for 10 s is dropped)", n)
	}
}
