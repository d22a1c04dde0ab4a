package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
)

// stored uploads a fresh image and returns its id and bytes; it waits
// until the upload gave its slot back.
func (e *env) stored(img string) (string, []byte) {
	e.t.Helper()
	data := mustRead(e.t, img)
	url, id := e.ticket()
	resp, b := do(e.t, newRequest(e.t, http.MethodPut, url, bytes.NewReader(data)))
	if resp.StatusCode != 201 {
		e.t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	e.waitSlotFreed(dirUpload)
	return id, data
}

func get(t *testing.T, method, url string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req := newRequest(t, method, url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func fetchedBytes(e *env) float64 {
	return testutil.ToFloat64(e.g.metrics.bytes.WithLabelValues(dirFetch))
}

func TestFetch(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	e := newEnv(t, nil)
	id, data := e.stored(img)
	rec, err := e.st.Image(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	url := e.fetchURL(id, time.Hour)
	size := int64(len(data))
	etag := `"` + rec.SHA256 + `"`

	t.Run("GET whole, three times with one token", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			resp, b := get(t, "GET", url)
			if resp.StatusCode != 200 || !bytes.Equal(b, data) {
				t.Fatalf("GET %d: status %d, %d bytes (want %d)", i, resp.StatusCode, len(b), size)
			}
			for k, want := range map[string]string{
				"Content-Length": strconv.FormatInt(size, 10), "Accept-Ranges": "bytes", "ETag": etag,
				"Content-Type": "application/octet-stream", "Last-Modified": rec.CreatedAt.UTC().Format(http.TimeFormat),
			} {
				if got := resp.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
		}
	})
	t.Run("HEAD", func(t *testing.T) {
		resp, b := get(t, "HEAD", url)
		if resp.StatusCode != 200 || resp.ContentLength != size || len(b) != 0 || resp.Header.Get("Accept-Ranges") != "bytes" {
			t.Fatalf("HEAD: %d length %d body %d", resp.StatusCode, resp.ContentLength, len(b))
		}
	})
	ranges := []struct {
		hdr       []string
		status    int
		off, n    int64
		wantRange string
	}{
		{[]string{"Range", "bytes=0-65536"}, 206, 0, 65537, fmt.Sprintf("bytes 0-65536/%d", size)},
		// One byte, N-N: exactly that byte, at the first, a middle and
		// the last position, and the last as a suffix.
		{[]string{"Range", "bytes=0-0"}, 206, 0, 1, fmt.Sprintf("bytes 0-0/%d", size)},
		{[]string{"Range", "bytes=4097-4097"}, 206, 4097, 1, fmt.Sprintf("bytes 4097-4097/%d", size)},
		{[]string{"Range", fmt.Sprintf("bytes=%d-%d", size-1, size-1)}, 206, size - 1, 1, fmt.Sprintf("bytes %d-%d/%d", size-1, size-1, size)},
		{[]string{"Range", "bytes=-1"}, 206, size - 1, 1, fmt.Sprintf("bytes %d-%d/%d", size-1, size-1, size)},
		// The largest answer read into memory, and the smallest sent
		// with sendfile.
		{[]string{"Range", fmt.Sprintf("bytes=4097-%d", 4097+smallRange-1)}, 206, 4097, smallRange, fmt.Sprintf("bytes 4097-%d/%d", 4097+smallRange-1, size)},
		{[]string{"Range", fmt.Sprintf("bytes=4097-%d", 4097+smallRange)}, 206, 4097, smallRange + 1, fmt.Sprintf("bytes 4097-%d/%d", 4097+smallRange, size)},
		{[]string{"Range", "bytes=1000-"}, 206, 1000, size - 1000, fmt.Sprintf("bytes 1000-%d/%d", size-1, size)},
		{[]string{"Range", "bytes=-100"}, 206, size - 100, 100, fmt.Sprintf("bytes %d-%d/%d", size-100, size-1, size)},
		{[]string{"Range", fmt.Sprintf("bytes=%d-%d", size-10, size+1000)}, 206, size - 10, 10, fmt.Sprintf("bytes %d-%d/%d", size-10, size-1, size)},
		{[]string{"Range", fmt.Sprintf("bytes=%d-", size)}, 416, 0, 0, fmt.Sprintf("bytes */%d", size)},
		{[]string{"Range", "bytes=0-1,5-6"}, 200, 0, size, ""},
		{[]string{"Range", "bytes=5-1"}, 200, 0, size, ""},
		{[]string{"Range", "bytes=10-19", "If-Range", etag}, 206, 10, 10, fmt.Sprintf("bytes 10-19/%d", size)},
		{[]string{"Range", "bytes=10-19", "If-Range", `"other"`}, 200, 0, size, ""},
		{[]string{"Range", "bytes=10-19", "If-Range", rec.CreatedAt.UTC().Add(-time.Hour).Format(http.TimeFormat)}, 200, 0, size, ""},
	}
	for _, rc := range ranges {
		t.Run(strings.Join(rc.hdr, " "), func(t *testing.T) {
			resp, b := get(t, "GET", url, rc.hdr...)
			if resp.StatusCode != rc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, rc.status)
			}
			if got := resp.Header.Get("Content-Range"); got != rc.wantRange {
				t.Errorf("Content-Range %q, want %q", got, rc.wantRange)
			}
			if rc.status == 416 {
				if errorOf(t, bytes.NewReader(b)).Reason != "rangeNotSatisfiable" {
					t.Errorf("416 reason")
				}
				return
			}
			if !bytes.Equal(b, data[rc.off:rc.off+rc.n]) || resp.ContentLength != rc.n {
				t.Errorf("body: %d bytes (Content-Length %d), not bytes %d..+%d of the image", len(b), resp.ContentLength, rc.off, rc.n)
			}
		})
	}
	t.Run("If-None-Match", func(t *testing.T) {
		resp, b := get(t, "GET", url, "If-None-Match", etag)
		if resp.StatusCode != 304 || len(b) != 0 {
			t.Fatalf("status %d, %d bytes; want 304", resp.StatusCode, len(b))
		}
	})
	gets := 3 // every GET above gave its slot back (a 416 took none)
	for _, rc := range ranges {
		if rc.status != 416 {
			gets++
		}
	}
	for i := 0; i < gets; i++ {
		e.waitSlotFreed(dirFetch)
	}
	e.assertNothingLeft(id)
	// Bytes sent, each counted once: three whole GETs, the ranges that
	// were honoured and the whole images sent for those that were not.
	want := 3 * size
	for _, rc := range ranges {
		if rc.status != 416 {
			want += rc.n
		}
	}
	if got := fetchedBytes(e); got != float64(want) {
		t.Errorf("fetch bytes metric %v, want %d", got, want)
	}
	// One ok transfer per answer with a body or a 304 (the handler's
	// HEAD and 304 answers hold no slot), one refusal for the 416.
	if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirFetch, "rangeNotSatisfiable")); got != 1 {
		t.Errorf("rejections{rangeNotSatisfiable} = %v, want 1", got)
	}
}

