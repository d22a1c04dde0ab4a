package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// openBlobs keeps committed blobs open between fetches of the same image.
// An importer reads one image in thousands of small ranges; opening and
// stat-ing the file for each would cost more than the read. Only ReadAt
// (pread) is used on a shared blob, never Section: that moves the file
// offset, so a sendfile(2) transfer opens a blob of its own.
//
// A blob stays open while a request uses it and for linger after the last
// one let it go, then it is closed. So the disk space of a removed image is
// given back at most linger after its last fetch ended: new fetches of it
// are refused before they get here (the token no longer names it).
type openBlobs struct {
	blobs  blobOpener
	linger time.Duration

	mu   sync.Mutex
	open map[string]*sharedBlob
}

func newOpenBlobs(blobs blobOpener, linger time.Duration) *openBlobs {
	return &openBlobs{blobs: blobs, linger: linger, open: make(map[string]*sharedBlob)}
}

// sharedBlob is one use of a shared open blob: Close ends the use, not the
// blob.
type sharedBlob struct {
	imagestore.Blob
	c    *openBlobs
	id   string
	refs int         // uses not yet closed; guarded by c.mu
	idle *time.Timer // closes the blob linger after refs fell to 0
}

// use is one request's hold on a shared blob.
type use struct {
	*sharedBlob
	closed sync.Once
}

// Close ends this use; the blob itself closes later (see openBlobs).
func (u *use) Close() error {
	u.closed.Do(u.sharedBlob.release)
	return nil
}

// get returns a use of blob id, opening it if no request holds it open.
func (c *openBlobs) get(ctx context.Context, id string) (imagestore.Blob, error) {
	c.mu.Lock()
	if b := c.open[id]; b != nil {
		b.refs++
		c.mu.Unlock()
		return &use{sharedBlob: b}, nil
	}
	c.mu.Unlock()
	// Opened without the lock: a slow store must not hold up fetches of
	// other images. Two requests may both open it; the second keeps the
	// first one's and closes its own.
	blob, err := c.blobs.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.open[id]; b != nil {
		b.refs++
		_ = blob.Close()
		return &use{sharedBlob: b}, nil
	}
	b := &sharedBlob{Blob: blob, c: c, id: id, refs: 1}
	b.idle = time.AfterFunc(c.linger, b.expire)
	b.idle.Stop() // armed when the last use ends
	c.open[id] = b
	return &use{sharedBlob: b}, nil
}

func (b *sharedBlob) release() {
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	b.refs--
	if b.refs == 0 {
		b.idle.Reset(b.c.linger)
	}
}

// expire closes the blob if no use took it up again meanwhile.
func (b *sharedBlob) expire() {
	b.c.mu.Lock()
	if b.refs > 0 || b.c.open[b.id] != b {
		b.c.mu.Unlock()
		return
	}
	delete(b.c.open, b.id)
	b.c.mu.Unlock()
	_ = b.Blob.Close() // read-only: a close error loses nothing
}

// closeAll closes every blob no request holds, at shutdown.
func (c *openBlobs) closeAll() {
	c.mu.Lock()
	var idle []*sharedBlob
	for id, b := range c.open {
		if b.refs == 0 {
			b.idle.Stop()
			delete(c.open, id)
			idle = append(idle, b)
		}
	}
	c.mu.Unlock()
	for _, b := range idle {
		_ = b.Blob.Close()
	}
}
