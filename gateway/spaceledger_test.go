package gateway

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// freeSpace is blobs whose free space the test sets.
type freeSpace struct {
	imagestore.Blobs
	free *atomic.Int64
}

func (f freeSpace) Available(context.Context) (int64, error) { return f.free.Load(), nil }

// ledgerGateway is a gateway (not serving) over a disk with free bytes
// free, for asking its space ledger directly.
func ledgerGateway(t *testing.T, free int64, mod func(*Config)) (*Gateway, *atomic.Int64) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	n := &atomic.Int64{}
	n.Store(free)
	cfg := Config{UploadMax: 1 << 30, MaxVirtualSize: 1 << 40, IdleTimeout: time.Second, MaxTransfers: 4, Headroom: 1 << 20}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg, st, freeSpace{free: n}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return g, n
}

func wantGranted(t *testing.T, what string, aerr *apierr.Error) {
	t.Helper()
	if aerr != nil {
		t.Fatalf("%s: %v, want granted", what, aerr)
	}
}

func wantNoSpace(t *testing.T, what string, aerr *apierr.Error) {
	t.Helper()
	if aerr == nil || aerr.Status != 507 || aerr.Reason != "noSpace" {
		t.Fatalf("%s: %v, want 507 noSpace", what, aerr)
	}
}

// TestTenantReserveCap: one tenant's running uploads hold at most
// TenantReserveMax of space not yet written, exactly up to it; another
// tenant is not held to the first one's share; written bytes and ended
// uploads give it back.
func TestTenantReserveCap(t *testing.T) {
	const capped = 10 << 20
	g, _ := ledgerGateway(t, 1<<30, func(c *Config) { c.TenantReserveMax, c.SessionAhead = capped, 2<<20 })
	const a, b = 1, 2
	put1, aerr := g.claimSpace(a, 6<<20, true)
	wantGranted(t, "A's PUT of 6 MiB", aerr)
	put2, aerr := g.claimSpace(a, 4<<20, true)
	wantGranted(t, "A's PUT of 4 MiB, up to the cap", aerr)
	_, aerr = g.claimSpace(a, 1, false)
	wantNoSpace(t, "A's one byte more", aerr)
	_, aerr = g.claimSession(a, 100<<20, false)
	wantNoSpace(t, "A's resumable request", aerr)
	_, aerr = g.claimSpace(b, capped, false)
	wantGranted(t, "B's PUT of the cap beside A's", aerr)

	put2.wrote(1 << 20) // on the disk: no longer held
	_, aerr = g.claimSession(a, 100<<20, true)
	wantNoSpace(t, "A's resumable request of 2 MiB beside 9 MiB held", aerr)
	put2.wrote(1 << 20)
	sess, aerr := g.claimSession(a, 100<<20, true)
	wantGranted(t, "A's resumable request of 2 MiB beside 8 MiB held", aerr)
	// Its next chunk must fit the cap too.
	wantNoSpace(t, "A's session's next chunk at the cap", g.cover(sess, 2<<20+1))
	put1.release()
	wantGranted(t, "A's session's next chunk once a PUT ended", g.cover(sess, 2<<20+1))
	sess.release()
	put2.release()
	_, aerr = g.claimSpace(a, capped, false)
	wantGranted(t, "A's PUT of the cap once all ended", aerr)
}

// TestSessionClaimGrows: a resumable request holds its next chunk, not
// its announced length: it takes one chunk at a time as the bytes come,
// exactly as long as the disk has room for it beside the headroom and the
// other promises, and never past the bytes the session lacks.
func TestSessionClaimGrows(t *testing.T) {
	const ahead, headroom = 4 << 20, 1 << 20
	g, free := ledgerGateway(t, headroom+ahead, func(c *Config) { c.SessionAhead = ahead })
	_, aerr := g.claimSession(1, 1<<30, false)
	wantGranted(t, "a session of 1 GiB on a disk with room for one chunk", aerr)
	free.Add(-1)
	_, aerr = g.claimSession(1, 1<<30, false)
	wantNoSpace(t, "a session with one byte less than a chunk free", aerr)

	free.Store(headroom + 3*ahead)
	c, aerr := g.claimSession(1, 10<<20, true)
	wantGranted(t, "a session of 10 MiB", aerr)
	_, aerr = g.claimSpace(2, 2*ahead, false)
	wantGranted(t, "a PUT of what is left beside the session's one chunk", aerr)
	_, aerr = g.claimSpace(2, 2*ahead+1, false)
	wantNoSpace(t, "a PUT of one byte more", aerr)
	wantGranted(t, "bytes within the first chunk", g.cover(c, ahead))
	// The chunk is written: the disk shows it, the claim no longer owes it.
	c.wrote(ahead)
	free.Add(-ahead)
	wantGranted(t, "the second chunk", g.cover(c, ahead+1))
	put, aerr := g.claimSpace(2, ahead, true)
	wantGranted(t, "a PUT of the last chunk's room", aerr)
	wantNoSpace(t, "the third chunk beside that PUT", g.cover(c, 2*ahead+1))
	put.release()
	c.wrote(ahead)
	free.Add(-ahead)
	// The session lacks 2 MiB: that is all its last chunk takes.
	wantGranted(t, "the last chunk, of the 2 MiB left", g.cover(c, 2*ahead+1))
	_, aerr = g.claimSpace(2, ahead-2<<20, false)
	wantGranted(t, "a PUT of the room its last 2 MiB leave", aerr)
	_, aerr = g.claimSpace(2, ahead-2<<20+1, false)
	wantNoSpace(t, "a PUT of one byte more beside the last chunk", aerr)
}
