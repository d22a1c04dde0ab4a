package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/unavailable"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// outageStore is a record store some of whose calls fail as a store that
// stopped, was killed or stalls fails them: with an error wrapping
// imagestore.ErrStoreUnavailable. A write named in landing runs first: it
// landed, and its answer was lost (a COMMIT whose reply never came).
type outageStore struct {
	imagestore.Store
	mu      sync.Mutex
	down    map[string]bool
	landing map[string]bool
	calls   map[string]int
	// undone, when set, is called after each UndoUpload that ran.
	undone func(id string)
}

// onUndone sets what runs after each UndoUpload that ran.
func (s *outageStore) onUndone(f func(id string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.undone = f
}

func newOutageStore(st imagestore.Store) *outageStore {
	return &outageStore{Store: st, down: map[string]bool{}, landing: map[string]bool{}, calls: map[string]int{}}
}

// fail takes the calls named down, each as a write that lands or not.
func (s *outageStore) fail(landing bool, calls ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range calls {
		s.down[c], s.landing[c] = true, landing
	}
}

// recover brings every call back.
func (s *outageStore) recover() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.down)
}

var errOutage = fmt.Errorf("postgres: %w: dial unix /tmp/.s.PGSQL.5432: connect: connection refused", imagestore.ErrStoreUnavailable)

// call runs the real call unless name is down; a landing write runs and
// then fails.
func (s *outageStore) call(name string, run func() error) error {
	s.mu.Lock()
	down, landing := s.down[name], s.landing[name]
	s.calls[name]++
	s.mu.Unlock()
	if !down {
		return run()
	}
	if landing {
		if err := run(); err != nil {
			return err
		}
	}
	return errOutage
}

func (s *outageStore) Ticket(ctx context.Context, h imagestore.Hash) (tk imagestore.Ticket, err error) {
	err = s.call("Ticket", func() (err error) { tk, err = s.Store.Ticket(ctx, h); return err })
	return tk, err
}

func (s *outageStore) ConsumeTicket(ctx context.Context, h imagestore.Hash, now time.Time) (tk imagestore.Ticket, err error) {
	err = s.call("ConsumeTicket", func() (err error) { tk, err = s.Store.ConsumeTicket(ctx, h, now); return err })
	return tk, err
}

func (s *outageStore) StartSession(ctx context.Context, ticket, session imagestore.Hash, us imagestore.UploadSession, now time.Time) (out imagestore.UploadSession, err error) {
	err = s.call("StartSession", func() (err error) { out, err = s.Store.StartSession(ctx, ticket, session, us, now); return err })
	return out, err
}

func (s *outageStore) Session(ctx context.Context, h imagestore.Hash) (us imagestore.UploadSession, err error) {
	err = s.call("Session", func() (err error) { us, err = s.Store.Session(ctx, h); return err })
	return us, err
}

func (s *outageStore) IntendCommit(ctx context.Context, id string, at time.Time) error {
	return s.call("IntendCommit", func() error { return s.Store.IntendCommit(ctx, id, at) })
}

func (s *outageStore) AddImage(ctx context.Context, img imagestore.Image, quota int) error {
	return s.call("AddImage", func() error { return s.Store.AddImage(ctx, img, quota) })
}

func (s *outageStore) ImageForToken(ctx context.Context, h imagestore.Hash, now time.Time) (img imagestore.Image, until time.Time, err error) {
	err = s.call("ImageForToken", func() (err error) { img, until, err = s.Store.ImageForToken(ctx, h, now); return err })
	return img, until, err
}

func (s *outageStore) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (l imagestore.Lease, err error) {
	err = s.call("AcquireLease", func() (err error) { l, err = s.Store.AcquireLease(ctx, name, holder, ttl, now); return err })
	return l, err
}

func (s *outageStore) RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration, now time.Time) (l imagestore.Lease, err error) {
	err = s.call("RenewLease", func() (err error) { l, err = s.Store.RenewLease(ctx, name, holder, token, ttl, now); return err })
	return l, err
}