// TestFetchRevocationBound: the data plane asks the store for a token at
// most once per imagestore.TokenCacheTTL, so that is how long a token
// revoked elsewhere (another process on the same store) is still served;
// revoked or removed through the store the gateway shares, and at its
// expiry, a token is refused at once.
func TestFetchRevocationBound(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	var cached imagestore.Store
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "db"), nil, func(st imagestore.Store) imagestore.Store {
		cached = imagestore.CacheTokens(st, imagestore.TokenCacheTTL)
		return cached
	})
	id, data := e.stored(img)
	token := func(order string, ttl time.Duration) string {
		secret := imagestore.NewSecret()
		e.remember(secret)
		if err := e.st.CreateFetchToken(context.Background(), imagestore.HashSecret(secret),
			imagestore.FetchToken{UploadID: id, OrderID: order, ExpiresAt: e.clock.Now().Add(ttl)}); err != nil {
			t.Fatal(err)
		}
		return e.base + fetchPrefix + secret
	}
	// status fetches a small range (what an importer sends most).
	status := func(url string) int {
		t.Helper()
		resp, b := get(t, "GET", url, "Range", "bytes=0-4095")
		if resp.StatusCode == 206 && !bytes.Equal(b, data[:4096]) {
			t.Fatalf("206 with the wrong bytes")
		}
		return resp.StatusCode
	}
	ctx := context.Background()

	other := token("o-other", time.Hour)
	if got := status(other); got != 206 {
		t.Fatalf("valid token: %d", got)
	}
	if _, err := e.st.RevokeOrderTokens(ctx, "o-other", e.clock.Now()); err != nil { // behind the gateway's back
		t.Fatal(err)
	}
	if got := status(other); got != 206 {
		t.Errorf("revoked by another process, at once: %d; the cache should still serve it until the TTL", got)
	}
	// The clock runs on from the real time, so "within" keeps a margin.
	e.clock.Advance(imagestore.TokenCacheTTL / 2)
	if got := status(other); got != 206 {
		t.Errorf("revoked by another process, half the TTL later: %d", got)
	}
	e.clock.Advance(imagestore.TokenCacheTTL / 2)
	if got := status(other); got != 404 {
		t.Errorf("revoked by another process, TTL later: %d, want 404", got)
	}

	shared := token("o-shared", time.Hour)
	status(shared)
	if _, err := cached.RevokeOrderTokens(ctx, "o-shared", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if got := status(shared); got != 404 {
		t.Errorf("revoked through the shared store: %d, want 404 at once", got)
	}

	short := token("o-short", imagestore.TokenCacheTTL/2)
	status(short)
	e.clock.Advance(imagestore.TokenCacheTTL / 2)
	if got := status(short); got != 404 {
		t.Errorf("at its expiry, within the cache's TTL: %d, want 404", got)
	}

	removed := token("", time.Hour)
	status(removed)
	if err := cached.RemoveImage(ctx, e.tenant.ID, id); err != nil {
		t.Fatal(err)
	}
	if got := status(removed); got != 404 {
		t.Errorf("image removed through the shared store: %d, want 404 at once", got)
	}
}

