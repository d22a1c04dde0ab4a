package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// holdFetch starts a whole GET of url (with the header pairs in hdr) and
// reads its first MiB, then stops: the server is blocked on a full socket
// and the fetch holds its slot. finish reads the rest and checks it.
func holdFetch(t *testing.T, url string, data []byte, hdr ...string) (finish func()) {
	t.Helper()
	req := newRequest(t, http.MethodGet, url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("holding GET: %d, want 200", resp.StatusCode)
	}
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		rest, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(append(head, rest...), data) {
			t.Fatalf("holding GET: %v, %d bytes, want the image's %d", err, len(head)+len(rest), len(data))
		}
	}
}

func queued(e *env) float64 { return testutil.ToFloat64(e.g.metrics.queued) }

// importer does what CDI's importer does with a fetch URL: HEAD, then one
// whole GET that it reads to the end while its nbdkit makes 12 small range
// reads of the same URL.
func importer(url string, data []byte, n int) error {
	req, _ := http.NewRequest("HEAD", url, nil)
	resp, err := testClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(data)) {
		return fmt.Errorf("HEAD: %d, length %d", resp.StatusCode, resp.ContentLength)
	}
	whole, err := testClient.Get(url)
	if err != nil {
		return err
	}
	defer whole.Body.Close()
	if whole.StatusCode != 200 {
		b, _ := io.ReadAll(whole.Body)
		return fmt.Errorf("whole GET: %d %s", whole.StatusCode, b)
	}
	got := make([]byte, 1<<20)
	if _, err := io.ReadFull(whole.Body, got); err != nil {
		return fmt.Errorf("whole GET: %v", err)
	}
	for i := range 12 {
		a := (n*1_000_003 + i*3_999_971) % (len(data) - 70_000)
		b := a + 512 + i*5000
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Range", "bytes="+strconv.Itoa(a)+"-"+strconv.Itoa(b))
		resp, err := testClient.Do(req)
		if err != nil {
			return fmt.Errorf("range %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 206 || !bytes.Equal(body, data[a:b+1]) {
			return fmt.Errorf("range %d (bytes=%d-%d) during the whole GET: %d %v, %d bytes: %.80s", i, a, b, resp.StatusCode, err, len(body), body)
		}
	}
	rest, err := io.ReadAll(whole.Body)
	if err != nil || !bytes.Equal(append(got, rest...), data) {
		return fmt.Errorf("whole GET: %v, %d bytes, want %d", err, len(got)+len(rest), len(data))
	}
	return nil
}

// TestFetchImportersQueue: 8 importer-shaped clients against 4 slots. The
// ranges share their token's slot, the GETs beyond the cap queue: all
// finish with the right bytes and none sees a 503.
func TestFetchImportersQueue(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	// The test's importers stop reading their whole GET while they make
	// their range reads; on 2 loaded cores under -race that pause can
	// outlast the usual idle timeout, and a batch of four the default
	// 30 s queue wait; neither is what this is about.
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 4; c.IdleTimeout = waitBound; c.FetchQueueWait = clientBound })
	id, data := e.stored(big)
	start := time.Now()
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for n := range 8 {
		url := e.fetchURL(id, time.Hour) // each importer has its own token
		wg.Go(func() { errs <- importer(url, data, n) })
	}
	wg.Wait()
	close(errs)
	t.Logf("8 importers, 4 slots: all done in %v", time.Since(start))
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirFetch, "busy")); got != 0 {
		t.Errorf("busy refusals %v, want 0", got)
	}
	e.g.fetches.mu.Lock()
	held := len(e.g.fetches.held)
	e.g.fetches.mu.Unlock()
	if len(e.g.slots) != 0 || held != 0 {
		t.Errorf("after all importers: %d slots, %d tokens held, want none", len(e.g.slots), held)
	}
}

