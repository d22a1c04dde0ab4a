package gateway

import (
	"io"
	"sync/atomic"
)

// ringBuffers is how many buffers an upload's memory is cut into: the
// socket reader fills one while the writer copies the other into the page
// cache. Two, not more: each full buffer handed over may wake the other
// goroutine, and on 2 cores those wake-ups cost more than the slack of
// smaller buffers gained. With four (256 KiB each) the bench measured
// 1.35-1.57 s of server CPU per GiB uploaded, with two 1.18-1.21 s, and
// more MB/s (three runs of each, alternating, 2026-12-04).
const ringBuffers = 2

// writeBehind writes an upload's accepted bytes into its blob on a
// goroutine of its own. On one core an upload is bound by the sum of
// reading the socket, hashing and copying into the page cache; with the
// copy here, the handler's goroutine reads, checks and hashes the next
// buffer meanwhile, and a second core does the copy.
//
// Nothing is written that was not checked and hashed first: the handler
// hands a buffer over only after the inspector and the hash saw its bytes,
// and in their order. The memory is the same bufSize per upload as a
// single buffer would be: it is cut into ringBuffers parts.
type writeBehind struct {
	w     io.Writer
	claim *spaceClaim
	todo  chan []byte   // filled buffers, in the order of the image
	free  chan []byte   // empty buffers for the reader
	done  chan struct{} // closed when the writer goroutine ended
	// failed is set once a write failed; err is that write's error,
	// readable once failed is seen set (the store orders them).
	failed atomic.Bool
	err    error
	cur    []byte // the buffer the reader fills; nil while it waits for one
}

// newWriteBehind starts the writer over mem, which it cuts into
// ringBuffers buffers. stop must be called.
func newWriteBehind(w io.Writer, claim *spaceClaim, mem []byte) *writeBehind {
	b := &writeBehind{
		w: w, claim: claim,
		todo: make(chan []byte, ringBuffers),
		free: make(chan []byte, ringBuffers),
		done: make(chan struct{}),
	}
	part := len(mem) / ringBuffers
	for i := range ringBuffers {
		b.free <- mem[i*part : i*part : (i+1)*part]
	}
	go b.run()
	return b
}

func (b *writeBehind) run() {
	defer close(b.done)
	for buf := range b.todo {
		if !b.failed.Load() {
			m, err := b.w.Write(buf)
			b.claim.wrote(m) // on the disk now, so no longer owed
			if err != nil {
				b.err = err
				b.failed.Store(true)
			}
		}
		b.free <- buf[:0]
	}
}

// space is the empty tail of the current buffer for the reader, waiting
// for a buffer the writer gave back if need be. It is nil if a write
// failed: the caller stops and asks failure.
func (b *writeBehind) space() []byte {
	if b.cur == nil {
		b.cur = <-b.free
	}
	if b.failed.Load() {
		return nil
	}
	return b.cur[len(b.cur):cap(b.cur)]
}

// filled records that the reader put n checked and hashed bytes into the
// space it was given; a full buffer goes to the writer.
func (b *writeBehind) filled(n int) {
	b.cur = b.cur[:len(b.cur)+n]
	if len(b.cur) == cap(b.cur) {
		b.todo <- b.cur
		b.cur = nil
	}
}

// flush hands the current buffer over and waits until every byte given
// so far is written (or a write failed): before a checkpoint, and at the
// end of the body.
func (b *writeBehind) flush() error {
	if b.cur != nil && len(b.cur) > 0 {
		b.todo <- b.cur
		b.cur = nil
	}
	// All buffers back in free means the writer has none left to write.
	held := make([][]byte, 0, ringBuffers)
	if b.cur != nil {
		held = append(held, b.cur)
		b.cur = nil
	}
	for len(held) < ringBuffers {
		held = append(held, <-b.free)
	}
	for _, buf := range held {
		b.free <- buf
	}
	return b.failure()
}

// failure is the first write error, or nil.
func (b *writeBehind) failure() error {
	if b.failed.Load() {
		return b.err
	}
	return nil
}

// stop ends the writer goroutine after it wrote what it was given, and
// waits for it: the blob may be committed or aborted only then.
func (b *writeBehind) stop() {
	close(b.todo)
	<-b.done
}