func TestFetchUnknownTokens(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	e := newEnv(t, func(c *Config) { c.MissBurst = 3; c.MissEvery = time.Hour })
	id, _ := e.stored(img)
	expired := e.fetchURL(id, time.Minute)
	revoked := e.fetchURL(id, time.Hour)
	good := e.fetchURL(id, time.Hour)
	e.clock.Advance(2 * time.Minute)
	if err := e.st.RemoveImage(context.Background(), e.tenant.ID, id); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{expired, revoked, e.base + fetchPrefix + "nothex"} {
		resp, b := get(t, "GET", u)
		if resp.StatusCode != 404 || errorOf(t, bytes.NewReader(b)).Reason != "tokenUnknown" {
			t.Fatalf("%s: %d %s, want 404 tokenUnknown", u[len(e.base):][:30], resp.StatusCode, b)
		}
	}
	// Three misses spent the budget: the address is slowed, even with a
	// well-formed token.
	resp, b := get(t, "GET", good)
	if resp.StatusCode != 429 || errorOf(t, bytes.NewReader(b)).Reason != "rateLimited" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fourth miss: %d %s, want 429 rateLimited with Retry-After", resp.StatusCode, b)
	}
	// Uploads with unknown tickets share the budget.
	resp, b = get(t, "PUT", e.base+uploadPrefix+strings.Repeat("a", 64))
	if resp.StatusCode != 429 {
		t.Fatalf("upload after misses: %d %s, want 429", resp.StatusCode, b)
	}
	e.clock.Advance(2 * time.Hour)
	if resp, _ := get(t, "GET", good); resp.StatusCode != 404 {
		t.Fatalf("after the budget refilled: %d, want 404", resp.StatusCode)
	}
}

// makeBigImage makes an image whose fetch outlasts socket buffers: 48 MiB
// of data.
func makeBigImage(t *testing.T) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "big.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", img, "1G")
	qemuIO(t, img, "write -q -P 0x42 0 48M")
	return img
}

