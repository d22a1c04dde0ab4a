// Package settle runs, after a request has been answered, the work that
// makes the storage agree with that answer when the storage could not
// take it at once: the removal of what a failed upload wrote, the
// withdrawal of a ticket whose answer never reached its client, the undo
// of an upload answered an error. Run before the answer it would hold
// the client for the very deadlines that failed the request, and then
// fail too. Here the client has its answer first, and the work is tried
// again while the storage does not answer, for a bounded time. Shutdown
// stops the retries and waits for the try in progress (each has the
// storage's own deadlines), so that nothing outlives serve unannounced.
package settle

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Queue runs jobs in the background, each in a goroutine of its own.
type Queue struct {
	stop    <-chan struct{} // closed when the shutdown begins
	log     *slog.Logger
	passing func(error) bool // an error worth another try
	// First is the wait before the second try, doubled up to Max
	// between the later ones.
	First, Max time.Duration

	wg      sync.WaitGroup
	mu      sync.Mutex
	waiting bool // Wait has begun: no job joins wg any more
}

// New returns a queue whose jobs are tried again while they fail with an
// error passing accepts, and stop once stop is closed.
func New(stop <-chan struct{}, log *slog.Logger, passing func(error) bool, first, max time.Duration) *Queue {
	return &Queue{stop: stop, log: log, passing: passing, First: first, Max: max}
}

// Job is one piece of work and the words its log lines use.
type Job struct {
	// Name says what the job does: "remove upload".
	Name string
	// Attrs name what it acts on, for every log line: "upload_id", id.
	Attrs []any
	// Until is when it gives up.
	Until time.Time
	// Done is the line of a job that succeeded on a later try; Left
	// says what stays when it gives up or the shutdown stops it.
	Done, Left string
	Run        func() error
}

// Go tries j now, in the background, and again while it fails with a
// passing error, until j.Until or the shutdown. Once Wait has begun, a
// late job (of a request that outlived the shutdown's bound) is tried
// once, by its caller.
func (q *Queue) Go(j Job) {
	q.mu.Lock()
	if q.waiting {
		q.mu.Unlock()
		q.retry(j) // stop is closed: one try
		return
	}
	q.wg.Add(1)
	q.mu.Unlock()
	go func() {
		defer q.wg.Done()
		q.retry(j)
	}()
}

func (q *Queue) retry(j Job) {
	wait := q.First
	for tries := 1; ; tries++ {
		err := j.Run()
		switch {
		case err == nil:
			if tries > 1 {
				q.log.Info(j.Done, j.attrs("tries", tries)...)
			}
			return
		case !q.passing(err) || time.Now().After(j.Until):
			q.log.Error(j.Name+": "+j.Left, j.attrs("tries", tries, "err", err)...)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-q.stop:
			t.Stop()
			q.log.Warn(j.Name+" unfinished at shutdown: "+j.Left, j.attrs("tries", tries, "err", err)...)
			return
		case <-t.C:
		}
		wait = min(2*wait, q.Max)
	}
}

// attrs are j's attributes and more, in a slice of their own.
func (j Job) attrs(more ...any) []any { return slices.Concat(j.Attrs, more) }

// Wait waits until every job has ended, or ctx.
func (q *Queue) Wait(ctx context.Context) error {
	q.mu.Lock()
	q.waiting = true
	q.mu.Unlock()
	done := make(chan struct{})
	go func() { q.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("work settling earlier answers still running: %w", ctx.Err())
	}
}
