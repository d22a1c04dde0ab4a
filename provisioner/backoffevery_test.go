package provisioner

import (
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestBackoffFollowsEvery: the backoff doubles from the configured time
// between passes, not from its default: with Every 45 s a failing order
// is tried again 45 s, 90 s, 3 min and 6 min after its failures, then at
// the 10 min cap (12 min would be next). Each wait is checked a
// nanosecond short of its end (not tried) and at its end (tried).
// TestBackoff runs at the default Every, where a backoff that ignored the
// setting looks the same.
func TestBackoffFollowsEvery(t *testing.T) {
	const every = 45 * time.Second
	if every == DefaultEvery {
		t.Fatal("the test's Every must differ from DefaultEvery")
	}
	h := newHarness(t, func(c *Config) { c.Every = every })
	h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.react("create", "virtualmachines", failing(apierrors.NewForbidden(testGR, "x", errors.New("no"))).react)
	tried := func() bool {
		n := 0
		for _, c := range h.creates() {
			if strings.HasPrefix(c, "create virtualmachines ") {
				n++
			}
		}
		h.clearActions()
		return n > 0
	}
	pass := func() bool {
		t.Helper()
		_ = h.p.ReconcileOnce(t.Context())
		return tried()
	}
	if !pass() {
		t.Fatal("the first pass did not try the order")
	}
	for i, wait := range []time.Duration{every, 2 * every, 4 * every, 8 * every, maxBackoff, maxBackoff} {
		h.clock.Advance(wait - time.Nanosecond)
		if pass() {
			t.Fatalf("failure %d: tried again %v after it, want not before %v", i+1, wait-time.Nanosecond, wait)
		}
		h.clock.Advance(time.Nanosecond)
		if !pass() {
			t.Fatalf("failure %d: not tried again %v after it", i+1, wait)
		}
	}
}