// TestFetchHoldsSlotUntilLastByte: a fetch keeps its slot while its body is
// being read, HEAD needs none, and the slot comes back after the last byte.
func TestFetchHoldsSlotUntilLastByte(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1; c.FetchQueueWait = 100 * time.Millisecond })
	id, data := e.stored(big)
	url := e.fetchURL(id, time.Hour)
	other := e.fetchURL(id, time.Hour) // another importer's token

	resp, err := testClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	// The client reads no further: the server is blocked on a full socket.
	if r, b := get(t, "GET", other); r.StatusCode != 503 || errorOf(t, bytes.NewReader(b)).Reason != "busy" {
		t.Fatalf("GET of another token while the first is read: %d, want 503 busy", r.StatusCode)
	}
	if r, _ := get(t, "HEAD", other); r.StatusCode != 200 {
		t.Fatalf("HEAD while the slot is held: %d, want 200", r.StatusCode)
	}
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(append(head, rest...), data) {
		t.Fatalf("first GET: %v, %d bytes", err, len(head)+len(rest))
	}
	e.waitSlotFreed(dirFetch)
	if r, _ := get(t, "GET", url); r.StatusCode != 200 {
		t.Fatalf("GET after the first finished: %d", r.StatusCode)
	}
	e.waitSlotFreed(dirFetch)
	if got := fetchedBytes(e); got != float64(2*len(data)) {
		t.Errorf("fetch bytes metric %v, want %d: two whole images, each byte once", got, 2*len(data))
	}
	if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirFetch, outcomeOK)); got != 3 { // two GETs and the HEAD
		t.Errorf("ok fetches = %v, want 3", got)
	}
	e.assertNothingLeft(id)
}

// TestFetchStalledReader: a client that stops reading is cut off after the
// idle timeout and its slot comes back.
func TestFetchStalledReader(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	// The test only waits for the timeout to fire: 2 s cannot fire early
	// on a loaded machine, for the upload before either.
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1; c.IdleTimeout = 2 * time.Second })
	id, data := e.stored(big)
	url := e.fetchURL(id, time.Hour)
	rc := openRaw(t, e.base, fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x", strings.TrimPrefix(url, e.base)))
	// The answer started; then the client stops reading.
	if err := rc.c.SetReadDeadline(time.Now().Add(waitBound)); err != nil {
		t.Fatal(err)
	}
	start := make([]byte, 4096)
	if _, err := io.ReadFull(rc.c, start); err != nil || !bytes.HasPrefix(start, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("start of the answer %q: %v", start[:min(len(start), 20)], err)
	}
	e.waitSlotFreed(dirFetch)
	if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirFetch, outcomeAborted)); got != 1 {
		t.Errorf("aborted fetches = %v, want 1", got)
	}
	if got := fetchedBytes(e); got <= 0 || got >= float64(len(data)) {
		t.Errorf("fetch bytes metric %v, want some but not all of %d", got, len(data))
	}
	e.assertNothingLeft(id)
}

// hangingTokens is a store whose token lookups hang, while hang is set,
// until their context ends; it records how that context ended.
type hangingTokens struct {
	imagestore.Store
	hang  atomic.Bool
	ended chan error
}

func (h *hangingTokens) ImageForToken(ctx context.Context, token imagestore.Hash, now time.Time) (imagestore.Image, time.Time, error) {
	if !h.hang.Load() {
		return h.Store.ImageForToken(ctx, token, now)
	}
	select {
	case <-ctx.Done():
		h.ended <- ctx.Err()
		return imagestore.Image{}, time.Time{}, ctx.Err()
	case <-time.After(waitBound):
		h.ended <- errors.New("the lookup's context never ended")
		return imagestore.Image{}, time.Time{}, errors.New("hung for the test's bound")
	}
}

// TestFetchStoreHangs: a fetch whose token lookup hangs in the store gets
// its answer once Config.StoreTimeout has passed (the lazily armed
// deadline fires when the lookup waits on it): 500, not a 404 (could not
// ask is not absent), no slot taken; once the store answers again the
// same token is served.
func TestFetchStoreHangs(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	h := &hangingTokens{ended: make(chan error, 1)}
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "db"), func(c *Config) { c.StoreTimeout = 300 * time.Millisecond },
		func(st imagestore.Store) imagestore.Store { h.Store = st; return h })
	id, data := e.stored(img)
	url := e.fetchURL(id, time.Hour)
	h.hang.Store(true)
	start := time.Now()
	resp, b := get(t, "GET", url, "Range", "bytes=0-4095")
	took := time.Since(start)
	if resp.StatusCode != 500 || errorOf(t, bytes.NewReader(b)).Reason != "internal" {
		t.Fatalf("GET while the store hangs: %d %s, want 500 internal", resp.StatusCode, b)
	}
	if err := within(t, h.ended, "the hung lookup to end"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the hung lookup ended with %v, want its deadline", err)
	}
	if took < 300*time.Millisecond {
		t.Errorf("answered after %v, before the store timeout", took)
	}
	if got := testutil.ToFloat64(e.g.metrics.fetch.inFlight); got != 0 {
		t.Errorf("%v fetches in flight after the failed lookup", got)
	}
	h.hang.Store(false)
	if resp, b := get(t, "GET", url, "Range", "bytes=0-4095"); resp.StatusCode != 206 || !bytes.Equal(b, data[:4096]) {
		t.Fatalf("GET once the store answers: %d, %d bytes", resp.StatusCode, len(b))
	}
}