func (s *outageStore) UndoUpload(ctx context.Context, id string, startedAt time.Time) (removeBlob bool, err error) {
	err = s.call("UndoUpload", func() (err error) { removeBlob, err = s.Store.UndoUpload(ctx, id, startedAt); return err })
	s.mu.Lock()
	undone := s.undone
	s.mu.Unlock()
	if err == nil && undone != nil {
		undone(id)
	}
	return removeBlob, err
}

func (s *outageStore) Ping(ctx context.Context) error {
	return s.call("Ping", func() error { return s.Store.Ping(ctx) })
}

// wantStoreUnreachable checks an answer is the store's outage: 503
// storeUnreachable with Retry-After, never 500 or 408.
func wantStoreUnreachable(t *testing.T, what string, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte(`"reason":"storeUnreachable"`)) ||
		resp.Header.Get("Retry-After") != strconv.Itoa(unavailable.RetryAfter) {
		t.Fatalf("%s: %d %s (Retry-After %q); want 503 storeUnreachable with Retry-After %d",
			what, resp.StatusCode, body, resp.Header.Get("Retry-After"), unavailable.RetryAfter)
	}
}

// put sends img to an upload URL in one PUT.
func put(t *testing.T, u string, img []byte) (*http.Response, []byte) {
	t.Helper()
	return do(t, newRequest(t, http.MethodPut, u, bytes.NewReader(img)))
}

// waitTicketBack waits (bounded) until the upload's ticket is unused
// again: the undo of an upload answered storeUnreachable ran.
func (e *env) waitTicketBack(uploadURL string) {
	e.t.Helper()
	waitFor(e.t, "the ticket to be given back", func() bool {
		tk, err := e.st.Ticket(context.Background(), imagestore.HashSecret(capabilityOf(uploadURL)))
		return err == nil && tk.UsedAt.IsZero()
	})
}

// TestStoreOutageAnswers: every upload and fetch that meets a record
// store that does not answer is answered 503 storeUnreachable with
// Retry-After, at whichever call it meets it; nothing of the upload is
// kept, even where the write landed with its answer lost (the ticket's
// use, the session, the image's record and file); and the same ticket
// uploads the image once the store is back.
func TestStoreOutageAnswers(t *testing.T) {
	img := qcow2test.Base()
	for _, tc := range []struct {
		name    string
		calls   []string
		landing bool
		tus     bool
	}{
		{name: "ticket lookup", calls: []string{"Ticket"}},
		{name: "ticket used, its answer lost", calls: []string{"ConsumeTicket"}, landing: true},
		{name: "lease", calls: []string{"AcquireLease"}},
		{name: "commit intent", calls: []string{"IntendCommit"}, landing: true},
		{name: "record written, its answer lost", calls: []string{"AddImage"}, landing: true},
		{name: "record not written", calls: []string{"AddImage"}},
		{name: "tus: session made, its answer lost", calls: []string{"StartSession"}, landing: true, tus: true},
		{name: "tus: lease", calls: []string{"AcquireLease"}, tus: true},
		{name: "tus: record written, its answer lost", calls: []string{"AddImage"}, landing: true, tus: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st *outageStore
			e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), func(c *Config) { c.Replica = "r1" },
				func(s imagestore.Store) imagestore.Store { st = newOutageStore(s); return st })
			up, id := e.ticket()
			// From the instant the ticket is back a retry may open a session
			// of the same upload id: the refused upload's partial bytes
			// must be gone by then, or their removal takes the retry's.
			partialAtUndo := make(chan bool, 8)
			st.onUndone(func(id string) {
				_, err := os.Stat(filepath.Join(e.dir, ".partial", id))
				partialAtUndo <- err == nil
			})
			send := func() (*http.Response, []byte) {
				if !tc.tus {
					return put(t, up, img)
				}
				return tusReq(t, "POST", up, bytes.NewReader(img), "Upload-Length", strconv.Itoa(len(img)),
					"Content-Type", "application/offset+octet-stream")
			}
			st.fail(tc.landing, tc.calls...)
			resp, body := send()
			wantStoreUnreachable(t, "with "+strings.Join(tc.calls, ", ")+" failing", resp, body)
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("a refused creation names a session: %s", loc)
			}
			waitFor(t, "the transfer slots to be free", func() bool { return len(e.g.slots) == 0 })
			st.recover()
			e.waitTicketBack(up)
			if tc.calls[0] != "Ticket" { // a ticket never looked up has nothing to undo
				select {
				case left := <-partialAtUndo:
					if left {
						t.Error("the ticket was given back while the refused upload's partial bytes were still there")
					}
				case <-time.After(10 * time.Second):
					t.Error("no undo ran within 10 s")
				}
			}
			waitFor(t, "what the upload committed to be removed", func() bool {
				_, err := e.st.Image(context.Background(), id)
				intents, ierr := e.st.Intents(context.Background())
				return errors.Is(err, imagestore.ErrNotFound) && ierr == nil && len(intents) == 0
			})
			e.assertNothingLeft()

			resp, body = send()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("the same ticket once the store is back: %d %s, want 201", resp.StatusCode, body)
			}
			waitFor(t, "the transfer slots to be free", func() bool { return len(e.g.slots) == 0 })
			e.assertNothingLeft(id)
		})
	}
}

