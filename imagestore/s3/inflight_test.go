package s3_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// partGate stands between a Store and the server and sees every part
// PUT: before forwarding part n it calls before(ctx, n), which may hold
// the part or fail it; after the answer, after(n). It records the part
// numbers of every completion, in the order the request lists them, and
// counts the part requests running.
type partGate struct {
	rt     http.RoundTripper
	before func(ctx context.Context, n int) error
	after  func(n int)

	running atomic.Int64
	mu      sync.Mutex
	listed  [][]int
}

func newPartGate() *partGate {
	return &partGate{rt: http.DefaultTransport.(*http.Transport).Clone()}
}

func (g *partGate) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	if r.Method == http.MethodPost && q.Has("uploadId") && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		var c struct {
			Parts []struct{ PartNumber int } `xml:"Part"`
		}
		if err := xml.Unmarshal(body, &c); err == nil {
			var nums []int
			for _, p := range c.Parts {
				nums = append(nums, p.PartNumber)
			}
			g.mu.Lock()
			g.listed = append(g.listed, nums)
			g.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	n, err := strconv.Atoi(q.Get("partNumber"))
	if r.Method != http.MethodPut || !q.Has("uploadId") || err != nil {
		return g.rt.RoundTrip(r)
	}
	g.running.Add(1)
	defer g.running.Add(-1)
	if g.before != nil {
		if err := g.before(r.Context(), n); err != nil {
			if r.Body != nil {
				r.Body.Close()
			}
			return nil, err
		}
	}
	res, err := g.rt.RoundTrip(r)
	if err == nil && g.after != nil {
		// The answer is only whole once its body is read.
		b, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(b))
		if rerr == nil {
			g.after(n)
		}
	}
	return res, err
}

func (g *partGate) completions() [][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.listed)
}

// gatedConfig is testConfig with g as the transport and one try per
// request, so that a failed part is not sent again.
func gatedConfig(srv *s3test.Server, g *partGate) s3.Config {
	cfg := testConfig(srv)
	cfg.Transport = g
	cfg.MaxRetries = 1
	return cfg
}

// ungated is cfg (the same prefix) without the gate: another replica.
func ungated(cfg s3.Config) s3.Config {
	cfg.Transport = nil
	return cfg
}

