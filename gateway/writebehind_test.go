package gateway

import (
	"bytes"
	"errors"
	"sync"
	"syscall"
	"testing"
)

// gatedWriter appends what it is given, each Write only once the test lets
// it through, and fails from failAt bytes on.
type gatedWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	gate   chan struct{} // nil: never waits
	failAt int           // 0: never fails
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	if w.gate != nil {
		<-w.gate
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failAt > 0 && w.buf.Len()+len(p) > w.failAt {
		n := w.failAt - w.buf.Len()
		w.buf.Write(p[:n])
		return n, syscall.ENOSPC
	}
	return w.buf.Write(p)
}

func (w *gatedWriter) written() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// feed gives b's bytes to wb in reads of at most step bytes, as pump does.
func feed(t *testing.T, wb *writeBehind, b []byte, step int) {
	t.Helper()
	for len(b) > 0 {
		space := wb.space()
		if space == nil {
			t.Fatal("space: nil before any write failed")
		}
		n := copy(space, b[:min(step, len(b))])
		wb.filled(n)
		b = b[n:]
	}
}

// TestWriteBehindKeepsOrder: whatever the read sizes, the blob gets the
// bytes in their order, and the claim counts every one.
func TestWriteBehindKeepsOrder(t *testing.T) {
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	for _, step := range []int{1 << 10, 4093, 64 << 10, 1 << 20} {
		w := &gatedWriter{}
		claim := &spaceClaim{}
		wb := newWriteBehind(w, claim, make([]byte, 256<<10))
		feed(t, wb, data, step)
		if err := wb.flush(); err != nil {
			t.Fatalf("step %d: flush: %v", step, err)
		}
		if !bytes.Equal(w.written(), data) {
			t.Errorf("step %d: the blob holds %d bytes, not the %d given in order", step, len(w.written()), len(data))
		}
		if got := claim.written.Load(); got != int64(len(data)) {
			t.Errorf("step %d: claim counts %d bytes written, want %d", step, got, len(data))
		}
		wb.stop()
	}
}

// TestWriteBehindFlushWaits: flush returns only once every byte given is
// written. A checkpoint records the offset right after it; returning early
// would record bytes that are not on the disk yet.
func TestWriteBehindFlushWaits(t *testing.T) {
	w := &gatedWriter{gate: make(chan struct{})}
	wb := newWriteBehind(w, nil, make([]byte, ringBuffers*4096))
	// Open the gate before stopping: a failure below leaves the writer
	// waiting on it, and stop would wait on the writer until the
	// package's timeout.
	defer func() { close(w.gate); wb.stop() }()
	// Every buffer but one full and the last holding a part: as many
	// writes as buffers.
	data := bytes.Repeat([]byte("x"), (ringBuffers-1)*4096+100)
	feed(t, wb, data, 4096)
	flushed := make(chan error)
	go func() { flushed <- wb.flush() }()
	for i := range ringBuffers {
		select {
		case <-flushed:
			t.Fatalf("flush returned with %d of %d writes done", i, ringBuffers)
		case w.gate <- struct{}{}:
		}
	}
	if err := within(t, flushed, "flush after the last write"); err != nil {
		t.Fatal(err)
	}
	if got := len(w.written()); got != len(data) {
		t.Fatalf("after flush %d bytes written, want %d", got, len(data))
	}
}

// TestWriteBehindWriteFails: a failed write stops the reader (space is
// nil), nothing after it is written, and flush reports the error so that a
// full disk is still a 507.
func TestWriteBehindWriteFails(t *testing.T) {
	w := &gatedWriter{failAt: 10000}
	wb := newWriteBehind(w, nil, make([]byte, ringBuffers*4096))
	defer wb.stop()
	fed := 0
	for range 100 { // bounded: far more than the buffers the failure needs
		space := wb.space()
		if space == nil {
			break
		}
		n := copy(space, bytes.Repeat([]byte("y"), 4096))
		wb.filled(n)
		fed += n
	}
	err := wb.flush()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush after a failed write: %v, want ENOSPC", err)
	}
	if writeFailure(err).Status != 507 {
		t.Errorf("a failed write answers %d, want 507", writeFailure(err).Status)
	}
	if got := len(w.written()); got != 10000 {
		t.Errorf("%d bytes reached the blob, want the 10000 before the failure", got)
	}
	if fed >= 100*4096 {
		t.Error("the reader was never stopped after the failure")
	}
}