// TestStoreOutageLookups: a session or a fetch token that cannot be looked
// up is the store's outage, not an unknown capability and not our fault;
// the session and the token work once the store answers.
func TestStoreOutageLookups(t *testing.T) {
	var st *outageStore
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), nil,
		func(s imagestore.Store) imagestore.Store { st = newOutageStore(s); return st })
	img := qcow2test.Base()
	sess, id := e.create(len(img))
	st.fail(false, "Session")
	for _, method := range []string{"HEAD", "PATCH", "DELETE"} {
		resp, body := tusReq(t, method, sess, nil, "Content-Type", "application/offset+octet-stream", "Upload-Offset", "0")
		if method == "HEAD" {
			body = []byte(`"reason":"storeUnreachable"`) // a HEAD answer has no body
		}
		wantStoreUnreachable(t, method+" of a session the store cannot look up", resp, body)
	}
	st.recover()
	if resp, b := patch(t, sess, 0, img); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PATCH once the store is back: %d %s", resp.StatusCode, b)
	}
	u := e.fetchURL(id, time.Hour)
	st.fail(false, "ImageForToken")
	resp, body := do(t, newRequest(t, http.MethodGet, u, nil))
	wantStoreUnreachable(t, "a fetch whose token the store cannot look up", resp, body)
	st.recover()
	if resp, _ := do(t, newRequest(t, http.MethodGet, u, nil)); resp.StatusCode != http.StatusOK {
		t.Fatalf("fetch once the store is back: %d", resp.StatusCode)
	}
}

// TestLeaseUncheckedStopsUpload: a PUT whose lease the store cannot renew
// stops before the lease runs out, at once, answered 503 storeUnreachable
// (not 408 idle: data was flowing); the log says the lease could not be
// renewed, and that on a local disk it guards no write; nothing is kept
// and the ticket works again.
func TestLeaseUncheckedStopsUpload(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	var st *outageStore
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), func(c *Config) { c.Replica = "r1" },
		func(s imagestore.Store) imagestore.Store { st = newOutageStore(s); return st })
	up, id := e.ticket()
	rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(up, e.base), len(data)))
	rc.send(data[:2*preRead], "the first 16 KiB")
	waitFor(t, "the PUT to take its lease", func() bool {
		return e.st.CheckLease(context.Background(), uploadLeaseName(id), 1, e.clock.Now()) == nil
	})
	st.fail(false, "RenewLease")
	// The next renewal fails with less than the margin left.
	e.clock.Advance(uploadLeaseTTL - fenceMargin)
	resp, body := rc.answer("the PUT whose lease could not be renewed")
	wantStoreUnreachable(t, "the PUT whose lease could not be renewed", resp, body)
	e.logHas("upload lease could not be renewed in time", `guards="no write on a local disk`)
	e.waitSlotFreed(dirUpload)
	st.recover()
	e.waitTicketBack(up)
	e.assertNothingLeft()
	if resp, b := put(t, up, data); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the same ticket afterwards: %d %s", resp.StatusCode, b)
	}
	e.assertNothingLeft(id)
}

