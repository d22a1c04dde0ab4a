package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/unavailable"
)

// errOutage is what a record store that stopped, was killed or stalls
// answers (imagestore.ErrStoreUnavailable).
var errOutage = fmt.Errorf("postgres: create ticket: commit: %w: unexpected EOF", imagestore.ErrStoreUnavailable)

// ticketMode is how an outageStore's CreateTicket fails.
type ticketMode int

const (
	ticketWorks    ticketMode = iota
	ticketRefused             // the write did not land
	ticketLanded              // the write landed, its answer was lost
	ticketLate                // the write lands after the caller gave up (lateWrite)
	ticketSlowDone            // the write waits for the caller to leave, then lands and answers
)

// outageStore is the market's store with a hand on the calls that meet a
// record store's outage.
type outageStore struct {
	Store
	mu          sync.Mutex
	authDown    bool // TenantByToken and Ping fail
	tickets     ticketMode
	withdrawals int // WithdrawTicket fails this many more times
	// withdrawn is closed by the first withdrawal that succeeds; a late
	// write (ticketLate) waits for it, then answers on late.
	withdrawn chan struct{}
	late      chan error
}

func (s *outageStore) set(f func(s *outageStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *outageStore) TenantByToken(ctx context.Context, token imagestore.Hash) (imagestore.Tenant, error) {
	s.mu.Lock()
	down := s.authDown
	s.mu.Unlock()
	if down {
		return imagestore.Tenant{}, errOutage
	}
	return s.Store.TenantByToken(ctx, token)
}

func (s *outageStore) Ping(ctx context.Context) error {
	s.mu.Lock()
	down := s.authDown
	s.mu.Unlock()
	if down {
		return errOutage
	}
	return s.Store.Ping(ctx)
}

func (s *outageStore) CreateTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, quota int) error {
	s.mu.Lock()
	mode, withdrawn := s.tickets, s.withdrawn
	s.mu.Unlock()
	switch mode {
	case ticketRefused:
		return errOutage
	case ticketLanded:
		if err := s.Store.CreateTicket(ctx, tk, ticket, quota); err != nil {
			return err
		}
		return errOutage
	case ticketLate:
		go func() {
			<-withdrawn // the order in which a stalled server may finish the two
			s.late <- s.Store.CreateTicket(context.Background(), tk, ticket, quota)
		}()
		return errOutage
	case ticketSlowDone:
		<-ctx.Done()
		return s.Store.CreateTicket(context.Background(), tk, ticket, quota)
	}
	return s.Store.CreateTicket(ctx, tk, ticket, quota)
}

func (s *outageStore) WithdrawTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.withdrawals > 0 {
		s.withdrawals--
		return errOutage
	}
	err := s.Store.WithdrawTicket(ctx, tk, ticket, now)
	if err == nil && s.withdrawn != nil {
		close(s.withdrawn)
		s.withdrawn = nil
	}
	return err
}

// outageEnv is env's control plane over an outageStore.
type outageEnv struct {
	*env
	st  *outageStore
	srv *Server
	url string
	reg *prometheus.Registry
}