// TestFetchQueueWait: a GET beyond the cap waits FetchQueueWait for a slot
// and then gets 503 busy; one whose slot frees within the wait is served;
// a waiting GET ends when its client goes or the gateway shuts down.
func TestFetchQueueWait(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	setup := func(t *testing.T, wait time.Duration) (*env, []byte, string, string) {
		// The holding fetch's client stops reading for the whole subtest:
		// the idle timeout must not cut it on 2 loaded cores.
		e := newEnv(t, func(c *Config) { c.MaxTransfers = 1; c.FetchQueueWait = wait; c.IdleTimeout = waitBound })
		id, data := e.stored(big)
		return e, data, e.fetchURL(id, time.Hour), e.fetchURL(id, time.Hour)
	}
	t.Run("busy after the wait", func(t *testing.T) {
		const wait = 300 * time.Millisecond
		e, data, a, b := setup(t, wait)
		finish := holdFetch(t, a, data)
		// The holder's own range read shares its slot, HEAD needs none.
		if r, body := get(t, "GET", a, "Range", "bytes=10-19"); r.StatusCode != 206 || !bytes.Equal(body, data[10:20]) {
			t.Errorf("range of the holding token: %d, want 206 and its bytes", r.StatusCode)
		}
		if r, _ := get(t, "HEAD", b); r.StatusCode != 200 {
			t.Errorf("HEAD while the slot is held: %d, want 200", r.StatusCode)
		}
		t0 := time.Now()
		r, body := get(t, "GET", b)
		waited := time.Since(t0)
		if r.StatusCode != 503 || errorOf(t, bytes.NewReader(body)).Reason != "busy" || r.Header.Get("Retry-After") == "" {
			t.Errorf("GET beyond the cap: %d %s, want 503 busy with Retry-After", r.StatusCode, body)
		}
		if waited < wait {
			t.Errorf("503 after %v, want after waiting at least %v", waited, wait)
		}
		finish()
		e.waitSlotFreed(dirFetch) // the range's share
		e.waitSlotFreed(dirFetch) // the holder's
		if len(e.g.slots) != 0 {
			t.Errorf("%d slots held after the fetches ended", len(e.g.slots))
		}
	})
	t.Run("served when a slot frees within the wait", func(t *testing.T) {
		e, data, a, b := setup(t, waitBound)
		finish := holdFetch(t, a, data)
		type answer struct {
			code int
			body []byte
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := testClient.Get(b)
			if err != nil {
				done <- answer{code: -1, body: []byte(err.Error())}
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			done <- answer{resp.StatusCode, body}
		}()
		waitFor(t, "the second GET to queue", func() bool { return queued(e) == 1 })
		finish()
		got := within(t, done, "the queued GET's answer")
		if got.code != 200 || !bytes.Equal(got.body, data) {
			t.Fatalf("queued GET: %d, %d bytes, want 200 and the image", got.code, len(got.body))
		}
	})
	t.Run("client gone", func(t *testing.T) {
		e, data, a, b := setup(t, waitBound)
		finish := holdFetch(t, a, data)
		rc := openRaw(t, e.base, "GET "+strings.TrimPrefix(b, e.base)+" HTTP/1.1\r\nHost: x")
		waitFor(t, "the second GET to queue", func() bool { return queued(e) == 1 })
		rc.c.Close()
		waitFor(t, "the queued GET of a client that left to give up", func() bool { return queued(e) == 0 })
		finish()
		if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirFetch, outcomeAborted)); got != 1 {
			t.Errorf("aborted fetches %v, want 1 (the client that left)", got)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		e, data, a, b := setup(t, waitBound)
		finish := holdFetch(t, a, data)
		rc := openRaw(t, e.base, "GET "+strings.TrimPrefix(b, e.base)+" HTTP/1.1\r\nHost: x")
		waitFor(t, "the second GET to queue", func() bool { return queued(e) == 1 })
		stopped := make(chan struct{})
		go func() { e.stop(); close(stopped) }()
		r, body := rc.answer("the queued GET during shutdown")
		if r.StatusCode != 503 || errorOf(t, bytes.NewReader(body)).Reason != "shuttingDown" || r.Header.Get("Retry-After") == "" {
			t.Errorf("queued GET at shutdown: %d %s, want 503 shuttingDown with Retry-After", r.StatusCode, body)
		}
		finish()
		within(t, stopped, "the shutdown")
	})
}
