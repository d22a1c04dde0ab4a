package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// tenantTests are the suite's tests of removing a tenant and of its
// Stripe account (onboarding.go).
var tenantTests = []struct {
	name string
	fn   func(t *testing.T, s imagestore.Store)
}{
	{"RemoveTenant", testRemoveTenant},
	{"RemoveTenantRefused", testRemoveTenantRefused},
	{"OnboardedAccount", testOnboardedAccount},
	{"AccountCapabilities", testAccountCapabilities},
	{"OperatorAccountClearsOnboarding", testOperatorAccountClearsOnboarding},
}

// testRemoveTenant: a tenant that holds nothing is removed with what it
// left behind (ended tickets, closed listings); its token no longer finds
// it, and its name is free again.
func testRemoveTenant(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	wantErr(t, "RemoveTenant unknown", s.RemoveTenant(ctx, "nobody", t0), imagestore.ErrNotFound)
	a := newHost(t, s, "alpha")
	keep := newTenant(t, s, "bravo")
	// What an active past leaves: a used ticket whose image was removed, a
	// cancelled one, an expired one, a closed listing.
	newTicket(t, s, a.ID, "used", uploadID(1), t0.Add(time.Hour))
	tk, err := s.ConsumeTicket(ctx, hash("used"), t0)
	must(t, "ConsumeTicket", err)
	must(t, "AddImage", s.AddImage(ctx, imagestore.Image{UploadID: tk.UploadID, TenantID: a.ID, Name: "x", Size: 1, VirtualSize: 1,
		SHA256: "00", CreatedAt: t0}, 0))
	must(t, "RemoveImage", s.RemoveImage(ctx, a.ID, tk.UploadID))
	newTicket(t, s, a.ID, "cancelled", uploadID(2), t0.Add(time.Hour))
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, uploadID(2), t0))
	newTicket(t, s, a.ID, "expired", uploadID(3), t0.Add(time.Minute))
	l := newListing(t, s, a, "l1", 2, t0)
	must(t, "CloseListing", s.CloseListing(ctx, a.ID, l.ID, t0))
	newTicket(t, s, keep.ID, "bravo's", uploadID(4), t0.Add(time.Hour))

	must(t, "RemoveTenant", s.RemoveTenant(ctx, "alpha", t0.Add(time.Minute)))
	_, err = s.Tenant(ctx, "alpha")
	wantErr(t, "Tenant after RemoveTenant", err, imagestore.ErrNotFound)
	_, err = s.TenantByToken(ctx, hash("token-alpha"))
	wantErr(t, "TenantByToken after RemoveTenant", err, imagestore.ErrNotFound)
	_, err = s.TenantByID(ctx, a.ID)
	wantErr(t, "TenantByID after RemoveTenant", err, imagestore.ErrNotFound)
	_, err = s.Ticket(ctx, hash("cancelled"))
	wantErr(t, "its ticket after RemoveTenant", err, imagestore.ErrNotFound)
	_, err = s.Listing(ctx, l.ID)
	wantErr(t, "its closed listing after RemoveTenant", err, imagestore.ErrNotFound)
	wantErr(t, "RemoveTenant again", s.RemoveTenant(ctx, "alpha", t0), imagestore.ErrNotFound)
	// The other tenant and its ticket are untouched; the name is free.
	if ts, err := s.Tenants(ctx); err != nil || len(ts) != 1 || ts[0].Name != "bravo" {
		t.Errorf("Tenants after RemoveTenant = %+v, %v; want bravo alone", ts, err)
	}
	if got := mustTicket(t, s, "bravo's"); !got.UsedAt.IsZero() {
		t.Errorf("bravo's ticket after alpha's removal: %+v", got)
	}
	newTenant(t, s, "alpha")
}

// testRemoveTenantRefused: each thing a tenant holds refuses its removal,
// counted, and the tenant stays as it was; once it is gone, so is the
// refusal.
func testRemoveTenantRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	host := newHost(t, s, "host")
	buyer := newHost(t, s, "buyer")
	a := newTenant(t, s, "alpha")
	refused := func(name string, want imagestore.TenantInUse) {
		t.Helper()
		err := s.RemoveTenant(ctx, name, t0)
		var got *imagestore.TenantInUse
		if !errors.As(err, &got) || !errors.Is(err, imagestore.ErrInUse) || *got != want {
			t.Fatalf("RemoveTenant %s = %v, want %+v", name, err, want)
		}
		if _, err := s.TenantByToken(ctx, hash("token-"+name)); err != nil {
			t.Fatalf("%s after a refused RemoveTenant: %v", name, err)
		}
	}
	newImage(t, s, a.ID, uploadID(1), t0, 10)
	newTicket(t, s, a.ID, "unused", uploadID(2), t0.Add(time.Hour))
	newTicket(t, s, a.ID, "running", uploadID(3), t0.Add(time.Hour))
	_, err := s.ConsumeTicket(ctx, hash("running"), t0)
	must(t, "ConsumeTicket", err)
	newSession(t, s, a.ID, "session", uploadID(4), t0.Add(time.Hour))
	refused("alpha", imagestore.TenantInUse{Images: 1, Tickets: 1, Uploads: 1, Sessions: 1})

	must(t, "RemoveImage", s.RemoveImage(ctx, a.ID, uploadID(1)))
	refused("alpha", imagestore.TenantInUse{Tickets: 1, Uploads: 1, Sessions: 1})
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, uploadID(2), t0))
	must(t, "EndUpload", s.EndUpload(ctx, uploadID(3)))
	refused("alpha", imagestore.TenantInUse{Sessions: 1})
	must(t, "EndSession", s.EndSession(ctx, uploadID(4)))
	must(t, "RemoveTenant alpha", s.RemoveTenant(ctx, "alpha", t0))

	// An open listing, and orders in any state, as host and as buyer.
	l := newListing(t, s, host, "l1", 5, t0)
	refused("host", imagestore.TenantInUse{Listings: 1})
	o := placeOrder(t, s, orderOf(l, host, buyer, "o1", 1, t0), "")
	must(t, "CancelOrder", s.CancelOrder(ctx, o.ID, "checkoutExpired", t0))
	must(t, "CloseListing", s.CloseListing(ctx, host.ID, l.ID, t0))
	refused("host", imagestore.TenantInUse{Orders: 1})
	refused("buyer", imagestore.TenantInUse{Orders: 1})
}
