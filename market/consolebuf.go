package market

import (
	"context"
	"sync"
)

// consoleBuffer holds the bytes a browser sent to a console that the
// machine's side has not taken yet: at most max of them. It lets the
// browser's side be read on while the console is still being opened or
// is slow to take bytes, so that a browser that leaves is seen at once,
// without holding more than max bytes per console.
type consoleBuffer struct {
	max   int
	mu    sync.Mutex
	buf   []byte
	ready chan struct{} // a token while buf holds bytes
	room  chan struct{} // a token when take emptied buf
}

func newConsoleBuffer(max int) *consoleBuffer {
	return &consoleBuffer{max: max, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// put appends p (at most max bytes), first waiting while that would make
// the buffer hold more than max; false when ctx ended first.
func (b *consoleBuffer) put(ctx context.Context, p []byte) bool {
	for {
		b.mu.Lock()
		if len(b.buf)+len(p) <= b.max {
			b.buf = append(b.buf, p...)
			b.mu.Unlock()
			signal(b.ready)
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.room:
		case <-ctx.Done():
			return false
		}
	}
}

// take waits for bytes and returns all of them, swapping in spare (which
// the caller gives back emptied on its next take); nil when ctx ended
// first.
func (b *consoleBuffer) take(ctx context.Context, spare []byte) []byte {
	for {
		b.mu.Lock()
		if len(b.buf) > 0 {
			p := b.buf
			b.buf = spare[:0]
			b.mu.Unlock()
			signal(b.room)
			return p
		}
		b.mu.Unlock()
		select {
		case <-b.ready:
		case <-ctx.Done():
			return nil
		}
	}
}

// signal leaves a token in c unless one waits there already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
