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

// TestRunningPutHoldsQuota: a plain upload holds its tenant's quota place
// from the moment it consumes its ticket until it ends, and one that ends
// without an image gives the place back at once. A tenant with a quota of
// 1 and a PUT in flight gets no second ticket; once the client has gone,
// it does.
func TestRunningPutHoldsQuota(t *testing.T) {
	needQemu(t)
	head := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 1 })
	ctx := context.Background()
	newTicket := func() error {
		now := e.clock.Now()
		return e.st.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: e.tenant.ID,
			Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(imagestore.NewSecret()), 1)
	}
	up, _ := e.ticket()
	rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(up, e.base), len(head)))
	rc.send(head[:2*preRead], "the first 16 KiB") // more than fasthttp's pre-read: the handler runs
	waitFor(t, "the PUT to consume its ticket", func() bool {
		tk, err := e.st.Ticket(ctx, imagestore.HashSecret(capabilityOf(up)))
		return err == nil && !tk.UsedAt.IsZero()
	})
	if err := newTicket(); !errors.Is(err, imagestore.ErrQuota) {
		t.Fatalf("a second ticket while the only quota place's PUT runs: %v, want ErrQuota", err)
	}
	rc.c.Close() // the client goes: the upload ends without an image
	e.waitSlotFreed(dirUpload)
	if err := newTicket(); err != nil {
		t.Fatalf("a ticket after the PUT ended: %v, want its place back", err)
	}
}
