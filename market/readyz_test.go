package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore"
)

// sickStore answers Ping with err: the store's own account of its health.
type sickStore struct {
	imagestore.Store
	err error
}

func (s sickStore) Ping(context.Context) error { return s.err }

// roomyBlobs reports free bytes.
type roomyBlobs struct {
	imagestore.Blobs
	free int64
	err  error
}

func (b roomyBlobs) Available(context.Context) (int64, error) { return b.free, b.err }

// TestReadyzReasons: /readyz names why it is not ready, so that an
// operator (and an alert) can tell a full disk from a damaged store, and
// lists every problem when there are several: the record store's first,
// then the image storage's, then the VM market's.
func TestReadyzReasons(t *testing.T) {
	const minFree = 32 << 20
	wrap := func(e error) error { return fmt.Errorf("sqlite: ping: %w", e) }
	for _, tc := range []struct {
		name     string
		storeErr error
		free     int64
		blobErr  error
		vms      bool // --vms-enable without Stripe: the machines' reasons too
		status   int
		reasons  []string
	}{
		{"sound", nil, 1 << 30, nil, false, http.StatusOK, nil},
		{"damaged store", wrap(imagestore.ErrDamaged), 1 << 30, nil, false, http.StatusServiceUnavailable, []string{"storeCorrupt"}},
		{"store cannot write", wrap(imagestore.ErrUnwritable), 1 << 30, nil, false, http.StatusServiceUnavailable, []string{"storeUnwritable"}},
		{"store unreachable", errors.New("database is locked"), 1 << 30, nil, false, http.StatusServiceUnavailable, []string{"notReady"}},
		{"image dir unreachable", nil, 0, errors.New("statfs: input/output error"), false, http.StatusServiceUnavailable, []string{"blobStoreUnreachable"}},
		{"disk full", nil, minFree - 1, nil, false, http.StatusServiceUnavailable, []string{"noSpace"}},
		{"store write failed for space, disk full", wrap(imagestore.ErrNoSpace), 0, nil, false, http.StatusServiceUnavailable, []string{"noSpace"}},
		{"store write failed for space, room again", wrap(imagestore.ErrNoSpace), minFree, nil, false, http.StatusOK, nil},
		{"damaged store on a full disk", wrap(imagestore.ErrDamaged), minFree - 1, nil, false, http.StatusServiceUnavailable,
			[]string{"storeCorrupt", "noSpace"}},
		{"store cannot write, image dir unreachable", wrap(imagestore.ErrUnwritable), 0, errors.New("statfs: input/output error"), false,
			http.StatusServiceUnavailable, []string{"storeUnwritable", "blobStoreUnreachable"}},
		{"full disk, market without Stripe", nil, 0, nil, true, http.StatusServiceUnavailable,
			[]string{"noSpace", "paymentsUnavailable", "webhookNotConfigured"}},
		{"ready, market without Stripe", nil, 1 << 30, nil, true, http.StatusOK, []string{"paymentsUnavailable", "webhookNotConfigured"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			reg := prometheus.NewRegistry()
			srv, err := New(Config{PublicURL: publicURL, TicketTTL: e.cfg.TicketTTL, ImagesPerTenant: 3, MinFree: minFree, VMsEnabled: tc.vms},
				sickStore{e.st, tc.storeErr}, roomyBlobs{e.blobs, tc.free, tc.blobErr}, reg, reg)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			r := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
			if tc.status == http.StatusOK {
				wantReady(t, r, tc.reasons...)
				return
			}
			wantNotReady(t, r, tc.reasons...)
		})
	}
}

