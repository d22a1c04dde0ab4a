package gateway

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestRunningPutHoldsQuota: a plain upload holds its tenant's quota place
// from the moment it consumes its ticket until it ends, and a refused one
// gives the place back at once. A tenant with a quota of 1 and a PUT in
// flight gets no second ticket; once the PUT is refused (415), it does.
func TestRunningPutHoldsQuota(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 1 })
	ctx := context.Background()
	newTicket := func() error {
		now := e.clock.now()
		return e.st.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: e.tenant.ID,
			Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(imagestore.NewSecret()), 1)
	}
	up, _ := e.ticket()
	junk := bytes.Repeat([]byte("not a qcow2 image "), 1<<12)
	rc := openRaw(t, e.base, "PUT "+strings.TrimPrefix(up, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(junk)))
	// The head is in; the handler consumes the ticket before the body.
	waitFor(t, "the PUT to consume its ticket", func() bool {
		tk, err := e.st.Ticket(ctx, imagestore.HashSecret(capabilityOf(up)))
		return err == nil && !tk.UsedAt.IsZero()
	})
	if err := newTicket(); !errors.Is(err, imagestore.ErrQuota) {
		t.Fatalf("a second ticket while the only quota place's PUT runs: %v, want ErrQuota", err)
	}
	rc.send(junk, "the body")
	resp, body := rc.answer("the junk PUT")
	if resp.StatusCode != 415 || errorOf(t, bytes.NewReader(body)).Reason != "notQcow2" {
		t.Fatalf("junk PUT: %d %s, want 415 notQcow2", resp.StatusCode, body)
	}
	// The refusal was answered after the store was told: the place is free.
	if err := newTicket(); err != nil {
		t.Fatalf("a ticket after the PUT was refused: %v, want its place back", err)
	}
}