// TestFetchStalledSmallAnswers: a client that asks for small ranges and
// stops reading is cut off after the idle timeout too. A small answer
// leaves in one write of the server's buffer, and its only write deadline
// is the one the server sets as each answer starts (Server.WriteTimeout):
// without it the connection and its goroutine would wait forever. The
// requests come pipelined, so that answers of exactly smallRange pile up
// beyond what the sockets hold.
func TestFetchStalledSmallAnswers(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 2 * time.Second })
	id, _ := e.stored(big)
	testClient.CloseIdleConnections() // the upload's connection: only the fetch's stays
	path := strings.TrimPrefix(e.fetchURL(id, time.Hour), e.base)
	small := func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		return errors.Join(err, serr)
	}
	c, err := (&net.Dialer{Timeout: waitBound, Control: small}).Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 128 answers of 128 KiB: 16 MiB, more than loopback's sockets hold.
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x\r\nRange: bytes=0-%d\r\n\r\n", path, smallRange-1)
	if err := c.SetWriteDeadline(time.Now().Add(waitBound)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(bytes.Repeat([]byte(req), 128)); err != nil {
		t.Fatal(err)
	}
	start := make([]byte, 64)
	if err := c.SetReadDeadline(time.Now().Add(waitBound)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, start); err != nil || !bytes.HasPrefix(start, []byte("HTTP/1.1 206 ")) {
		t.Fatalf("start of the first answer %q: %v", start, err)
	}
	// The client reads no more.
	waitFor(t, "the server to close the stalled connection", func() bool { return e.g.srv.GetOpenConnectionsCount() == 0 })
}

