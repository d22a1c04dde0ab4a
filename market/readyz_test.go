package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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
// operator (and an alert) can tell a full disk from a damaged store.
func TestReadyzReasons(t *testing.T) {
	const minFree = 32 << 20
	wrap := func(e error) error { return fmt.Errorf("sqlite: ping: %w", e) }
	for _, tc := range []struct {
		name     string
		storeErr error
		free     int64
		blobErr  error
		status   int
		reason   string
	}{
		{"sound", nil, 1 << 30, nil, http.StatusOK, ""},
		{"damaged store", wrap(imagestore.ErrDamaged), 1 << 30, nil, http.StatusServiceUnavailable, "storeCorrupt"},
		{"store cannot write", wrap(imagestore.ErrUnwritable), 1 << 30, nil, http.StatusServiceUnavailable, "storeUnwritable"},
		{"store unreachable", errors.New("database is locked"), 1 << 30, nil, http.StatusServiceUnavailable, "notReady"},
		{"image dir unreachable", nil, 0, errors.New("statfs: input/output error"), http.StatusServiceUnavailable, "blobStoreUnreachable"},
		{"disk full", nil, minFree - 1, nil, http.StatusServiceUnavailable, "noSpace"},
		{"store write failed for space, disk full", wrap(imagestore.ErrNoSpace), 0, nil, http.StatusServiceUnavailable, "noSpace"},
		{"store write failed for space, room again", wrap(imagestore.ErrNoSpace), minFree, nil, http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			reg := prometheus.NewRegistry()
			srv, err := New(Config{PublicURL: publicURL, TicketTTL: e.cfg.TicketTTL, ImagesPerTenant: 3, MinFree: minFree},
				sickStore{e.st, tc.storeErr}, roomyBlobs{e.blobs, tc.free, tc.blobErr}, reg, reg)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			r := response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
			if tc.status == http.StatusOK {
				if r.status != http.StatusOK {
					t.Fatalf("/readyz: %d %s, want 200", r.status, r.body)
				}
				return
			}
			wantError(t, r, tc.status, tc.reason)
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
	wantError(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}, http.StatusServiceUnavailable, "blobStoreUnreachable")
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
			reg := prometheus.NewRegistry()
			srv, err := New(Config{PublicURL: publicURL, TicketTTL: e.cfg.TicketTTL, ImagesPerTenant: 3, Headroom: 1 << 20},
				fullStore{e.st, tc.storeErr}, roomyBlobs{e.blobs, tc.free, nil}, reg, reg)
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, "/market/vm-images/ticket", strings.NewReader(`{"name":"disk"}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, req)
			wantError(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}, http.StatusInsufficientStorage, "noSpace")
		})
	}
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