// writeAll writes data in odd-sized pieces, as a request body arrives.
func writeAll(w imagestore.BlobWriter, data []byte) error {
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 1<<20+3)
		if _, err := w.Write(rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

// commitAll creates blob id, writes data to it in writeAll's pieces and
// commits it; the test fails at the first error.
func commitAll(t *testing.T, st *s3.Store, id string, data []byte) {
	t.Helper()
	ctx := context.Background()
	w, err := st.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if err := writeAll(w, data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// resumeCommit resumes blob id of st at offset at, writes rest after it
// and commits: the second life of an upload the tests cut off.
func resumeCommit(t *testing.T, st *s3.Store, id string, at int64, rest []byte) {
	t.Helper()
	ctx := context.Background()
	w, err := st.Resume(ctx, id, at)
	if err != nil {
		t.Fatalf("Resume at %d: %v", at, err)
	}
	defer w.Abort()
	if err := writeAll(w, rest); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPartsOverlap: part 1 is held by the server until part 2 has been
// answered, so part 2 lands first; the writer must have sent it while
// part 1 was in flight, and the completion must still list the parts in
// number order, so that the blob reads back as written.
func TestPartsOverlap(t *testing.T) {
	srv := s3test.StartServer(t)
	g := newPartGate()
	part2 := make(chan struct{})
	var once sync.Once
	overlapped := atomic.Bool{}
	g.before = func(ctx context.Context, n int) error {
		if n != 1 {
			return nil
		}
		// A writer that sends one part at a time never sends part 2
		// while this waits: the bound only keeps such a writer from
		// hanging the test.
		select {
		case <-part2:
			overlapped.Store(true)
		case <-time.After(20 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	g.after = func(n int) {
		if n == 2 {
			once.Do(func() { close(part2) })
		}
	}
	cfg := gatedConfig(srv, g)
	cfg.PartsInFlight, cfg.SpareParts = 2, 2
	st := open(t, cfg)
	id := imagestore.NewUploadID()
	data := blobtest.Pattern(7, 4*partSize+12345)
	commitAll(t, st, id, data)
	if !overlapped.Load() {
		t.Error("part 2 was not sent while part 1 was in flight")
	}
	if got := g.completions(); len(got) != 1 || !slices.Equal(got[0], []int{1, 2, 3, 4, 5}) {
		t.Errorf("completions listed parts %v, want one listing [1 2 3 4 5]", got)
	}
	if got := blobtest.Committed(t, open(t, ungated(cfg)), id); !bytes.Equal(got, data) {
		t.Fatalf("committed %d bytes that differ from the %d written", len(got), len(data))
	}
	if n := s3.PartBuffers(st); n != 0 {
		t.Errorf("%d part buffers held after Commit", n)
	}
}

// TestSyncWaitsForPartsInFlight: Sync promises that every byte written is
// in S3, so it must not return while a part is still being sent; then a
// fresh Store resumes at the synced offset.
func TestSyncWaitsForPartsInFlight(t *testing.T) {
	srv := s3test.StartServer(t)
	g := newPartGate()
	arrived, release := make(chan struct{}), make(chan struct{})
	var answered atomic.Bool
	g.before = func(ctx context.Context, n int) error {
		if n == 1 {
			close(arrived)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	g.after = func(n int) {
		if n == 1 {
			answered.Store(true)
		}
	}
	cfg := gatedConfig(srv, g)
	ctx := context.Background()
	id := imagestore.NewUploadID()
	data := blobtest.Pattern(8, 2*partSize+100)
	w, err := open(t, cfg).Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	at := partSize + 10
	if _, err := w.Write(data[:at]); err != nil {
		t.Fatal(err)
	}
	<-arrived
	synced := make(chan error, 1)
	go func() { synced <- w.Sync() }()
	// A Sync that does not wait returns within this bound; one that
	// waits cannot return before part 1 is released.
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) while part 1 was still in flight", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if !answered.Load() {
		t.Fatal("Sync returned before part 1 was answered")
	}
	resumeCommit(t, open(t, ungated(cfg)), id, int64(at), data[at:]) // no Close: the process died
	if got := blobtest.Committed(t, open(t, ungated(cfg)), id); !bytes.Equal(got, data) {
		t.Fatalf("resumed blob of %d bytes differs from the %d written", len(got), len(data))
	}
}

// TestPartFailureInFlight: a part that fails while later bytes are
// written fails a later Write, then every Write, Sync and Commit with the
// same error; Abort leaves no upload, part or tail behind.
func TestPartFailureInFlight(t *testing.T) {
	srv := s3test.StartServer(t)
	g := newPartGate()
	errPart := errors.New("part 2 refused on purpose")
	g.before = func(ctx context.Context, n int) error {
		if n == 2 {
			return errPart
		}
		return nil
	}
	cfg := gatedConfig(srv, g)
	st := open(t, cfg)
	ctx := context.Background()
	id := imagestore.NewUploadID()
	w, err := st.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// A tail and a durable offset, so that Abort has them to remove.
	if _, err := w.Write([]byte("start")); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	// Part 2 is sent in the background; its failure must come back from
	// a later Write, at the latest once the budget makes one wait for it.
	var first error
	for i := range 20 {
		if _, err := w.Write(blobtest.Pattern(byte(i), partSize)); err != nil {
			first = err
			break
		}
	}
	if first == nil {
		t.Fatal("20 parts written after part 2 failed, no error")
	}
	if !errors.Is(first, errPart) {
		t.Errorf("Write after the failed part: %v, want the part's error", first)
	}
	if _, err := w.Write([]byte("more")); !errors.Is(err, errPart) {
		t.Errorf("next Write: %v, want the part's error", err)
	}
	if err := w.Sync(); !errors.Is(err, errPart) {
		t.Errorf("Sync: %v, want the part's error", err)
	}
	if err := w.Commit(ctx); !errors.Is(err, errPart) {
		t.Errorf("Commit: %v, want the part's error", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n := g.running.Load(); n != 0 {
		t.Errorf("%d part requests still running after Abort", n)
	}
	if n := s3.PartBuffers(st); n != 0 {
		t.Errorf("%d part buffers held after Abort", n)
	}
	assertNoUpload(t, cfg, id)
}

// assertNoUpload: nothing of id's write is left in the bucket.
func assertNoUpload(t *testing.T, cfg s3.Config, id string) {
	t.Helper()
	key := cfg.Prefix + "/images/" + id + ".qcow2"
	for u := range rawClient(t, cfg).ListIncompleteUploads(context.Background(), cfg.Bucket, key, false) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("unfinished upload left: %s %s", u.Key, u.UploadID)
	}
	if left := listAll(t, cfg, cfg.Prefix+"/"); len(left) != 0 {
		t.Errorf("objects left: %v", left)
	}
}

// TestAbortWhileWriteWaits: a Write waiting for parts the server holds is
// ended by an Abort from another goroutine; Abort returns only once no
// part request runs, and leaves nothing behind.
func TestAbortWhileWriteWaits(t *testing.T) {
	srv := s3test.StartServer(t)
	g := newPartGate()
	held := make(chan int, 10)
	g.before = func(ctx context.Context, n int) error {
		held <- n
		<-ctx.Done() // only the writer's cancel lets it go
		return ctx.Err()
	}
	cfg := gatedConfig(srv, g)
	cfg.PartsInFlight, cfg.SpareParts = 2, 2
	st := open(t, cfg)
	ctx := context.Background()
	id := imagestore.NewUploadID()
	w, err := st.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() { _, err := w.Write(make([]byte, 6*partSize)); wrote <- err }()
	// Both parts in flight are held, so the Write waits for a buffer.
	<-held
	<-held
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n := g.running.Load(); n != 0 {
		t.Errorf("%d part requests still running after Abort", n)
	}
	if err := <-wrote; err == nil {
		t.Error("the Write that Abort cut short succeeded")
	}
	if n := s3.PartBuffers(st); n != 0 {
		t.Errorf("%d part buffers held after Abort", n)
	}
	assertNoUpload(t, cfg, id)
}

// TestPartBudget: however much a client sends at once, a writer holds at
// most 1 + PartsInFlight part buffers, and all writers together at most
// one each plus SpareParts; the spares come back when a writer ends.
func TestPartBudget(t *testing.T) {
	srv := s3test.StartServer(t)
	g := newPartGate()
	var st *s3.Store
	var peak atomic.Int64
	// Each part PUT that arrives samples the count: every buffer is
	// taken before its part is sent.
	g.before = func(ctx context.Context, n int) error {
		for {
			p, b := peak.Load(), s3.PartBuffers(st)
			if b <= p || peak.CompareAndSwap(p, b) {
				return nil
			}
		}
	}
	cfg := gatedConfig(srv, g)
	cfg.PartsInFlight, cfg.SpareParts = 2, 1
	st = open(t, cfg)
	ctx := context.Background()
	write := func(seed byte, parts int) {
		t.Helper()
		id := imagestore.NewUploadID()
		data := blobtest.Pattern(seed, parts*partSize+7)
		w, err := st.Create(ctx, id)
		if err != nil {
			t.Error(err)
			return
		}
		defer w.Abort()
		if _, err := w.Write(data); err != nil { // all at once
			t.Error(err)
			return
		}
		if err := w.Commit(ctx); err != nil {
			t.Error(err)
		}
	}

	// One writer alone: its first buffer and the one spare.
	write(1, 6)
	if p := peak.Load(); p != 2 {
		t.Errorf("one writer held at most %d part buffers, want 2 (its own and the one spare)", p)
	}
	// Three at once: one each and the spare.
	peak.Store(0)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { write(byte(10+i), 5) })
	}
	wg.Wait()
	if p := peak.Load(); p > 3+1 {
		t.Errorf("three writers held %d part buffers at once, budget 3 + 1 spare", p)
	}
	if n := s3.PartBuffers(st); n != 0 {
		t.Errorf("%d part buffers held after the writers ended", n)
	}
	// The spare came back: a writer alone gets it again.
	peak.Store(0)
	write(30, 4)
	if p := peak.Load(); p != 2 {
		t.Errorf("a writer after the others ended held at most %d part buffers, want 2: the spare was not given back", p)
	}

	// With more spares, one writer stops at 1 + PartsInFlight.
	cfg.SpareParts = 5
	st = open(t, cfg)
	peak.Store(0)
	write(20, 8)
	if p := peak.Load(); p != 3 {
		t.Errorf("one writer with 5 spares free held at most %d part buffers, want 1 + PartsInFlight = 3", p)
	}
}
