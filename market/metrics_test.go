package market

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func (e *env) scrape() string {
	e.t.Helper()
	r := e.do(http.MethodGet, "/metrics", "", nil)
	if r.status != http.StatusOK {
		e.t.Fatalf("/metrics: %d %s", r.status, r.body)
	}
	return string(r.body)
}

func wantLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for l := range strings.SplitSeq(text, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("metrics lack %q", l)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	e.image(alice, "12345") // 5 bytes
	if r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`); r.status != http.StatusCreated {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/no/such/path/12345", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("unknown path: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/market/vm-images/ticket", token, nil); r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET ticket: %d %s", r.status, r.body)
	}

	text := e.scrape()
	wantLines(t, text,
		"vmshelf_tickets_issued_total 1",
		"vmshelf_tickets_expired_total 0",
		"vmshelf_images_stored 1",
		"vmshelf_images_stored_bytes 5",
		`vmshelf_control_requests_total{code="201",route="/market/vm-images/ticket"} 1`,
		`vmshelf_control_requests_total{code="405",route="/market/vm-images/ticket"} 1`,
		`vmshelf_control_requests_total{code="404",route="other"} 1`,
		"# TYPE vmshelf_tickets_issued_total counter",
		"# TYPE vmshelf_images_stored gauge",
	)
	// The free space the 507 check uses, for the full-disk alert.
	var free []float64
	for l := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(l, "vmshelf_image_storage_free_bytes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("vmshelf_image_storage_free_bytes %q: %v", v, err)
			}
			free = append(free, f)
		}
	}
	// Other processes write to the same disk: the value moves, so only its
	// presence (once) and sign are exact.
	if len(free) != 1 || free[0] <= 0 {
		t.Errorf("vmshelf_image_storage_free_bytes = %v, want one sample of the free bytes", free)
	}
	// Raw paths never become labels.
	if strings.Contains(text, "12345\"") || strings.Contains(text, "/no/such") {
		t.Error("a raw request path became a metric label")
	}

	// A refused ticket is not an issued one.
	wantError(t, e.post("/market/vm-images/ticket", token, `{"name":""}`), http.StatusBadRequest, "badRequest")
	wantLines(t, e.scrape(), "vmshelf_tickets_issued_total 1")
}

// With the store gone, the counters are still scraped; only the store's
// gauges drop out.
func TestMetricsStoreDown(t *testing.T) {
	e := newEnv(t)
	if err := e.st.Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	text := e.scrape()
	wantLines(t, text, "vmshelf_tickets_issued_total 0")
	if strings.Contains(text, "vmshelf_images_stored ") {
		t.Error("images_stored reported although the store is closed")
	}
}

// The sweeper counts a ticket that expired unused exactly once. The clock is
// the test's, and the afterSweep hook replaces sleeping: each sweep reports
// itself on a channel.
func TestSweeper(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	if r := e.post("/market/vm-images/ticket", token, `{"name":"never uploaded"}`); r.status != http.StatusCreated {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	e.clock.Advance(2 * time.Hour) // TTL is 1h

	type sweep struct {
		n   int
		err error
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sweeps := make(chan sweep)
	e.srv.afterSweep = func(n int, err error) {
		select {
		case sweeps <- sweep{n, err}:
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.srv.RunSweeper(ctx, time.Millisecond)
	}()

	first := withTimeout(t, sweeps, "the first sweep")
	if first.err != nil || first.n != 1 {
		t.Errorf("first sweep: %d, %v; want 1 expired ticket", first.n, first.err)
	}
	// Later sweeps (driven by the ticker) find nothing new.
	for i := range 3 {
		if s := withTimeout(t, sweeps, "a later sweep"); s.err != nil || s.n != 0 {
			t.Errorf("sweep %d: %d, %v; want 0", i+2, s.n, s.err)
		}
	}
	cancel()
	withTimeout(t, done, "RunSweeper to return after cancel")

	wantLines(t, e.scrape(), "vmshelf_tickets_expired_total 1")
}