// TestFetchSlowSteadyReader: a client that reads steadily but slowly is
// never cut, even though its first chunks vanish into the sockets' buffers
// and look infinitely fast. Sizing the next chunk by that rate alone gave
// it the rest of the image with one idle timeout to take it (CI saw it cut
// at 6 MB). 8 MB/s against a 3 s idle timeout: the old sizing needed the
// 48 MiB in 3 s; the slow start needs at most the buffers' worth.
func TestFetchSlowSteadyReader(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 3 * time.Second })
	id, data := e.stored(big)
	// A small receive buffer (set before connect, so it holds) keeps the
	// buffered bytes, and so the test's time, to the sender's side.
	small := func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 128<<10)
		})
		return errors.Join(err, serr)
	}
	client := &http.Client{Timeout: clientBound, Transport: &http.Transport{
		DialContext: (&net.Dialer{Timeout: waitBound, Control: small}).DialContext}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(e.fetchURL(id, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET: %d, want 200", resp.StatusCode)
	}
	// 128 KiB every 16 ms: a pace, not a wait for anything.
	pace := time.NewTicker(16 * time.Millisecond)
	defer pace.Stop()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 128<<10)
	for len(got) < len(data) {
		<-pace.C
		n, err := io.ReadFull(resp.Body, buf[:min(len(buf), len(data)-len(got))])
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("cut after %d of %d bytes: %v", len(got), len(data), err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the slow reader got other bytes than the image's")
	}
}

// TestNextChunk: a chunk is at most twice the last one and takes at most
// 1/16 of the idle timeout at the last one's rate, within [min, max].
func TestNextChunk(t *testing.T) {
	const idle = 32 * time.Second // 1/16 is 2 s
	for _, c := range []struct {
		name string
		n    int64
		el   time.Duration
		want int64
	}{
		{"an instant chunk doubles", minChunk, 0, 2 * minChunk},
		{"a buffered, seemingly very fast chunk only doubles", 1 << 20, time.Microsecond, 2 << 20},
		{"1 MB/s: 2 s worth", 4 << 20, 4 * time.Second, 2 << 20},
		{"4 MB/s: 2 s worth, below twice", 8 << 20, 2 * time.Second, 8 << 20},
		{"never below the minimum", minChunk, time.Minute, minChunk},
		{"never above the maximum", maxChunk, time.Millisecond, maxChunk},
	} {
		if got := nextChunk(c.n, c.el, idle); got != c.want {
			t.Errorf("%s: nextChunk(%d, %v) = %d, want %d", c.name, c.n, c.el, got, c.want)
		}
	}
}

// TestFetchWithCDITools converts an image through a fetch URL the way CDI's
// importer does (nbdkit's curl plugin under qemu-img), and with qemu-img's
// own http driver, and compares the result with the original.
func TestFetchWithCDITools(t *testing.T) {
	needQemu(t)
	needTool(t, "nbdkit")
	src := makeImage(t, "64M")
	e := newEnv(t, nil)
	id, _ := e.stored(src)
	url := e.fetchURL(id, time.Hour)
	dir := t.TempDir()

	t.Run("nbdkit curl + qemu-img convert", func(t *testing.T) {
		sock := filepath.Join(dir, "nbd.sock")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		nbd := exec.CommandContext(ctx, "nbdkit", "--foreground", "--readonly", "--exit-with-parent", "-U", sock, "curl", "url="+url)
		var nbdErr bytes.Buffer
		nbd.Stderr = &nbdErr
		if err := nbd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { nbd.Process.Kill(); nbd.Wait() }()
		waitFor(t, "nbdkit's socket", func() bool { _, err := os.Stat(sock); return err == nil })
		out := filepath.Join(dir, "nbd.raw")
		convert := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", "nbd+unix:///?socket="+sock, out)
		if b, err := convert.CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert over nbdkit: %v\n%s\nnbdkit: %s", err, b, nbdErr.String())
		}
		compareWithSource(t, src, out)
	})
	t.Run("qemu-img http driver", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out := filepath.Join(dir, "http.raw")
		// -m 1: qemu-img's http driver can hang in parallel mode.
		spec := fmt.Sprintf(`json:{"file.driver":"http","file.url":%q}`, url)
		convert := exec.CommandContext(ctx, "qemu-img", "convert", "-m", "1", "-f", "qcow2", "-O", "raw", spec, out)
		if b, err := convert.CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert over http: %v\n%s", err, b)
		}
		compareWithSource(t, src, out)
	})
}

// compareWithSource checks the converted disk against the source with
// qemu-img compare, and that it is not all zeros (what a server that
// ignores ranges makes nbdkit produce).
func compareWithSource(t *testing.T, src, raw string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	if b, err := exec.CommandContext(ctx, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", src, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img compare: %v\n%s", err, b)
	}
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, bytes.Repeat([]byte{0xab}, 16)) {
		t.Fatalf("converted disk starts with % x, want the 0xab pattern", b)
	}
}

// openFails is blobs whose Open fails: the blob a large transfer opens for
// itself (the shared one comes from openBlobs, opened before).
type openFails struct{ Blobs }

func (openFails) Open(context.Context, string) (imagestore.Blob, error) {
	return nil, errors.New("open: input/output error")
}

// TestFetchOpenFailureCounted: a fetch whose own blob cannot be opened is
// our 500 internal and is counted as a failed transfer, as every other
// refusal of a fetch is, so the metrics agree with the answers.
func TestFetchOpenFailureCounted(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	id, data := e.stored(makeImage(t, "64M"))
	if len(data) <= smallRange {
		t.Fatalf("the image is %d bytes, want more than smallRange (%d) to take its own blob", len(data), smallRange)
	}
	url := e.fetchURL(id, time.Hour)
	e.g.blobs = openFails{e.g.blobs}
	failed := func() float64 {
		return testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirFetch, outcomeFailed))
	}
	before := failed()
	resp, b := get(t, "GET", url)
	if resp.StatusCode != 500 || !bytes.Contains(b, []byte(`"internal"`)) {
		t.Fatalf("GET with the blob failing to open: %d %s, want 500 internal", resp.StatusCode, b)
	}
	if got := failed() - before; got != 1 {
		t.Errorf("transfers{fetch,failed} rose by %v, want 1", got)
	}
	e.waitSlotFreed(dirFetch)
}
