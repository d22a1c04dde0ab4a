package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Group commit. SQLite has one writer, and each write transaction ends in
// an fsync of the WAL (synchronous FULL): at a few hundred tickets a
// second the writer is busy most of the time, and one slow fsync (the disk
// is shared) left every ticket behind it waiting for a commit of its own.
// A grouped write is instead queued; one goroutine takes everything
// queued, runs it in one transaction, each caller's work inside a
// SAVEPOINT of its own, and commits once. While that commit runs the next
// callers queue up, so under load a batch grows to what arrived during
// the last one, and alone a write waits for nothing but its own commit.
//
// A caller's refusal (see refusal) rolls back to its savepoint and is
// returned to it alone; any other error, and a failed commit, is the
// transaction's and goes to every caller of the batch (the engine may
// have run the whole batch again first, as it runs any write again: on a
// full disk after releasing its reserve). Every caller returns after the
// commit holding its work, with the durability of a write of its own.

// maxGroup bounds a batch: past it, one refusal's ROLLBACK TO and the
// commit's WAL frames grow with no gain in fsyncs saved.
const maxGroup = 128

// errClosed answers a grouped write that Close found still queued, and any
// queued after.
var errClosed = errors.New("store closed")

// grouped is one caller's queued work.
type grouped struct {
	op    string
	fn    func(ctx context.Context, tx *Tx) error
	taken bool          // out of the queue (into a batch, or failed by Close); under group.mu
	err   error         // set before done is closed
	done  chan struct{} // closed once err is final: after the batch's commit
}

// group queues grouped writes and runs them in batches, one at a time.
type group struct {
	e       Engine
	timeout time.Duration // of a batch's transaction
	mu      sync.Mutex
	queue   []*grouped
	closed  bool
	wake    chan struct{} // capacity 1: work was queued
	stop    chan struct{} // closed by close
	stopped chan struct{} // closed when run has returned
	commits atomic.Int64  // batches run, for tests
}

func newGroup(e Engine, timeout time.Duration) *group {
	g := &group{e: e, timeout: timeout, wake: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	go g.run()
	return g
}

// do queues fn and waits for the commit of the batch that ran it. fn must
// use the context it is given, not the caller's: once taken into a batch
// the work runs to its commit whatever happens to the caller's context
// (an interrupted statement would roll back the whole batch). A caller
// whose ctx ends while its work is still queued gets ctx.Err(), and its
// work never runs; one whose ctx ends once its work was taken gets
// errBatchRunning and ctx.Err() at once, not the batch's answer: every
// wait of a store call is bounded, and its work may still commit, as a
// write sent to a server that stalled may, which its caller must allow
// for (imagestore.ErrStoreUnavailable).
func (g *group) do(ctx context.Context, op string, fn func(ctx context.Context, tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w := &grouped{op: op, fn: fn, done: make(chan struct{})}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return fmt.Errorf("%s: %w", op, errClosed)
	}
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if !w.taken {
		g.queue = removeGrouped(g.queue, w)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	select { // taken: its batch commits or fails as a whole
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("%s: %w: %w", op, errBatchRunning, ctx.Err())
	}
}

// errBatchRunning: the caller stopped waiting for the batch that runs
// its work, which may yet commit it.
var errBatchRunning = errors.New("no answer yet from the batch committing it")

func removeGrouped(q []*grouped, w *grouped) []*grouped {
	for i, v := range q {
		if v == w {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q
}

// take removes up to maxGroup queued works, oldest first.
func (g *group) take() []*grouped {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := min(len(g.queue), maxGroup)
	if n == 0 {
		return nil
	}
	ws := make([]*grouped, n)
	copy(ws, g.queue)
	g.queue = append(g.queue[:0], g.queue[n:]...)
	for _, w := range ws {
		w.taken = true
	}
	return ws
}

func (g *group) run() {
	defer close(g.stopped)
	for {
		select {
		case <-g.wake:
		case <-g.stop:
			return
		}
		for ws := g.take(); len(ws) > 0; ws = g.take() {
			g.commit(ws)
		}
	}
}

// commit runs ws in one write transaction and answers each of them.
func (g *group) commit(ws []*grouped) {
	// Taken work runs whatever its callers' contexts do, within a call's
	// deadline of its own; Close waits for it, so nothing outlives the
	// store.
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	own := make([]error, len(ws))
	op := ws[0].op
	for _, w := range ws[1:] {
		if w.op != op {
			op = "grouped writes"
			break
		}
	}
	if len(ws) > 1 {
		op = fmt.Sprintf("%s (%d grouped)", op, len(ws))
	}
	err := g.write(ctx, op, func(tx *Tx) error {
		for i, w := range ws {
			own[i] = nil // the engine may run the batch again
			if _, err := tx.ExecContext(ctx, `SAVEPOINT grouped`); err != nil {
				return err
			}
			if err := w.fn(ctx, tx); err != nil {
				if !refusal(err) {
					return err
				}
				own[i] = err
				if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT grouped`); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT grouped`); err != nil {
				return err
			}
		}
		return nil
	})
	g.commits.Add(1)
	for i, w := range ws {
		switch {
		case err != nil:
			w.err = err
		case own[i] != nil:
			w.err = fmt.Errorf("%s: %w", w.op, own[i])
		}
		close(w.done)
	}
}

// write is the engine's Write, with a panic turned into the batch's
// error: on a goroutine of the group it would end the process, where the
// caller's own goroutine (an HTTP handler's) would have been recovered.
func (g *group) write(ctx context.Context, op string, fn func(tx *Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: panic: %v", op, p)
		}
	}()
	return g.e.Write(ctx, op, fn)
}

// refusal tells a caller's own answer, which the records give when the
// data say no (a quota reached, a name taken, a row missing, a ticket
// used), from a failure of the transaction: only a refusal is rolled back
// to the caller's savepoint while the batch goes on.
func refusal(err error) bool {
	for _, r := range []error{imagestore.ErrQuota, imagestore.ErrExists, imagestore.ErrNotFound,
		imagestore.ErrTicketUsed, imagestore.ErrTicketExpired, imagestore.ErrTicketCancelled} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// close fails the queued works with errClosed, waits for the batch
// running, if any, and stops the goroutine. Grouped writes after it fail.
func (g *group) close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		<-g.stopped
		return
	}
	g.closed = true
	q := g.queue
	g.queue = nil
	for _, w := range q {
		w.taken = true
		w.err = fmt.Errorf("%s: %w", w.op, errClosed)
		close(w.done)
	}
	g.mu.Unlock()
	close(g.stop)
	<-g.stopped
}