func newOutageEnv(t *testing.T) *outageEnv {
	t.Helper()
	e := newEnv(t)
	o := &outageEnv{env: e, st: &outageStore{Store: e.st}, reg: prometheus.NewRegistry()}
	cfg := e.cfg
	cfg.ImagesPerTenant = 1
	var err error
	if o.srv, err = New(cfg, o.st, e.blobs, o.reg, o.reg); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(o.srv.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := o.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	o.url = ts.URL
	return o
}

func (o *outageEnv) ticket(token string) response {
	o.t.Helper()
	req, err := http.NewRequest(http.MethodPost, o.url+"/market/vm-images/ticket", strings.NewReader(`{"name":"disk"}`))
	if err != nil {
		o.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	return o.send(req)
}

// requests is the request counter of the ticket route for code.
func (o *outageEnv) requests(code int) float64 {
	return testutil.ToFloat64(o.srv.metrics.requests.WithLabelValues("/market/vm-images/ticket", strconv.Itoa(code)))
}

// waitNoTicket waits (bounded) until the tenant has no unused ticket: the
// withdrawal ran.
func (o *outageEnv) waitNoTicket(tn imagestore.Tenant) {
	o.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tks, err := o.env.st.UnusedTickets(context.Background(), tn.ID, o.clock.Now())
		if err == nil && len(tks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			o.t.Fatalf("unused tickets 10 s on: %+v (%v); want none", tks, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the store, not waiting for time
	}
}

func wantStoreUnreachable(t *testing.T, what string, r response) {
	t.Helper()
	wantError(t, r, http.StatusServiceUnavailable, "storeUnreachable")
	if got := r.header.Get("Retry-After"); got != strconv.Itoa(unavailable.RetryAfter) {
		t.Errorf("%s: Retry-After %q, want %d", what, got, unavailable.RetryAfter)
	}
}

// TestStoreOutageRoutes: with the record store unreachable, every tenant
// route is answered 503 storeUnreachable with Retry-After, never 500.
func TestStoreOutageRoutes(t *testing.T) {
	o := newOutageEnv(t)
	_, token := o.tenant("box", true)
	o.st.set(func(s *outageStore) { s.authDown = true })
	for _, path := range []string{"/market/vm-images/ticket", "/market/vms/status", "/market/vm-images/remove", "/market/vm-images/ticket/cancel"} {
		req, err := http.NewRequest(http.MethodPost, o.url+path, strings.NewReader(`{"upload_id":"000000000000000000000001"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		wantStoreUnreachable(t, path, o.send(req))
	}
	if got := o.requests(http.StatusInternalServerError); got != 0 {
		t.Errorf("%v ticket requests counted 500", got)
	}
	if strings.Contains(o.logs.String(), "status=500") {
		t.Errorf("an outage was logged as our fault:\n%s", o.logs)
	}
}

// TestTicketNotMadeBehindTheClient: a ticket request that did not get its
// 201 leaves no ticket, and its tenant's place is free again at once:
// whether the store's write did not land, landed with its answer lost,
// lands only after the withdrawal, or lands while the client has left.
// The requests are counted as the client got them.
func TestTicketNotMadeBehindTheClient(t *testing.T) {
	for _, tc := range []struct {
		name        string
		mode        ticketMode
		withdrawals int // failing tries of the withdrawal first
	}{
		{"not written", ticketRefused, 0},
		{"written, answer lost", ticketLanded, 0},
		{"written, answer lost, the store still down", ticketLanded, 3},
		{"written after the withdrawal", ticketLate, 0},
		{"written while the client left", ticketSlowDone, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOutageEnv(t)
			tn, token := o.tenant("box", true)
			o.st.set(func(s *outageStore) {
				s.tickets, s.withdrawals = tc.mode, tc.withdrawals
				if tc.mode == ticketLate {
					s.withdrawn, s.late = make(chan struct{}), make(chan error, 1)
				}
			})
			if tc.mode == ticketSlowDone {
				req, err := http.NewRequest(http.MethodPost, o.url+"/market/vm-images/ticket", strings.NewReader(`{"name":"disk"}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				if resp, err := http.DefaultClient.Do(req.WithContext(ctx)); err == nil {
					resp.Body.Close()
					t.Fatalf("the client that left got an answer: %d", resp.StatusCode)
				}
				// Its handler finishes after the client left.
				waitCount(t, func() float64 { return o.requests(statusClientGone) }, 1)
			} else {
				wantStoreUnreachable(t, "ticket", o.ticket(token))
			}
			o.waitNoTicket(tn)
			if tc.mode == ticketLate {
				if err := withTimeout(t, o.st.late, "the late write"); !errors.Is(err, imagestore.ErrExists) {
					t.Errorf("the write that landed after the withdrawal: %v, want it refused (ErrExists)", err)
				}
				o.waitNoTicket(tn)
			}
			o.st.set(func(s *outageStore) { s.tickets = ticketWorks })
			if r := o.ticket(token); r.status != http.StatusCreated {
				t.Fatalf("a ticket at quota 1 after the failed one: %d %s, want 201: the place is free", r.status, r.body)
			}
			want503, want499 := 1.0, 0.0
			if tc.mode == ticketSlowDone {
				want503, want499 = 0, 1
			}
			if got := o.requests(http.StatusServiceUnavailable); got != want503 {
				t.Errorf("ticket requests counted 503: %v, want %v", got, want503)
			}
			if got := o.requests(statusClientGone); got != want499 {
				t.Errorf("ticket requests counted 499 (the client left): %v, want %v", got, want499)
			}
			if got := o.requests(http.StatusCreated); got != 1 {
				t.Errorf("ticket requests counted 201: %v, want 1 (only the ticket answered)", got)
			}
			if got := testutil.ToFloat64(o.srv.metrics.ticketsIssued); got != 1 {
				t.Errorf("tickets issued: %v, want 1", got)
			}
		})
	}
}

// waitCount waits (bounded) until count() reaches want: the router counts
// a request once its handler returned, which the client that left does
// not see.
func waitCount(t *testing.T, count func() float64, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count() < want {
		if time.Now().After(deadline) {
			t.Fatalf("count %v 10 s on, want %v", count(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReadyzLogsChanges: /readyz says storeUnreachable while the record
// store does not answer, and logs one line when it stops being ready and
// one when it is ready again, however many probes come: never a line per
// probe.
func TestReadyzLogsChanges(t *testing.T) {
	o := newOutageEnv(t)
	get := func() response {
		req, err := http.NewRequest(http.MethodGet, o.url+"/readyz", nil)
		if err != nil {
			t.Fatal(err)
		}
		return o.send(req)
	}
	if r := get(); r.status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", r.status, r.body)
	}
	o.st.set(func(s *outageStore) { s.authDown = true })
	for range 6 {
		r := get()
		if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), `"reason":"storeUnreachable"`) {
			t.Fatalf("/readyz with the store down: %d %s", r.status, r.body)
		}
	}
	o.st.set(func(s *outageStore) { s.authDown = false })
	for range 3 {
		if r := get(); r.status != http.StatusOK {
			t.Fatalf("/readyz once the store is back: %d %s", r.status, r.body)
		}
	}
	logs := o.logs.String()
	for msg, want := range map[string]int{`msg="not ready"`: 1, `msg="ready again"`: 1, "control request failed": 0} {
		if n := strings.Count(logs, msg); n != want {
			t.Errorf("%d lines with %s, want %d:\n%s", n, msg, want, logs)
		}
	}
}