// wantReady checks a 200 from /readyz: status ok, machines the first of
// reasons (absent when there is none) and reasons every one.
func wantReady(t *testing.T, r response, reasons ...string) {
	t.Helper()
	var got struct {
		Status   string    `json:"status"`
		Machines *string   `json:"machines"`
		Reasons  *[]string `json:"reasons"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || r.status != http.StatusOK || got.Status != "ok" {
		t.Fatalf("/readyz: %d %s, want 200 ok (%v)", r.status, r.body, err)
	}
	switch {
	case len(reasons) == 0 && (got.Machines != nil || got.Reasons != nil):
		t.Errorf("/readyz %s, want no machines and no reasons", r.body)
	case len(reasons) > 0 && (got.Machines == nil || *got.Machines != reasons[0] || got.Reasons == nil || !slices.Equal(*got.Reasons, reasons)):
		t.Errorf("/readyz %s, want machines %q and reasons %q", r.body, reasons[0], reasons)
	}
}

// wantNotReady checks a 503 from /readyz: the error answer of the first
// of reasons, and reasons every one, in order.
func wantNotReady(t *testing.T, r response, reasons ...string) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("/readyz body is not JSON: %v: %s", err, r.body)
	}
	var got struct {
		Error   string   `json:"error"`
		Reason  string   `json:"reason"`
		Reasons []string `json:"reasons"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || len(m) != 3 {
		t.Fatalf("/readyz body %s, want exactly error, reason and reasons (%v)", r.body, err)
	}
	if r.status != http.StatusServiceUnavailable || r.header.Get("Content-Type") != "application/json" ||
		strings.TrimSpace(got.Error) == "" || got.Reason != reasons[0] || !slices.Equal(got.Reasons, reasons) {
		t.Errorf("/readyz: %d %s %s, want 503 application/json with reason %q and reasons %q",
			r.status, r.header.Get("Content-Type"), r.body, reasons[0], reasons)
	}
}

// TestReadyzEveryMachinesProblem: with --vms-enable, /readyz stays 200
// and lists every reason the market cannot work, not only the first: a
// missing webhook secret hid an unreachable cluster.
func TestReadyzEveryMachinesProblem(t *testing.T) {
	unreachable := func() error { return errors.New("dial tcp 127.0.0.1:6443: connection refused") }
	for _, c := range []struct {
		name string
		mod  func(*Config)
		want []string
	}{
		{"no webhook secret, no cluster", func(c *Config) { c.WebhookSecret = ""; c.ClusterReady = unreachable },
			[]string{"webhookNotConfigured", "clusterUnreachable"}},
		{"no Stripe at all, no cluster", func(c *Config) { c.Payments = nil; c.WebhookSecret = ""; c.ClusterReady = unreachable },
			[]string{"paymentsUnavailable", "webhookNotConfigured", "clusterUnreachable"}},
		{"no key, no cluster", func(c *Config) { c.Payments = nil; c.ClusterReady = unreachable },
			[]string{"paymentsUnavailable", "clusterUnreachable"}},
		{"all there", func(c *Config) { c.ClusterReady = func() error { return nil } }, nil},
		{"vms off", func(c *Config) { c.VMsEnabled = false; c.Payments = nil; c.ClusterReady = unreachable }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.mod)
			r := e.do(http.MethodGet, "/readyz", "", nil)
			wantReady(t, r, c.want...)
			if strings.Contains(string(r.body), "6443") {
				t.Errorf("/readyz tells the cause: %s", r.body)
			}
		})
	}
}

// hungBlobs does not answer Ping, yet reports ample free space (from a
// listing it holds): /readyz must ask the blob store itself.
type hungBlobs struct{ imagestore.Blobs }

func (hungBlobs) Ping(ctx context.Context) error {
	<-ctx.Done()
	return fmt.Errorf("no answer to the health check: %w", ctx.Err())
}
func (hungBlobs) Available(context.Context) (int64, error) { return 1 << 40, nil }

// TestReadyzBlobStoreHangs: a blob store that does not answer makes
// /readyz 503 blobStoreUnreachable within the probe's bound.
func TestReadyzBlobStoreHangs(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	srv, err := New(Config{PublicURL: publicURL, TicketTTL: e.cfg.TicketTTL, ImagesPerTenant: 3}, e.st, hungBlobs{e.blobs}, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	start := time.Now()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if took := time.Since(start); took > probeTimeout+time.Second {
		t.Errorf("/readyz took %v, want at most the probe's %v and a little", took, probeTimeout)
	}
	wantNotReady(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}, "blobStoreUnreachable")
}

// TestTicketNoSpace: below the headroom no ticket is issued (507 noSpace,
// nothing stored), and a store write refused for space is 507, never 500.
func TestTicketNoSpace(t *testing.T) {
	for _, tc := range []struct {
		name     string
		free     int64
		storeErr error
	}{
		{"disk below the headroom", 1<<20 - 1, nil},
		{"store write refused for space", 1 << 30, fmt.Errorf("sqlite: create ticket: %w", imagestore.ErrNoSpace)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			_, token := e.tenant("alice", true)
			r := ticketFrom(t, e, fullStore{e.st, tc.storeErr}, roomyBlobs{e.blobs, tc.free, nil}, token)
			wantError(t, r, http.StatusInsufficientStorage, "noSpace")
		})
	}
}

// ticketFrom asks a control plane over st and blobs (1 MiB of headroom)
// for a ticket with token.
func ticketFrom(t *testing.T, e *env, st Store, blobs Blobs, token string) response {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv, err := New(Config{PublicURL: publicURL, TicketTTL: e.cfg.TicketTTL, ImagesPerTenant: 3, Headroom: 1 << 20}, st, blobs, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/market/vm-images/ticket", strings.NewReader(`{"name":"disk"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// fullStore refuses ticket writes with err (when set).
type fullStore struct {
	imagestore.Store
	err error
}

func (s fullStore) CreateTicket(ctx context.Context, tk imagestore.Ticket, h imagestore.Hash, quota int) error {
	if s.err != nil {
		return s.err
	}
	return s.Store.CreateTicket(ctx, tk, h, quota)
}

// TestTicketBlobsUnreachable: a ticket asks the image storage for its free
// space; one that does not answer (S3 down, hung or failing) is the
// storage's passing outage, 503 blobStoreUnreachable with Retry-After,
// never our 500; nothing is stored.
func TestTicketBlobsUnreachable(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	down := fmt.Errorf("s3: available: %w", imagestore.ErrBlobsUnavailable)
	r := ticketFrom(t, e, e.st, roomyBlobs{e.blobs, 0, down}, token)
	wantError(t, r, http.StatusServiceUnavailable, "blobStoreUnreachable")
	if got := r.header.Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After %q, want 60", got)
	}
	if tks, err := e.st.UnusedTickets(t.Context(), alice.ID, time.Now()); err != nil || len(tks) != 0 {
		t.Errorf("tickets after the refusal: %v, %v; want none", tks, err)
	}
}
