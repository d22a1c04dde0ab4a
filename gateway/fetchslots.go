package gateway

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/internal/apierr"
)

// DefaultFetchQueueWait is how long a fetch beyond MaxTransfers waits for a
// slot before 503, when Config.FetchQueueWait is zero.
const DefaultFetchQueueWait = 30 * time.Second

// queuePoll is how often a waiting fetch looks whether its client is
// still there and whether its token got a slot meanwhile.
const queuePoll = 100 * time.Millisecond

// fetchHolders counts, per fetch token, the requests sharing the one
// transfer slot the token holds. A CDI importer reads one image with a
// whole GET and, while that runs, many small range reads (nbdkit,
// qemu-img info): they are one transfer, and must not need a slot each.
type fetchHolders struct {
	mu   sync.Mutex
	held map[string]int // token -> requests holding its slot
}

// join adds a request to the token's slot if it holds one.
func (h *fetchHolders) join(token string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[token] == 0 {
		return false
	}
	h.held[token]++
	return true
}

// acquireFetchSlot gives a GET of token a share of a transfer slot: the
// token's own if it holds one, else a free one, else the first one freed
// within Config.FetchQueueWait. It gives up early when the gateway shuts
// down or the client goes away. release is to be called once.
func (g *Gateway) acquireFetchSlot(ctx *fasthttp.RequestCtx, token string) (release func(), aerr *apierr.Error) {
	release = func() { g.releaseFetchSlot(token) }
	if g.fetches.join(token) {
		return release, nil
	}
	if !g.slots.tryAcquire() {
		joined, aerr := g.waitFetchSlot(ctx, token)
		if aerr != nil {
			return nil, aerr
		}
		if joined {
			return release, nil
		}
	}
	g.fetches.mu.Lock()
	n := g.fetches.held[token]
	g.fetches.held[token] = n + 1
	g.fetches.mu.Unlock()
	if n > 0 { // another request of the token got a slot meanwhile: share that one
		g.slots.release()
	}
	return release, nil
}

// waitFetchSlot waits, bounded, until it takes a freed slot, or joins the
// token's slot if another request of the token got one meanwhile
// (joined), or gives up: 503 busy after FetchQueueWait, 503 shuttingDown,
// or the client went away.
func (g *Gateway) waitFetchSlot(ctx *fasthttp.RequestCtx, token string) (joined bool, aerr *apierr.Error) {
	queued := g.metrics.queued
	queued.Inc()
	defer queued.Dec()
	timer := time.NewTimer(g.cfg.FetchQueueWait)
	defer timer.Stop()
	poll := time.NewTicker(queuePoll)
	defer poll.Stop()
	for {
		select {
		case g.slots <- struct{}{}:
			return false, nil
		case <-timer.C:
			return false, answerBusy
		case <-g.stopping:
			return false, answerShuttingDown
		case <-poll.C:
			if peerClosed(ctx.Conn()) {
				ctx.SetConnectionClose()
				return false, answerClientGone
			}
			if g.fetches.join(token) {
				return true, nil
			}
		}
	}
}

var errClientGone = errors.New("client gone")

// releaseFetchSlot ends one request's share; the last one gives the slot
// back.
func (g *Gateway) releaseFetchSlot(token string) {
	g.fetches.mu.Lock()
	n := g.fetches.held[token] - 1
	if n <= 0 {
		delete(g.fetches.held, token)
		g.slots.release()
	} else {
		g.fetches.held[token] = n
	}
	g.fetches.mu.Unlock()
	if g.onSlotFreed != nil {
		g.onSlotFreed(dirFetch)
	}
}

// peerClosed reports whether the client closed its side of c (or reset
// it), without taking a byte it may have sent (a pipelined request).
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || (err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR))
		return true
	})
	return closed
}
