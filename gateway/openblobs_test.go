package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// countingBlobs opens in-memory blobs and reports every open and close.
type countingBlobs struct {
	mu     sync.Mutex
	opens  int
	closed chan string
	fail   error // if set, every Open's answer
}

func (c *countingBlobs) Open(_ context.Context, id string) (imagestore.Blob, error) {
	c.mu.Lock()
	c.opens++
	fail := c.fail
	c.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	return &memBlob{Reader: bytes.NewReader([]byte("image " + id)), id: id, closed: c.closed}, nil
}

func (c *countingBlobs) openCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens
}

type memBlob struct {
	*bytes.Reader
	id     string
	closed chan string
}

func (b *memBlob) Close() error       { b.closed <- b.id; return nil }
func (b *memBlob) ModTime() time.Time { return time.Time{} }
func (b *memBlob) Section(off, n int64) (io.Reader, error) {
	return io.NewSectionReader(b, off, n), nil
}

// TestOpenBlobsShareAndLinger: requests of one image share one open blob;
// it closes once linger passed after its last use, and not before.
func TestOpenBlobsShareAndLinger(t *testing.T) {
	blobs := &countingBlobs{closed: make(chan string, 10)}
	const linger = 20 * time.Millisecond
	c := newOpenBlobs(blobs, linger)
	ctx := t.Context()

	a1, err := c.get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.get(ctx, "a")
	b1, _ := c.get(ctx, "b")
	if n := blobs.openCount(); n != 2 {
		t.Fatalf("three uses of two images opened %d blobs, want 2", n)
	}
	buf := make([]byte, 7)
	if _, err := a2.ReadAt(buf, 0); err != nil || string(buf) != "image a" {
		t.Fatalf("ReadAt through a shared use: %q, %v", buf, err)
	}
	a1.Close()
	a1.Close() // a second Close of one use must not end another's
	b1.Close()
	if id := within(t, blobs.closed, "image b closed after its linger"); id != "b" {
		t.Fatalf("closed %s, want b (a is still in use)", id)
	}
	a2.Close()
	if id := within(t, blobs.closed, "image a closed after its last use"); id != "a" {
		t.Fatalf("closed %s, want a", id)
	}
	select {
	case id := <-blobs.closed:
		t.Fatalf("blob %s closed twice", id)
	default:
	}
	// Once closed, the next use opens it again.
	a3, _ := c.get(ctx, "a")
	defer a3.Close()
	if n := blobs.openCount(); n != 3 {
		t.Errorf("a use after the close opened %d blobs in all, want 3", n)
	}
}

// TestOpenBlobsOpenFails: a failed open is the caller's error and leaves
// nothing behind; the next request opens again.
func TestOpenBlobsOpenFails(t *testing.T) {
	down := errors.New("disk gone")
	blobs := &countingBlobs{closed: make(chan string, 10), fail: down}
	c := newOpenBlobs(blobs, time.Hour)
	if _, err := c.get(t.Context(), "a"); !errors.Is(err, down) {
		t.Fatalf("get with Open failing: %v, want its error", err)
	}
	blobs.mu.Lock()
	blobs.fail = nil
	blobs.mu.Unlock()
	b, err := c.get(t.Context(), "a")
	if err != nil {
		t.Fatalf("get once Open works: %v", err)
	}
	defer b.Close()
	if n := blobs.openCount(); n != 2 {
		t.Errorf("%d opens, want 2: the failure must not be kept", n)
	}
}
