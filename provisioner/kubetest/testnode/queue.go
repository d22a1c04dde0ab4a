package testnode

import (
	"context"
	"errors"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// queue is one part's work: keys of objects to look at, each handled by
// one worker at a time, as a controller's work queue. A handler's error
// retries the key after a growing delay (10 ms to 30 s), as client-go's
// default rate limiter does; errRetryLater retries it after retryLater
// without counting as a failure.
type queue struct {
	name   string
	q      workqueue.TypedRateLimitingInterface[string]
	handle func(ctx context.Context, key string) error
	logf   func(string, ...any)
}

// errRetryLater: the key waits on something the node does not hear
// about by an event (a domain's socket, a file), and is looked at again
// after retryLater.
var errRetryLater = errors.New("not yet")

const retryLater = 500 * time.Millisecond

func newQueue(name string, handle func(context.Context, string) error, logf func(string, ...any)) *queue {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, 30*time.Second)
	return &queue{name: name, handle: handle, logf: logf,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: name})}
}

func (q *queue) add(key string) { q.q.Add(key) }

// run works on keys until ctx ends.
func (q *queue) run(ctx context.Context) {
	go func() { <-ctx.Done(); q.q.ShutDown() }()
	for {
		key, quit := q.q.Get()
		if quit {
			return
		}
		err := q.handle(ctx, key)
		switch {
		case err == nil:
			q.q.Forget(key)
		case errors.Is(err, errRetryLater):
			q.q.AddAfter(key, retryLater)
		case ctx.Err() != nil:
		default:
			q.logf("testnode: %s %s: %v", q.name, key, err)
			q.q.AddRateLimited(key)
		}
		q.q.Done(key)
	}
}
