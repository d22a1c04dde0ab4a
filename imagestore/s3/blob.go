package s3

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// blob is a committed blob open for reading: every read is a ranged GET
// of its object, made to match the ETag seen at Open. It is safe for
// concurrent use (the gateway shares one between fetches); Close ends
// the Sections still open.
type blob struct {
	s    *Store
	id   string
	key  string
	size int64
	mod  time.Time
	etag string

	mu       sync.Mutex
	sections map[io.Closer]struct{}
	closed   bool
}

var _ imagestore.Blob = (*blob)(nil)

// ReadAt is one ranged GET; io.EOF at the end, as io.ReaderAt says.
func (b *blob) ReadAt(p []byte, off int64) (int, error) {
	return b.s.readAt(context.Background(), b.key, b.etag, b.size, p, off)
}

// Size is the size at Open; blobs are immutable once committed.
func (b *blob) Size() int64 { return b.size }

// ModTime is the object's modification time as the server keeps it (the
// completion of its upload), the same from every replica.
func (b *blob) ModTime() time.Time { return b.mod }

// Section streams n bytes from off with one ranged GET: the body is read
// as the caller reads, nothing of the range is buffered here. It is
// closed by Close, or at its end.
func (b *blob) Section(off, n int64) (io.Reader, error) {
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return nil, fmt.Errorf("s3: section [%d, +%d) outside blob of %d bytes", off, n, b.size)
	}
	if n == 0 {
		return strings.NewReader(""), nil
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("s3: section of %s: blob closed", b.id)
	}
	b.mu.Unlock()
	// The request lives as long as the reader: the caller's pace sets
	// how long, so no deadline here. The watchdog fails it only while the
	// caller waits on the server (the answer's headers, then each Read)
	// and nothing arrives; Close cancels it.
	wd := b.s.watch(context.Background())
	body, err := b.s.rangeGet(wd.ctx, b.key, b.etag, off, n)
	wd.pause()
	if err != nil {
		wd.stop()
		return nil, err
	}
	sec := &section{b: b, body: body, wd: wd, left: n}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		sec.close()
		return nil, fmt.Errorf("s3: section of %s: blob closed", b.id)
	}
	if b.sections == nil {
		b.sections = map[io.Closer]struct{}{}
	}
	b.sections[sec] = struct{}{}
	return sec, nil
}

// Close ends the blob and every Section still reading.
func (b *blob) Close() error {
	b.mu.Lock()
	secs := b.sections
	b.sections, b.closed = nil, true
	b.mu.Unlock()
	for c := range secs {
		_ = c.Close() // read-only: a close error loses nothing
	}
	return nil
}

// section is the body of one ranged GET.
type section struct {
	b    *blob
	body io.ReadCloser
	wd   *watchdog
	left int64
	once sync.Once
}

func (s *section) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	s.wd.progress()
	n, err := s.body.Read(p)
	s.wd.pause()
	s.left -= int64(n)
	if err == io.EOF && s.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		err = s.b.s.errorf(s.wd.err(err), "read %s", s.b.id)
	}
	if s.left == 0 || err != nil {
		s.close()
		s.b.mu.Lock()
		delete(s.b.sections, s)
		s.b.mu.Unlock()
		if err == nil {
			err = io.EOF
		}
	}
	return n, err
}

func (s *section) Close() error {
	s.close()
	return nil
}

func (s *section) close() {
	s.once.Do(func() {
		_ = s.body.Close()
		s.wd.stop()
	})
}