// TestTusLeaseUncheckedKeepsOffset: a PATCH whose lease the store cannot
// renew stops at once with 503 storeUnreachable and the durable offset;
// the session stays, and the client finishes from there.
func TestTusLeaseUncheckedKeepsOffset(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	var st *outageStore
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), func(c *Config) { c.Replica = "r1" },
		func(s imagestore.Store) imagestore.Store { st = newOutageStore(s); return st })
	sess, id := e.create(len(data))
	rc := slowPatch(t, e, sess, 0, len(data), data[:2*preRead])
	waitFor(t, "the PATCH to take its lease", func() bool {
		return e.st.CheckLease(context.Background(), uploadLeaseName(id), 1, e.clock.Now()) == nil
	})
	st.fail(false, "RenewLease")
	e.clock.Advance(uploadLeaseTTL - fenceMargin)
	resp, body := rc.answer("the PATCH whose lease could not be renewed")
	wantStoreUnreachable(t, "the PATCH whose lease could not be renewed", resp, body)
	if resp.Header.Get("Upload-Offset") != "0" {
		t.Errorf("Upload-Offset %q, want 0: nothing was made durable", resp.Header.Get("Upload-Offset"))
	}
	e.waitSlotFreed(dirUpload)
	st.recover()
	wantOffset(t, sess, 0, "after the stopped PATCH")
	if resp, b := patch(t, sess, 0, data); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PATCH again: %d %s", resp.StatusCode, b)
	}
	e.assertNothingLeft(id)
}

// TestDataPlaneProbes: the data plane answers /healthz and /readyz on its
// own port: ready while the record store and the image storage answer,
// 503 storeUnreachable while the store does not; the log says so once
// per change, however many probes come.
func TestDataPlaneProbes(t *testing.T) {
	var st *outageStore
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), nil,
		func(s imagestore.Store) imagestore.Store { st = newOutageStore(s); return st })
	probe := func(path string) (*http.Response, []byte) {
		t.Helper()
		return do(t, newRequest(t, http.MethodGet, e.base+path, nil))
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, b := probe(p); resp.StatusCode != http.StatusOK || string(b) != `{"status":"ok"}` {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	st.fail(false, "Ping")
	for range 5 {
		resp, b := probe("/readyz")
		if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(b, []byte(`"reason":"storeUnreachable","reasons":["storeUnreachable"]`)) {
			t.Fatalf("/readyz with the store down: %d %s", resp.StatusCode, b)
		}
	}
	if resp, _ := probe("/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz with the store down: %d, want 200 (the process answers)", resp.StatusCode)
	}
	st.recover()
	if resp, b := probe("/readyz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz once the store is back: %d %s", resp.StatusCode, b)
	}
	probe("/readyz")
	logs := e.log.String()
	if n := strings.Count(logs, "msg=\"not ready\""); n != 1 {
		t.Errorf("%d \"not ready\" lines for 5 failing probes, want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs, "msg=\"ready again\""); n != 1 {
		t.Errorf("%d \"ready again\" lines, want 1:\n%s", n, logs)
	}
	if resp, _ := do(t, newRequest(t, http.MethodPost, e.base+"/readyz", nil)); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d, want 405", resp.StatusCode)
	}
}
