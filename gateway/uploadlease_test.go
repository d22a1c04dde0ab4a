package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestPutHoldsLease: among replicas (Config.Replica set) a running plain
// upload holds its lease under the name the leader's sweep asks about, so
// the sweep leaves its quota place alone; and an upload whose lease lapses
// (its renewals come too late: the store's clock has passed it) stops at
// once, answered 503 storeUnreachable (never 408 idle: its bytes were
// flowing), keeps nothing, and gives its ticket back for the retry.
func TestPutHoldsLease(t *testing.T) {
	needQemu(t)
	head := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 1; c.Replica = "r1" })
	ctx := context.Background()
	newTicket := func() error {
		now := e.clock.Now()
		return e.st.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: e.tenant.ID,
			Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(imagestore.NewSecret()), 1)
	}
	up, id := e.ticket()
	rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(up, e.base), len(head)))
	rc.send(head[:2*preRead], "the first 16 KiB")
	waitFor(t, "the PUT to take its lease", func() bool {
		return e.st.CheckLease(ctx, uploadLeaseName(id), 1, e.clock.Now()) == nil
	})
	// The sweep's question, as if the upload were old: it is alive.
	now := e.clock.Now()
	if n, err := e.st.EndUnleasedUploads(ctx, uploadLeaseName(""), now, now.Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("EndUnleasedUploads beside the running PUT = %d, %v; want 0", n, err)
	}
	if err := newTicket(); !errors.Is(err, imagestore.ErrQuota) {
		t.Fatalf("ticket while the PUT runs: %v, want ErrQuota", err)
	}
	// The lease lapses: the PUT's next renewal finds it expired, and the
	// PUT stops.
	e.clock.Advance(uploadLeaseTTL + time.Second)
	resp, body := rc.answer("the PUT whose lease lapsed")
	wantStoreUnreachable(t, "the PUT whose lease lapsed", resp, body)
	e.logHas("upload lease lapsed: this request stops", "upload/"+id)
	e.waitSlotFreed(dirUpload)
	e.waitTicketBack(up)
	if err := newTicket(); !errors.Is(err, imagestore.ErrQuota) {
		t.Fatalf("ticket after the PUT stopped: %v, want ErrQuota: its ticket holds the place for the retry", err)
	}
	e.assertNothingLeft()
}
