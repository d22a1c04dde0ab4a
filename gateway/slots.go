package gateway

// slots bounds the transfers (uploads and fetches together) that run at
// once. fasthttp's Concurrency counts connections, and a thousand idle
// keep-alive connections must not stop a transfer, so the bound lives here.
type slots chan struct{}

func newSlots(n int) slots { return make(slots, n) }

// tryAcquire takes a slot without waiting; the caller answers 503 when it
// cannot have one.
func (s slots) tryAcquire() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s slots) release() { <-s }

// free reports whether a slot is free now; the answer may be stale at once,
// so it is only used for the early answer to "Expect: 100-continue".
func (s slots) free() bool { return len(s) < cap(s) }
