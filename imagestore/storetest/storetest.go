// Package storetest is the one behavioural test suite every
// imagestore.Store implementation passes, in the manner of distribution's
// storage driver suite: an implementation's own test calls Run with a
// function that opens an empty store, and gets the whole contract checked.
//
// The suite never sleeps: every time-dependent method is driven by explicit
// `now` values around a fixed instant, so boundaries are exact. It only
// passes quotas > 0 where it expects a limit; quota <= 0 means no limit.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Run runs the suite. open is called once per subtest and must return an
// empty store of its own; Run closes it when the subtest ends.
func Run(t *testing.T, open func(t *testing.T) imagestore.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s imagestore.Store)
	}{
		{"Ping", testPing},
		{"Verify", testVerify},
		{"CreateTenant", testCreateTenant},
		{"TenantErrors", testTenantErrors},
		{"Tenants", testTenants},
		{"UpdateTenant", testUpdateTenant},
		{"SetTenantToken", testSetTenantToken},
		{"CreateTicket", testCreateTicket},
		{"ConsumeTicket", testConsumeTicket},
		{"ConsumeTicketConcurrent", testConsumeTicketConcurrent},
		{"Quota", testQuota},
		{"QuotaReservations", testQuotaReservations},
		{"QuotaRunningUploads", testQuotaRunningUploads},
		{"EndRunningUploads", testEndRunningUploads},
		{"OpenSessions", testOpenSessions},
		{"Images", testImages},
		{"RemoveImage", testRemoveImage},
		{"FetchTokens", testFetchTokens},
		{"SweepTickets", testSweepTickets},
		{"SweepTicketsBatches", testSweepTicketsBatches},
		{"TimeRoundTrip", testTimeRoundTrip},
		{"Stats", testStats},
		{"StartSession", testStartSession},
		{"StartSessionRefused", testStartSessionRefused},
		{"StartSessionConcurrent", testStartSessionConcurrent},
		{"SaveProgress", testSaveProgress},
		{"EndSession", testEndSession},
		{"ExpireSessions", testExpireSessions},
		{"SessionUploadIDs", testSessionUploadIDs},
		{"CreateListing", testCreateListing},
		{"Listings", testListings},
		{"CloseListing", testCloseListing},
		{"CreateOrder", testCreateOrder},
		{"CreateOrderRefused", testCreateOrderRefused},
		{"CreateOrderConcurrent", testCreateOrderConcurrent},
		{"CreateOrderUnpaidLimit", testCreateOrderUnpaidLimit},
		{"ListingCounts", testListingCounts},
		{"OrderStates", testOrderStates},
		{"PayOrderOnce", testPayOrderOnce},
		{"CancelOwnOrder", testCancelOwnOrder},
		{"CancelRacesPayment", testCancelRacesPayment},
		{"PaymentIntent", testPaymentIntent},
		{"OrderBlocked", testOrderBlocked},
		{"RefundStates", testRefundStates},
		{"RefundExcludesActive", testRefundExcludesActive},
		{"RefundOfActiveOrder", testRefundOfActiveOrder},
		{"ClaimRefundConcurrent", testClaimRefundConcurrent},
		{"OrderDisputed", testOrderDisputed},
		{"DisputeHoldsRefund", testDisputeHoldsRefund},
		{"DisputeRacesRefund", testDisputeRacesRefund},
		{"DisputeClosed", testDisputeClosed},
		{"ConsoleTickets", testConsoleTickets},
		{"PowerRequests", testPowerRequests},
		{"OrderTimeRoundTrip", testOrderTimeRoundTrip},
		{"OrderQueries", testOrderQueries},
		{"OverdueOrders", testOverdueOrders},
		{"OrderCounts", testOrderCounts},
		{"OrderUserData", testOrderUserData},
		{"RemoveImageInUse", testRemoveImageInUse},
		{"WebhookEvents", testWebhookEvents},
		{"OrderNote", testOrderNote},
		{"ReplicaStates", testReplicaStates},
		{"ReplicaStatesRefused", testReplicaStatesRefused},
		{"RevokeOrderTokens", testRevokeOrderTokens},
		{"LeaseRules", testLeaseRules},
		{"LeaseRefused", testLeaseRefused},
		{"LeaseNames", testLeaseNames},
		{"LeaseConcurrent", testLeaseConcurrent},
		{"ForgetLeases", testForgetLeases},
		{"EndUnleasedUploads", testEndUnleasedUploads},
		{"StoreID", testStoreID},
		{"Intents", testIntents},
		{"IntentsOfImages", testIntentsOfImages},
	}
	tests = append(tests, ticketTests...)
	tests = append(tests, tenantTests...)
	tests = append(tests, undoTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// t0 is the suite's fixed "now": nanoseconds set so that any rounding in
// storage shows, far enough from the real clock that a store consulting it
// instead of the given now is caught.
var t0 = time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC)

func hash(secret string) imagestore.Hash { return imagestore.HashSecret(secret) }

// uploadID returns a valid, distinct upload id for n.
func uploadID(n int) string { return fmt.Sprintf("%024x", n) }

// payOrder pays an order and keeps only the error: where a test cares
// whether the call moved the order it asks PayOrder itself.
func payOrder(ctx context.Context, s imagestore.Store, id string, paidAt, expiresAt time.Time) error {
	_, err := s.PayOrder(ctx, id, paidAt, expiresAt)
	return err
}

func must(t *testing.T, op string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
}

func wantErr(t *testing.T, op string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", op, err, want)
	}
}

func newTenant(t *testing.T, s imagestore.Store, name string) imagestore.Tenant {
	t.Helper()
	tn, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: name, Appliance: "vmshelf-1"}, hash("token-"+name))
	must(t, "CreateTenant "+name, err)
	return tn
}

func newImage(t *testing.T, s imagestore.Store, tenantID int64, id string, created time.Time, size int64) imagestore.Image {
	t.Helper()
	img := imagestore.Image{
		UploadID:    id,
		TenantID:    tenantID,
		Name:        "image " + id,
		EFI:         true,
		Size:        size,
		VirtualSize: size * 4,
		SHA256:      fmt.Sprintf("%064x", size),
		CreatedAt:   created,
	}
	must(t, "AddImage "+id, s.AddImage(t.Context(), img, 0))
	return img
}

func newTicket(t *testing.T, s imagestore.Store, tenantID int64, secret, id string, expires time.Time) imagestore.Ticket {
	t.Helper()
	tk := imagestore.Ticket{
		UploadID:  id,
		TenantID:  tenantID,
		Name:      "ticket " + secret,
		EFI:       false,
		CreatedAt: t0,
		ExpiresAt: expires,
	}
	must(t, "CreateTicket "+secret, s.CreateTicket(t.Context(), tk, hash(secret), 0))
	return tk
}

// timeDiff reports how got differs from want: another instant, or a
// location other than UTC (stores return UTC).
func timeDiff(field string, got, want time.Time) string {
	switch {
	case !got.Equal(want):
		return fmt.Sprintf("%s = %v, want %v", field, got, want)
	case got.Location() != time.UTC:
		return fmt.Sprintf("%s location = %v, want UTC", field, got.Location())
	}
	return ""
}

func checkTenant(t *testing.T, op string, got, want imagestore.Tenant) {
	t.Helper()
	if d := timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt); d != "" {
		t.Errorf("%s: %s", op, d)
	}
	got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
	if got != want {
		t.Errorf("%s: got %+v, want %+v", op, got, want)
	}
}

func checkTicket(t *testing.T, op string, got, want imagestore.Ticket) {
	t.Helper()
	for _, d := range []string{
		timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt),
		timeDiff("ExpiresAt", got.ExpiresAt, want.ExpiresAt),
		timeDiff("UsedAt", got.UsedAt, want.UsedAt),
	} {
		if d != "" {
			t.Errorf("%s: %s", op, d)
		}
	}
	got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
	got.ExpiresAt, want.ExpiresAt = time.Time{}, time.Time{}
	got.UsedAt, want.UsedAt = time.Time{}, time.Time{}
	if got != want {
		t.Errorf("%s: got %+v, want %+v", op, got, want)
	}
}

func checkImage(t *testing.T, op string, got, want imagestore.Image) {
	t.Helper()
	if d := timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt); d != "" {
		t.Errorf("%s: %s", op, d)
	}
	got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
	if got != want {
		t.Errorf("%s: got %+v, want %+v", op, got, want)
	}
}

func testPing(t *testing.T, s imagestore.Store) {
	must(t, "Ping", s.Ping(t.Context()))
}

// testVerify: a sound store passes its integrity check, empty and filled.
func testVerify(t *testing.T, s imagestore.Store) {
	must(t, "Verify empty", s.Verify(t.Context()))
	tn := newTenant(t, s, "verify")
	for i := range 50 {
		newImage(t, s, tn.ID, uploadID(i), t0, int64(i))
	}
	must(t, "Verify filled", s.Verify(t.Context()))
}

func testCreateTenant(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	in := imagestore.Tenant{
		Name:          "alpha",
		InMesh:        true,
		Sharing:       true,
		HostsVMs:      true,
		Appliance:     "vmshelf-2",
		StripeAccount: "acct_1",
	}
	a, err := s.CreateTenant(ctx, in, hash("token-alpha"))
	must(t, "CreateTenant", err)
	if a.ID == 0 {
		t.Error("CreateTenant: ID not set")
	}
	if a.CreatedAt.IsZero() {
		t.Error("CreateTenant: CreatedAt not set")
	}
	want := in
	want.ID, want.CreatedAt = a.ID, a.CreatedAt
	checkTenant(t, "CreateTenant", a, want)

	got, err := s.Tenant(ctx, "alpha")
	must(t, "Tenant", err)
	checkTenant(t, "Tenant", got, a)

	got, err = s.TenantByToken(ctx, hash("token-alpha"))
	must(t, "TenantByToken", err)
	checkTenant(t, "TenantByToken", got, a)
	got, err = s.TenantByID(ctx, a.ID)
	must(t, "TenantByID", err)
	checkTenant(t, "TenantByID", got, a)

	// Booleans must round-trip as false too, not only as true.
	b := newTenant(t, s, "beta")
	if b.ID == a.ID {
		t.Errorf("two tenants share ID %d", a.ID)
	}
	got, err = s.Tenant(ctx, "beta")
	must(t, "Tenant beta", err)
	checkTenant(t, "Tenant beta", got, b)
}

func testTenantErrors(t *testing.T, s imagestore.Store) {
	newTenant(t, s, "alpha")
	tests := []struct {
		name string
		call func(t *testing.T) error
		want error
	}{
		{"CreateTenant duplicate name", func(t *testing.T) error {
			_, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "alpha"}, hash("other"))
			return err
		}, imagestore.ErrExists},
		{"CreateTenant duplicate token", func(t *testing.T) error {
			_, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "beta"}, hash("token-alpha"))
			return err
		}, imagestore.ErrExists},
		{"Tenant unknown", func(t *testing.T) error {
			_, err := s.Tenant(t.Context(), "nobody")
			return err
		}, imagestore.ErrNotFound},
		{"TenantByToken unknown", func(t *testing.T) error {
			_, err := s.TenantByToken(t.Context(), hash("nobody"))
			return err
		}, imagestore.ErrNotFound},
		{"TenantByID unknown", func(t *testing.T) error {
			_, err := s.TenantByID(t.Context(), 1<<40)
			return err
		}, imagestore.ErrNotFound},
		{"UpdateTenant unknown", func(t *testing.T) error {
			return s.UpdateTenant(t.Context(), imagestore.Tenant{Name: "nobody"})
		}, imagestore.ErrNotFound},
		{"SetTenantToken unknown", func(t *testing.T) error {
			return s.SetTenantToken(t.Context(), "nobody", hash("new"))
		}, imagestore.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.name, tc.call(t), tc.want)
		})
	}
	// The failed calls changed nothing.
	ts, err := s.Tenants(t.Context())
	must(t, "Tenants", err)
	if len(ts) != 1 || ts[0].Name != "alpha" {
		t.Errorf("Tenants = %+v, want only alpha", ts)
	}
}

func testTenants(t *testing.T, s imagestore.Store) {
	ts, err := s.Tenants(t.Context())
	must(t, "Tenants empty", err)
	if len(ts) != 0 {
		t.Fatalf("Tenants on an empty store = %+v", ts)
	}
	byName := map[string]imagestore.Tenant{}
	for _, n := range []string{"charlie", "alpha", "bravo"} {
		byName[n] = newTenant(t, s, n)
	}
	ts, err = s.Tenants(t.Context())
	must(t, "Tenants", err)
	var names []string
	for _, tn := range ts {
		names = append(names, tn.Name)
		checkTenant(t, "Tenants "+tn.Name, tn, byName[tn.Name])
	}
	if want := []string{"alpha", "bravo", "charlie"}; !slices.Equal(names, want) {
		t.Errorf("Tenants order = %v, want %v", names, want)
	}
}

func testUpdateTenant(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	upd := imagestore.Tenant{
		Name:          "alpha",
		InMesh:        true,
		Sharing:       true,
		HostsVMs:      true,
		Appliance:     "vmshelf-9",
		StripeAccount: "acct_9",
	}
	must(t, "UpdateTenant", s.UpdateTenant(ctx, upd))
	got, err := s.Tenant(ctx, "alpha")
	must(t, "Tenant", err)
	// Identity, creation time and token are not attributes.
	want := upd
	want.ID, want.CreatedAt = a.ID, a.CreatedAt
	checkTenant(t, "after UpdateTenant", got, want)
	got, err = s.TenantByToken(ctx, hash("token-alpha"))
	must(t, "TenantByToken after UpdateTenant", err)
	checkTenant(t, "TenantByToken after UpdateTenant", got, want)

	// Back to false, and the other tenant untouched.
	upd.InMesh, upd.Sharing, upd.HostsVMs = false, false, false
	must(t, "UpdateTenant false", s.UpdateTenant(ctx, upd))
	got, err = s.Tenant(ctx, "alpha")
	must(t, "Tenant", err)
	want = upd
	want.ID, want.CreatedAt = a.ID, a.CreatedAt
	checkTenant(t, "after UpdateTenant false", got, want)
	got, err = s.Tenant(ctx, "bravo")
	must(t, "Tenant bravo", err)
	checkTenant(t, "bravo after UpdateTenant alpha", got, b)
}

func testSetTenantToken(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	newTenant(t, s, "bravo")
	must(t, "SetTenantToken", s.SetTenantToken(ctx, "alpha", hash("rotated")))

	_, err := s.TenantByToken(ctx, hash("token-alpha"))
	wantErr(t, "TenantByToken old token", err, imagestore.ErrNotFound)
	got, err := s.TenantByToken(ctx, hash("rotated"))
	must(t, "TenantByToken new token", err)
	checkTenant(t, "TenantByToken new token", got, a)

	err = s.SetTenantToken(ctx, "alpha", hash("token-bravo"))
	wantErr(t, "SetTenantToken to another tenant's token", err, imagestore.ErrExists)
	got, err = s.TenantByToken(ctx, hash("token-bravo"))
	must(t, "TenantByToken bravo", err)
	if got.Name != "bravo" {
		t.Errorf("bravo's token now names %q", got.Name)
	}
}

func testCreateTicket(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	tk := newTicket(t, s, a.ID, "t1", uploadID(1), t0.Add(time.Hour))
	got, err := s.Ticket(ctx, hash("t1"))
	must(t, "Ticket", err)
	checkTicket(t, "Ticket", got, tk)

	efi := imagestore.Ticket{UploadID: uploadID(2), TenantID: a.ID, Name: "efi", EFI: true, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
	must(t, "CreateTicket efi", s.CreateTicket(ctx, efi, hash("t2"), 0))
	got, err = s.Ticket(ctx, hash("t2"))
	must(t, "Ticket efi", err)
	checkTicket(t, "Ticket efi", got, efi)

	tests := []struct {
		name   string
		tk     imagestore.Ticket
		secret string
		want   error
	}{
		{"duplicate hash", imagestore.Ticket{UploadID: uploadID(3), TenantID: a.ID, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "t1", imagestore.ErrExists},
		{"duplicate upload id", imagestore.Ticket{UploadID: uploadID(1), TenantID: a.ID, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "t3", imagestore.ErrExists},
		{"unknown tenant", imagestore.Ticket{UploadID: uploadID(4), TenantID: a.ID + 1000, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "t4", imagestore.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, "CreateTicket", s.CreateTicket(t.Context(), tc.tk, hash(tc.secret), 0), tc.want)
		})
	}
	// The refused tickets left nothing behind, and the original is intact.
	for _, secret := range []string{"t3", "t4"} {
		_, err := s.Ticket(ctx, hash(secret))
		wantErr(t, "Ticket "+secret, err, imagestore.ErrNotFound)
	}
	got, err = s.Ticket(ctx, hash("t1"))
	must(t, "Ticket t1", err)
	checkTicket(t, "Ticket t1 after refused duplicates", got, tk)

	_, err = s.Ticket(ctx, hash("unknown"))
	wantErr(t, "Ticket unknown", err, imagestore.ErrNotFound)
}

func testConsumeTicket(t *testing.T, s imagestore.Store) {
	a := newTenant(t, s, "alpha")
	exp := t0.Add(time.Hour)
	tests := []struct {
		name string
		now  time.Time
		want error // nil: consumed
	}{
		{"well before expiry", t0, nil},
		{"one nanosecond before expiry", exp.Add(-time.Nanosecond), nil},
		{"at expiry", exp, imagestore.ErrTicketExpired},
		{"after expiry", exp.Add(time.Hour), imagestore.ErrTicketExpired},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			secret := fmt.Sprintf("ticket-%d", i)
			tk := newTicket(t, s, a.ID, secret, uploadID(i), exp)

			got, err := s.ConsumeTicket(ctx, hash(secret), tc.now)
			if tc.want != nil {
				wantErr(t, "ConsumeTicket", err, tc.want)
				// A refused ticket stays unused and keeps being refused.
				stored, err := s.Ticket(ctx, hash(secret))
				must(t, "Ticket", err)
				checkTicket(t, "Ticket after refusal", stored, tk)
				_, err = s.ConsumeTicket(ctx, hash(secret), tc.now)
				wantErr(t, "ConsumeTicket again", err, tc.want)
				return
			}
			must(t, "ConsumeTicket", err)
			want := tk
			want.UsedAt = tc.now
			checkTicket(t, "ConsumeTicket", got, want)
			stored, err := s.Ticket(ctx, hash(secret))
			must(t, "Ticket", err)
			checkTicket(t, "Ticket after ConsumeTicket", stored, want)

			_, err = s.ConsumeTicket(ctx, hash(secret), tc.now)
			wantErr(t, "ConsumeTicket again", err, imagestore.ErrTicketUsed)
			// Used wins over expired: the ticket did its job.
			_, err = s.ConsumeTicket(ctx, hash(secret), exp.Add(time.Hour))
			wantErr(t, "ConsumeTicket used, after expiry", err, imagestore.ErrTicketUsed)
			stored, err = s.Ticket(ctx, hash(secret))
			must(t, "Ticket", err)
			checkTicket(t, "Ticket after refused reuse", stored, want)
		})
	}
	t.Run("unknown", func(t *testing.T) {
		_, err := s.ConsumeTicket(t.Context(), hash("unknown"), t0)
		wantErr(t, "ConsumeTicket unknown", err, imagestore.ErrNotFound)
	})
}

func testConsumeTicketConcurrent(t *testing.T, s imagestore.Store) {
	const n = 8
	a := newTenant(t, s, "alpha")
	newTicket(t, s, a.ID, "race", uploadID(1), t0.Add(time.Hour))

	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			// Distinct nows, so the winner's UsedAt identifies it.
			_, errs[i] = s.ConsumeTicket(t.Context(), hash("race"), t0.Add(time.Duration(i)*time.Second))
		})
	}
	close(start)
	wg.Wait()

	winner, used := -1, 0
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("callers %d and %d both consumed the ticket", winner, i)
			}
			winner = i
		case errors.Is(err, imagestore.ErrTicketUsed):
			used++
		default:
			t.Errorf("caller %d: %v, want nil or ErrTicketUsed", i, err)
		}
	}
	if winner < 0 || used != n-1 {
		t.Fatalf("%d winners and %d ErrTicketUsed, want 1 and %d", n-used, used, n-1)
	}
	tk, err := s.Ticket(t.Context(), hash("race"))
	must(t, "Ticket", err)
	if want := t0.Add(time.Duration(winner) * time.Second); !tk.UsedAt.Equal(want) {
		t.Errorf("UsedAt = %v, want the winner's %v", tk.UsedAt, want)
	}
}

func testQuota(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	ticket := func(tenant imagestore.Tenant, secret string, id int) imagestore.Ticket {
		return imagestore.Ticket{UploadID: uploadID(id), TenantID: tenant.ID, Name: secret, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	}
	image := func(tenant imagestore.Tenant, id int) imagestore.Image {
		return imagestore.Image{UploadID: uploadID(id), TenantID: tenant.ID, Name: "img", Size: 1, VirtualSize: 1, SHA256: "00", CreatedAt: t0}
	}
	// use consumes a ticket as an upload does before its image is added.
	use := func(secret string) error {
		_, err := s.ConsumeTicket(ctx, hash(secret), t0)
		return err
	}
	steps := []struct {
		name string
		call func() error
		want error
	}{
		{"ticket 1 of 2", func() error { return s.CreateTicket(ctx, ticket(a, "q1", 101), hash("q1"), 2) }, nil},
		{"ticket 2 of 2", func() error { return s.CreateTicket(ctx, ticket(a, "q2", 102), hash("q2"), 2) }, nil},
		// Unused tickets count: two of them fill a quota of two.
		{"ticket over unused tickets", func() error { return s.CreateTicket(ctx, ticket(a, "q3", 103), hash("q3"), 2) }, imagestore.ErrQuota},
		{"use q1", func() error { return use("q1") }, nil},
		// The used ticket's upload commits; the other unused ticket does
		// not refuse it (it was admitted under the quota too).
		{"image 1 of 2 beside an unused ticket", func() error { return s.AddImage(ctx, image(a, 101), 2) }, nil},
		{"ticket with an image and a ticket", func() error { return s.CreateTicket(ctx, ticket(a, "q4", 104), hash("q4"), 2) }, imagestore.ErrQuota},
		{"ticket over smaller quota", func() error { return s.CreateTicket(ctx, ticket(a, "q5", 105), hash("q5"), 1) }, imagestore.ErrQuota},
		{"ticket under larger quota", func() error { return s.CreateTicket(ctx, ticket(a, "q6", 106), hash("q6"), 3) }, nil},
		{"ticket with quota 0 (no limit)", func() error { return s.CreateTicket(ctx, ticket(a, "q7", 107), hash("q7"), 0) }, nil},
		{"ticket with negative quota (no limit)", func() error { return s.CreateTicket(ctx, ticket(a, "q8", 108), hash("q8"), -1) }, nil},
		// The ticket was issued under the quota, but the tenant filled it
		// meanwhile: AddImage re-checks the stored images.
		{"image 2 of 2", func() error { return s.AddImage(ctx, image(a, 2), 2) }, nil},
		{"image at quota", func() error { return s.AddImage(ctx, image(a, 3), 2) }, imagestore.ErrQuota},
		{"image with quota 0 (no limit)", func() error { return s.AddImage(ctx, image(a, 4), 0) }, nil},
		// Quotas are per tenant: alpha's images and tickets do not count
		// for bravo.
		{"other tenant ticket", func() error { return s.CreateTicket(ctx, ticket(b, "q9", 109), hash("q9"), 1) }, nil},
		{"other tenant ticket at quota", func() error { return s.CreateTicket(ctx, ticket(b, "q10", 110), hash("q10"), 1) }, imagestore.ErrQuota},
		{"other tenant image", func() error { return s.AddImage(ctx, image(b, 5), 1) }, nil},
		// Removing an image frees its slot: alpha holds 3 images and 4
		// unused tickets (q2, q6, q7, q8).
		{"ticket at 7", func() error { return s.CreateTicket(ctx, ticket(a, "q11", 111), hash("q11"), 7) }, imagestore.ErrQuota},
		{"remove", func() error { return s.RemoveImage(ctx, a.ID, uploadID(101)) }, nil},
		{"ticket after remove", func() error { return s.CreateTicket(ctx, ticket(a, "q12", 112), hash("q12"), 7) }, nil},
		{"ticket at quota after remove", func() error { return s.CreateTicket(ctx, ticket(a, "q13", 113), hash("q13"), 7) }, imagestore.ErrQuota},
	}
	for _, st := range steps {
		err := st.call()
		if st.want == nil {
			must(t, st.name, err)
		} else {
			wantErr(t, st.name, err, st.want)
		}
	}
	// Refusals stored nothing.
	for _, secret := range []string{"q3", "q4", "q5", "q10", "q11", "q13"} {
		_, err := s.Ticket(ctx, hash(secret))
		wantErr(t, "Ticket "+secret+" refused for quota", err, imagestore.ErrNotFound)
	}
	_, err := s.Image(ctx, uploadID(3))
	wantErr(t, "Image refused for quota", err, imagestore.ErrNotFound)
	st, err := s.Stats(ctx)
	must(t, "Stats", err)
	if st.Images != 3 {
		t.Errorf("Stats.Images = %d, want 3", st.Images)
	}
}

// testQuotaReservations checks what CreateTicket counts besides images:
// unused tickets until they expire, upload sessions until they finish,
// end or expire, and each upload once.
func testQuotaReservations(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	n := 0
	ticketAt := func(tenant imagestore.Tenant, now time.Time, quota int) error {
		n++
		secret := fmt.Sprintf("r%d", n)
		return s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(200 + n), TenantID: tenant.ID, Name: secret,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, hash(secret), quota)
	}
	step := func(name string, err, want error) {
		t.Helper()
		if want == nil {
			must(t, name, err)
		} else {
			wantErr(t, name, err, want)
		}
	}
	// Three open sessions (their tickets used) and no image: the quota of
	// three is full.
	s1 := newSession(t, s, a.ID, "s1", uploadID(1), t0.Add(2*time.Hour))
	newSession(t, s, a.ID, "s2", uploadID(2), t0.Add(2*time.Hour))
	newSession(t, s, a.ID, "s3", uploadID(3), t0.Add(2*time.Hour))
	step("ticket over 3 open sessions", ticketAt(a, t0, 3), imagestore.ErrQuota)
	step("other tenant's ticket", ticketAt(b, t0, 1), nil)

	// s1 commits its image (its own session does not refuse it) and is
	// marked finished: the upload is one image now, not two.
	img := imagestore.Image{UploadID: s1.UploadID, TenantID: a.ID, Name: s1.Name, Size: s1.Length, VirtualSize: 1, SHA256: "00", CreatedAt: t0}
	step("image of a session with 3 open", s.AddImage(ctx, img, 3), nil)
	step("s1 finished", s.SaveProgress(ctx, s1.UploadID, s1.Length, hashState(t, "x"), t0.Add(2*time.Hour)), nil)
	step("ticket 4 of 4 (image, 2 sessions)", ticketAt(a, t0, 4), nil)
	step("ticket 5 of 4", ticketAt(a, t0, 4), imagestore.ErrQuota)

	// The unused ticket expires at t0+1h: from then on it is not counted.
	step("ticket while the unused one lives", ticketAt(a, t0.Add(time.Hour-time.Nanosecond), 4), imagestore.ErrQuota)
	step("ticket when the unused one expired", ticketAt(a, t0.Add(time.Hour), 4), nil)
	// An ended session is not counted.
	step("ticket before an end", ticketAt(a, t0.Add(time.Hour), 4), imagestore.ErrQuota)
	step("end s2", s.EndSession(ctx, uploadID(2)), nil)
	step("ticket after an end", ticketAt(a, t0.Add(time.Hour), 4), nil)
	// At t0+2h the sessions and the tickets of t0+1h have expired: only
	// the image is left.
	step("ticket 2 of 2 after expiry", ticketAt(a, t0.Add(2*time.Hour), 2), nil)
	step("ticket 3 of 2 after expiry", ticketAt(a, t0.Add(2*time.Hour), 2), imagestore.ErrQuota)
	// Bravo's one ticket still fills bravo's quota of one.
	step("other tenant's ticket at quota", ticketAt(b, t0, 1), imagestore.ErrQuota)
}

// testQuotaRunningUploads: a plain upload holds its quota place from
// ConsumeTicket until AddImage records it or EndUpload ends it, whatever
// its ticket's expiry; a resumable upload is counted by its session alone.
func testQuotaRunningUploads(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	n := 0
	// ticketAt asks for a fresh ticket of tenant at now under quota.
	ticketAt := func(tenant imagestore.Tenant, now time.Time, quota int) (string, error) {
		n++
		secret := fmt.Sprintf("p%d", n)
		return secret, s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(300 + n), TenantID: tenant.ID, Name: secret,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, hash(secret), quota)
	}
	// start issues a ticket without a limit and consumes it: a PUT whose
	// body is on its way.
	start := func(tenant imagestore.Tenant) (imagestore.Ticket, string) {
		t.Helper()
		secret, err := ticketAt(tenant, t0, 0)
		must(t, "CreateTicket "+secret, err)
		tk, err := s.ConsumeTicket(ctx, hash(secret), t0)
		must(t, "ConsumeTicket "+secret, err)
		return tk, secret
	}
	step := func(name string, err, want error) {
		t.Helper()
		if want == nil {
			must(t, name, err)
		} else {
			wantErr(t, name, err, want)
		}
	}
	imageOf := func(tk imagestore.Ticket) imagestore.Image {
		return imagestore.Image{UploadID: tk.UploadID, TenantID: tk.TenantID, Name: tk.Name, Size: 1, VirtualSize: 1, SHA256: "00", CreatedAt: t0}
	}
	ticket := func(tenant imagestore.Tenant, now time.Time, quota int) error {
		_, err := ticketAt(tenant, now, quota)
		return err
	}

	t.Run("running PUT counted until EndUpload", func(t *testing.T) {
		a := newTenant(t, s, "alpha")
		put, secret := start(a)
		// Nothing but the running upload: no image, no unused ticket.
		step("ticket beside a running PUT at quota 1", ticket(a, t0, 1), imagestore.ErrQuota)
		// Its ticket expired at t0+1h, but the body is still arriving.
		step("ticket after the running PUT's ticket expired", ticket(a, t0.Add(2*time.Hour), 1), imagestore.ErrQuota)
		step("EndUpload", s.EndUpload(ctx, put.UploadID), nil)
		step("ticket after EndUpload", ticket(a, t0.Add(2*time.Hour), 1), nil)
		step("EndUpload twice", s.EndUpload(ctx, put.UploadID), nil)
		step("EndUpload of an unknown id", s.EndUpload(ctx, uploadID(999)), nil)
		// The ended upload's ticket stays used.
		_, err := s.ConsumeTicket(ctx, hash(secret), t0)
		wantErr(t, "ConsumeTicket after EndUpload", err, imagestore.ErrTicketUsed)
	})

	t.Run("AddImage moves the place to the image", func(t *testing.T) {
		b := newTenant(t, s, "bravo")
		put, _ := start(b)
		step("AddImage of the running PUT", s.AddImage(ctx, imageOf(put), 2), nil)
		// One image, nothing running: the upload is not counted twice.
		step("ticket 2 of 2 right after the commit", ticket(b, t0, 2), nil)
		step("ticket 3 of 2", ticket(b, t0, 2), imagestore.ErrQuota)
		// Ending an upload that became an image changes nothing.
		step("EndUpload after AddImage", s.EndUpload(ctx, put.UploadID), nil)
		if _, err := s.Image(ctx, put.UploadID); err != nil {
			t.Errorf("Image after EndUpload: %v", err)
		}
		step("ticket 3 of 2 after EndUpload", ticket(b, t0, 2), imagestore.ErrQuota)
	})

	t.Run("refused AddImage keeps the place for EndUpload", func(t *testing.T) {
		c := newTenant(t, s, "charlie")
		newImage(t, s, c.ID, uploadID(350), t0, 1)
		put, _ := start(c)
		step("AddImage over quota", s.AddImage(ctx, imageOf(put), 1), imagestore.ErrQuota)
		step("ticket beside an image and a refused PUT", ticket(c, t0, 2), imagestore.ErrQuota)
		step("EndUpload", s.EndUpload(ctx, put.UploadID), nil)
		step("ticket after EndUpload", ticket(c, t0, 2), nil)
	})

	t.Run("a session's ticket is counted as the session only", func(t *testing.T) {
		d := newTenant(t, s, "delta")
		us := newSession(t, s, d.ID, "sd", uploadID(360), t0.Add(2*time.Hour))
		step("ticket 2 of 2 beside one session", ticket(d, t0, 2), nil)
		step("ticket 3 of 2", ticket(d, t0, 2), imagestore.ErrQuota)
		must(t, "EndSession", s.EndSession(ctx, us.UploadID))
		// The ended session's ticket holds nothing; the unused one does.
		step("ticket 2 of 2 after EndSession", ticket(d, t0, 2), nil)
		n, err := s.EndRunningUploads(ctx)
		must(t, "EndRunningUploads", err)
		if n != 0 {
			t.Errorf("EndRunningUploads with only a session's ticket = %d, want 0", n)
		}
	})
}

// testEndRunningUploads: start-up ends every plain upload still marked
// running, of every tenant, and nothing else.
func testEndRunningUploads(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	n, err := s.EndRunningUploads(ctx)
	must(t, "EndRunningUploads on an empty store", err)
	if n != 0 {
		t.Errorf("EndRunningUploads on an empty store = %d, want 0", n)
	}
	for i, tn := range []imagestore.Tenant{a, a, b} {
		secret := fmt.Sprintf("run-%d", i)
		newTicket(t, s, tn.ID, secret, uploadID(i+1), t0.Add(time.Hour))
		_, err := s.ConsumeTicket(ctx, hash(secret), t0)
		must(t, "ConsumeTicket "+secret, err)
	}
	// Not running: one ended, one committed, one a session, one unused.
	newTicket(t, s, a.ID, "ended", uploadID(10), t0.Add(time.Hour))
	_, err = s.ConsumeTicket(ctx, hash("ended"), t0)
	must(t, "ConsumeTicket ended", err)
	must(t, "EndUpload", s.EndUpload(ctx, uploadID(10)))
	newTicket(t, s, a.ID, "done", uploadID(11), t0.Add(time.Hour))
	_, err = s.ConsumeTicket(ctx, hash("done"), t0)
	must(t, "ConsumeTicket done", err)
	must(t, "AddImage", s.AddImage(ctx, imagestore.Image{UploadID: uploadID(11), TenantID: a.ID, Name: "done", Size: 1, SHA256: "00", CreatedAt: t0}, 0))
	newSession(t, s, b.ID, "sess", uploadID(12), t0.Add(time.Hour))
	newTicket(t, s, b.ID, "unused", uploadID(13), t0.Add(time.Hour))

	next := 100
	ticket := func(tn imagestore.Tenant, quota int) error {
		next++
		secret := fmt.Sprintf("q%d", next)
		return s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(next), TenantID: tn.ID, Name: secret,
			CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, hash(secret), quota)
	}
	// alpha: 1 image + 2 running; bravo: 1 running + 1 session + 1 unused.
	wantErr(t, "alpha at 3 before", ticket(a, 3), imagestore.ErrQuota)
	wantErr(t, "bravo at 3 before", ticket(b, 3), imagestore.ErrQuota)

	n, err = s.EndRunningUploads(ctx)
	must(t, "EndRunningUploads", err)
	if n != 3 {
		t.Errorf("EndRunningUploads = %d, want 3", n)
	}
	must(t, "alpha ticket 2 of 2 after", ticket(a, 2))
	must(t, "bravo ticket 3 of 3 after", ticket(b, 3))
	n, err = s.EndRunningUploads(ctx)
	must(t, "EndRunningUploads again", err)
	if n != 0 {
		t.Errorf("EndRunningUploads again = %d, want 0", n)
	}
	// The session and its ticket are untouched.
	if ids := sessionIDs(t, s); !slices.Equal(ids, []string{uploadID(12)}) {
		t.Errorf("SessionUploadIDs after EndRunningUploads = %v, want [%s]", ids, uploadID(12))
	}
}

func testOpenSessions(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	s3 := newSession(t, s, a.ID, "s3", uploadID(3), t0.Add(time.Hour))
	s1 := newSession(t, s, a.ID, "s1", uploadID(1), t0.Add(2*time.Hour))
	done := newSession(t, s, a.ID, "s2", uploadID(2), t0.Add(time.Hour))
	newSession(t, s, b.ID, "s4", uploadID(4), t0.Add(time.Hour))
	state := hashState(t, "0123456789")
	must(t, "SaveProgress", s.SaveProgress(ctx, s3.UploadID, 10, state, t0.Add(time.Hour)))
	s3.Offset, s3.HashState = 10, state
	must(t, "SaveProgress to the end", s.SaveProgress(ctx, done.UploadID, done.Length, state, t0.Add(time.Hour)))

	check := func(now time.Time, want ...imagestore.UploadSession) {
		t.Helper()
		got, err := s.OpenSessions(ctx, a.ID, now)
		must(t, "OpenSessions", err)
		if len(got) != len(want) {
			t.Fatalf("OpenSessions at %v: %d sessions, want %d: %+v", now, len(got), len(want), got)
		}
		for i := range got {
			checkSession(t, fmt.Sprintf("OpenSessions at %v [%d]", now, i), got[i], want[i])
		}
	}
	// Same creation time: by upload id. The finished session and the other
	// tenant's are not listed.
	check(t0, s1, s3)
	check(t0.Add(time.Hour), s1) // s3 expired at its ExpiresAt
	check(t0.Add(2 * time.Hour))
	got, err := s.OpenSessions(ctx, 12345, t0)
	must(t, "OpenSessions of an unknown tenant", err)
	if len(got) != 0 {
		t.Errorf("OpenSessions of an unknown tenant: %+v", got)
	}
}

func testImages(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	c := newTenant(t, s, "charlie")

	// Inserted out of order; two share a creation time.
	a3 := newImage(t, s, a.ID, uploadID(3), t0.Add(2*time.Second), 30)
	a5 := newImage(t, s, a.ID, uploadID(5), t0.Add(time.Second), 50)
	a2 := newImage(t, s, a.ID, uploadID(2), t0.Add(time.Second), 20)
	a1 := newImage(t, s, a.ID, uploadID(1), t0.Add(time.Nanosecond), 10)
	b4 := newImage(t, s, b.ID, uploadID(4), t0, 40)

	got, err := s.Image(ctx, uploadID(2))
	must(t, "Image", err)
	checkImage(t, "Image", got, a2)

	imgs, err := s.Images(ctx, a.ID)
	must(t, "Images", err)
	want := []imagestore.Image{a1, a2, a5, a3}
	if len(imgs) != len(want) {
		t.Fatalf("Images(alpha) = %d images, want %d", len(imgs), len(want))
	}
	for i := range want {
		checkImage(t, fmt.Sprintf("Images(alpha)[%d]", i), imgs[i], want[i])
	}
	imgs, err = s.Images(ctx, b.ID)
	must(t, "Images bravo", err)
	if len(imgs) != 1 {
		t.Fatalf("Images(bravo) = %d images, want 1", len(imgs))
	}
	checkImage(t, "Images(bravo)[0]", imgs[0], b4)
	imgs, err = s.Images(ctx, c.ID)
	must(t, "Images charlie", err)
	if len(imgs) != 0 {
		t.Errorf("Images(charlie) = %+v, want none", imgs)
	}

	ids, err := s.ImageIDs(ctx)
	must(t, "ImageIDs", err)
	slices.Sort(ids)
	if want := []string{uploadID(1), uploadID(2), uploadID(3), uploadID(4), uploadID(5)}; !slices.Equal(ids, want) {
		t.Errorf("ImageIDs = %v, want %v", ids, want)
	}

	t.Run("errors", func(t *testing.T) {
		dup := a2
		dup.TenantID, dup.Size = b.ID, 999
		wantErr(t, "AddImage duplicate", s.AddImage(ctx, dup, 0), imagestore.ErrExists)
		got, err := s.Image(ctx, uploadID(2))
		must(t, "Image after duplicate", err)
		checkImage(t, "Image after duplicate", got, a2)

		orphan := imagestore.Image{UploadID: uploadID(9), TenantID: c.ID + 1000, CreatedAt: t0}
		wantErr(t, "AddImage unknown tenant", s.AddImage(ctx, orphan, 0), imagestore.ErrNotFound)
		_, err = s.Image(ctx, uploadID(9))
		wantErr(t, "Image unknown", err, imagestore.ErrNotFound)
	})
}

func testRemoveImage(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	img := newImage(t, s, a.ID, uploadID(1), t0, 100)
	keep := newImage(t, s, a.ID, uploadID(2), t0, 200)
	exp := t0.Add(time.Hour)
	for secret, id := range map[string]string{"f1": uploadID(1), "f2": uploadID(1), "keep": uploadID(2)} {
		must(t, "CreateFetchToken "+secret, s.CreateFetchToken(ctx, hash(secret), imagestore.FetchToken{UploadID: id, OrderID: "order-" + secret, ExpiresAt: exp}))
	}

	tests := []struct {
		name     string
		tenantID int64
		id       string
	}{
		{"another tenant's image", b.ID, uploadID(1)},
		{"unknown image", a.ID, uploadID(9)},
		{"unknown tenant", a.ID + b.ID + 1000, uploadID(1)},
	}
	for _, tc := range tests {
		wantErr(t, "RemoveImage "+tc.name, s.RemoveImage(ctx, tc.tenantID, tc.id), imagestore.ErrNotFound)
	}
	got, _, err := s.ImageForToken(ctx, hash("f1"), t0)
	must(t, "ImageForToken after refused removals", err)
	checkImage(t, "ImageForToken after refused removals", got, img)

	must(t, "RemoveImage", s.RemoveImage(ctx, a.ID, uploadID(1)))
	_, err = s.Image(ctx, uploadID(1))
	wantErr(t, "Image after RemoveImage", err, imagestore.ErrNotFound)
	for _, secret := range []string{"f1", "f2"} {
		_, _, err = s.ImageForToken(ctx, hash(secret), t0)
		wantErr(t, "ImageForToken "+secret+" after RemoveImage", err, imagestore.ErrNotFound)
	}
	got, _, err = s.ImageForToken(ctx, hash("keep"), t0)
	must(t, "ImageForToken of the other image", err)
	checkImage(t, "ImageForToken of the other image", got, keep)
	wantErr(t, "RemoveImage twice", s.RemoveImage(ctx, a.ID, uploadID(1)), imagestore.ErrNotFound)

	// The tokens are revoked, not merely dangling: an image later stored
	// under the same id is not reachable through them.
	again := newImage(t, s, a.ID, uploadID(1), t0.Add(time.Minute), 300)
	for _, secret := range []string{"f1", "f2"} {
		_, _, err = s.ImageForToken(ctx, hash(secret), t0)
		wantErr(t, "ImageForToken "+secret+" after the id is reused", err, imagestore.ErrNotFound)
	}
	must(t, "CreateFetchToken for the new image", s.CreateFetchToken(ctx, hash("f3"), imagestore.FetchToken{UploadID: uploadID(1), ExpiresAt: exp}))
	got, _, err = s.ImageForToken(ctx, hash("f3"), t0)
	must(t, "ImageForToken for the new image", err)
	checkImage(t, "ImageForToken for the new image", got, again)
}

func testFetchTokens(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	img1 := newImage(t, s, a.ID, uploadID(1), t0, 100)
	img2 := newImage(t, s, a.ID, uploadID(2), t0, 200)
	exp := t0.Add(time.Hour)

	err := s.CreateFetchToken(ctx, hash("nope"), imagestore.FetchToken{UploadID: uploadID(9), OrderID: "o", ExpiresAt: exp})
	wantErr(t, "CreateFetchToken unknown image", err, imagestore.ErrNotFound)
	_, _, err = s.ImageForToken(ctx, hash("nope"), t0)
	wantErr(t, "ImageForToken of refused token", err, imagestore.ErrNotFound)

	must(t, "CreateFetchToken order", s.CreateFetchToken(ctx, hash("order"), imagestore.FetchToken{UploadID: uploadID(1), OrderID: "order-1", ExpiresAt: exp}))
	// An operator's token has no order.
	must(t, "CreateFetchToken operator", s.CreateFetchToken(ctx, hash("operator"), imagestore.FetchToken{UploadID: uploadID(2), ExpiresAt: exp}))
	err = s.CreateFetchToken(ctx, hash("order"), imagestore.FetchToken{UploadID: uploadID(2), OrderID: "order-2", ExpiresAt: exp.Add(time.Hour)})
	wantErr(t, "CreateFetchToken duplicate", err, imagestore.ErrExists)

	tests := []struct {
		name  string
		token string
		now   time.Time
		want  *imagestore.Image // nil: ErrNotFound
	}{
		{"valid", "order", t0, &img1},
		{"operator", "operator", t0, &img2},
		{"one nanosecond before expiry", "order", exp.Add(-time.Nanosecond), &img1},
		{"at expiry", "order", exp, nil},
		{"after expiry", "order", exp.Add(time.Hour), nil},
		// The duplicate did not replace the original's expiry.
		{"duplicate did not extend", "order", exp.Add(30 * time.Minute), nil},
		{"unknown", "unknown", t0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := s.ImageForToken(t.Context(), hash(tc.token), tc.now)
			if tc.want == nil {
				wantErr(t, "ImageForToken", err, imagestore.ErrNotFound)
				return
			}
			must(t, "ImageForToken", err)
			checkImage(t, "ImageForToken", got, *tc.want)
		})
	}
}

func testSweepTickets(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	const retain = 24 * time.Hour
	h := time.Hour
	newTicket(t, s, a.ID, "A", uploadID(1), t0.Add(1*h))  // unused
	newTicket(t, s, a.ID, "B", uploadID(2), t0.Add(2*h))  // unused
	newTicket(t, s, a.ID, "C", uploadID(3), t0.Add(1*h))  // used
	newTicket(t, s, a.ID, "D", uploadID(4), t0.Add(30*h)) // unused
	_, err := s.ConsumeTicket(ctx, hash("C"), t0)
	must(t, "ConsumeTicket C", err)

	steps := []struct {
		name    string
		now     time.Time
		counted int
		gone    []string
		kept    []string
	}{
		{"nothing expired", t0, 0, nil, []string{"A", "B", "C", "D"}},
		{"one nanosecond before A expires", t0.Add(h - time.Nanosecond), 0, nil, []string{"A", "B", "C", "D"}},
		// Expired at expires_at; C is used, so it was never an expiry.
		{"A expires", t0.Add(h), 1, nil, []string{"A", "B", "C", "D"}},
		{"A is not counted twice", t0.Add(h), 0, nil, []string{"A", "B", "C", "D"}},
		{"B expires", t0.Add(3 * h), 1, nil, []string{"A", "B", "C", "D"}},
		// Forgotten only strictly after retain.
		{"A and C at the retain boundary", t0.Add(h + retain), 0, nil, []string{"A", "B", "C", "D"}},
		{"A and C past retain", t0.Add(h + retain + time.Nanosecond), 0, []string{"A", "C"}, []string{"B", "D"}},
		{"D expires; B past retain", t0.Add(30 * h), 1, []string{"A", "B", "C"}, []string{"D"}},
		{"nothing new", t0.Add(30 * h), 0, []string{"A", "B", "C"}, []string{"D"}},
		{"everything past retain", t0.Add(100 * h), 0, []string{"A", "B", "C", "D"}, nil},
	}
	for _, st := range steps {
		n, err := s.SweepTickets(ctx, st.now, retain)
		must(t, "SweepTickets "+st.name, err)
		if n != st.counted {
			t.Errorf("SweepTickets %s: %d newly expired, want %d", st.name, n, st.counted)
		}
		for _, secret := range st.gone {
			_, err := s.Ticket(ctx, hash(secret))
			wantErr(t, st.name+": Ticket "+secret, err, imagestore.ErrNotFound)
		}
		for _, secret := range st.kept {
			_, err := s.Ticket(ctx, hash(secret))
			must(t, st.name+": Ticket "+secret, err)
		}
	}

	// A ticket that both expires and ages out between two sweeps is still
	// counted, once, before it is forgotten.
	newTicket(t, s, a.ID, "E", uploadID(5), t0.Add(200*h))
	n, err := s.SweepTickets(ctx, t0.Add(500*h), retain)
	must(t, "SweepTickets E", err)
	if n != 1 {
		t.Errorf("SweepTickets E: %d newly expired, want 1", n)
	}
	_, err = s.Ticket(ctx, hash("E"))
	wantErr(t, "Ticket E after sweep", err, imagestore.ErrNotFound)
	n, err = s.SweepTickets(ctx, t0.Add(500*h), retain)
	must(t, "SweepTickets again", err)
	if n != 0 {
		t.Errorf("SweepTickets again: %d newly expired, want 0", n)
	}
}

// testSweepTicketsBatches: a sweep counts and forgets in writes of
// imagestore.SweepBatch tickets each (so that the tickets being issued wait
// one batch at most); one more than two whole batches is counted whole,
// once, and forgotten whole.
func testSweepTicketsBatches(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	const retain = time.Hour
	expires := t0.Add(time.Minute)
	n := 2*imagestore.SweepBatch + 1
	for i := range n {
		newTicket(t, s, a.ID, fmt.Sprintf("s%d", i), uploadID(1000+i), expires)
	}
	for _, step := range []struct {
		name string
		now  time.Time
		want int
	}{
		{"all expire", expires, n},
		{"none counted twice", expires, 0},
		{"all past retain", expires.Add(retain + time.Nanosecond), 0},
	} {
		got, err := s.SweepTickets(ctx, step.now, retain)
		must(t, "SweepTickets "+step.name, err)
		if got != step.want {
			t.Errorf("SweepTickets %s: %d newly expired, want %d", step.name, got, step.want)
		}
	}
	for _, i := range []int{0, n / 2, n - 1} {
		_, err := s.Ticket(ctx, hash(fmt.Sprintf("s%d", i)))
		wantErr(t, fmt.Sprintf("Ticket s%d after the sweep past retain", i), err, imagestore.ErrNotFound)
	}
}

func testTimeRoundTrip(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	// Not UTC, odd offset, every nanosecond digit set: the store must keep
	// the instant exactly and hand it back in UTC.
	zone := time.FixedZone("UTC+05:45", 5*3600+45*60)
	created := time.Date(2029, 12, 31, 23, 59, 59, 987654321, zone)
	expires := created.Add(36*time.Hour + 1)
	used := created.Add(7*time.Hour + 3)
	a := newTenant(t, s, "alpha")

	tk := imagestore.Ticket{UploadID: uploadID(1), TenantID: a.ID, Name: "rt", CreatedAt: created, ExpiresAt: expires}
	must(t, "CreateTicket", s.CreateTicket(ctx, tk, hash("rt"), 0))
	got, err := s.ConsumeTicket(ctx, hash("rt"), used)
	must(t, "ConsumeTicket", err)
	want := tk
	want.UsedAt = used
	checkTicket(t, "ConsumeTicket", got, want)
	got, err = s.Ticket(ctx, hash("rt"))
	must(t, "Ticket", err)
	checkTicket(t, "Ticket", got, want)

	img := imagestore.Image{UploadID: uploadID(1), TenantID: a.ID, Name: "rt", Size: 1, VirtualSize: 2, SHA256: "ab", CreatedAt: created}
	must(t, "AddImage", s.AddImage(ctx, img, 0))
	gotImg, err := s.Image(ctx, uploadID(1))
	must(t, "Image", err)
	checkImage(t, "Image", gotImg, img)

	// The fetch token's expiry round-trips to the nanosecond too.
	must(t, "CreateFetchToken", s.CreateFetchToken(ctx, hash("ft"), imagestore.FetchToken{UploadID: uploadID(1), ExpiresAt: expires}))
	_, gotExp, err := s.ImageForToken(ctx, hash("ft"), expires.Add(-time.Nanosecond))
	must(t, "ImageForToken just before expiry", err)
	if !gotExp.Equal(expires) {
		t.Errorf("ImageForToken: expiry %v, want %v", gotExp, expires)
	}
	_, _, err = s.ImageForToken(ctx, hash("ft"), expires)
	wantErr(t, "ImageForToken at expiry", err, imagestore.ErrNotFound)

	// Whatever CreatedAt the store gives a tenant, it reads back the same.
	tn, err := s.Tenant(ctx, "alpha")
	must(t, "Tenant", err)
	checkTenant(t, "Tenant", tn, a)
}

func testStats(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	check := func(when string, images, bytes int64) {
		t.Helper()
		st, err := s.Stats(ctx)
		must(t, "Stats "+when, err)
		if want := (imagestore.Stats{Images: images, ImageBytes: bytes}); st != want {
			t.Errorf("Stats %s = %+v, want %+v", when, st, want)
		}
	}
	check("empty", 0, 0)
	ids, err := s.ImageIDs(ctx)
	must(t, "ImageIDs empty", err)
	if len(ids) != 0 {
		t.Errorf("ImageIDs on an empty store = %v", ids)
	}

	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	newImage(t, s, a.ID, uploadID(1), t0, 1<<40) // sizes beyond 32 bits
	newImage(t, s, a.ID, uploadID(2), t0, 5)
	newImage(t, s, b.ID, uploadID(3), t0, 7)
	check("after three images", 3, 1<<40+12)
	must(t, "RemoveImage", s.RemoveImage(ctx, a.ID, uploadID(1)))
	check("after removal", 2, 12)
}

// hashState returns the marshalled SHA-256 state after data, the form a
// resumable upload records.
func hashState(t *testing.T, data string) []byte {
	t.Helper()
	h := sha256.New()
	h.Write([]byte(data))
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	must(t, "MarshalBinary", err)
	return st
}

// newSession issues a ticket for id and starts a session on it at t0.
func newSession(t *testing.T, s imagestore.Store, tenantID int64, secret, id string, expires time.Time) imagestore.UploadSession {
	t.Helper()
	newTicket(t, s, tenantID, "ticket-"+secret, id, t0.Add(time.Hour))
	us, err := s.StartSession(t.Context(), hash("ticket-"+secret), hash(secret), imagestore.UploadSession{
		Length:    1 << 20,
		HashState: hashState(t, ""),
		CreatedAt: t0,
		ExpiresAt: expires,
	}, t0)
	must(t, "StartSession "+secret, err)
	return us
}

func checkSession(t *testing.T, op string, got, want imagestore.UploadSession) {
	t.Helper()
	for _, d := range []string{
		timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt),
		timeDiff("ExpiresAt", got.ExpiresAt, want.ExpiresAt),
	} {
		if d != "" {
			t.Errorf("%s: %s", op, d)
		}
	}
	if !bytes.Equal(got.HashState, want.HashState) {
		t.Errorf("%s: HashState = %x, want %x", op, got.HashState, want.HashState)
	}
	// UploadSession holds a slice, so it cannot be compared with !=.
	type fields struct {
		UploadID       string
		TenantID       int64
		Name           string
		EFI            bool
		Length, Offset int64
	}
	g := fields{got.UploadID, got.TenantID, got.Name, got.EFI, got.Length, got.Offset}
	w := fields{want.UploadID, want.TenantID, want.Name, want.EFI, want.Length, want.Offset}
	if g != w {
		t.Errorf("%s: got %+v, want %+v", op, g, w)
	}
}

// sessionIDs returns SessionUploadIDs sorted; the order is not part of
// the contract.
func sessionIDs(t *testing.T, s imagestore.Store) []string {
	t.Helper()
	ids, err := s.SessionUploadIDs(t.Context())
	must(t, "SessionUploadIDs", err)
	slices.Sort(ids)
	return ids
}

func testStartSession(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	tk := imagestore.Ticket{UploadID: uploadID(1), TenantID: a.ID, Name: "debian.qcow2", EFI: true, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, "CreateTicket", s.CreateTicket(ctx, tk, hash("ticket"), 0))

	// Not UTC, every nanosecond digit set; a real hash state (binary, with
	// zero bytes); a length beyond 32 bits.
	zone := time.FixedZone("UTC-03:30", -(3*3600 + 30*60))
	created := time.Date(2031, 3, 4, 1, 36, 7, 987654321, zone)
	expires := created.Add(24*time.Hour + 1)
	now := t0.Add(time.Minute)
	state := hashState(t, "first bytes")
	in := imagestore.UploadSession{
		// The ticket decides these four; the caller's values are ignored.
		UploadID: uploadID(99),
		TenantID: b.ID,
		Name:     "not the ticket's",
		EFI:      false,

		Length:    5 << 32,
		Offset:    0,
		HashState: state,
		CreatedAt: created,
		ExpiresAt: expires,
	}
	got, err := s.StartSession(ctx, hash("ticket"), hash("session"), in, now)
	must(t, "StartSession", err)
	want := imagestore.UploadSession{
		UploadID:  tk.UploadID,
		TenantID:  a.ID,
		Name:      tk.Name,
		EFI:       true,
		Length:    5 << 32,
		HashState: state,
		CreatedAt: created,
		ExpiresAt: expires,
	}
	checkSession(t, "StartSession", got, want)
	stored, err := s.Session(ctx, hash("session"))
	must(t, "Session", err)
	checkSession(t, "Session", stored, want)

	// The ticket was consumed at now, exactly as ConsumeTicket would have.
	gotTk, err := s.Ticket(ctx, hash("ticket"))
	must(t, "Ticket", err)
	wantTk := tk
	wantTk.UsedAt = now
	checkTicket(t, "Ticket after StartSession", gotTk, wantTk)
	_, err = s.ConsumeTicket(ctx, hash("ticket"), now)
	wantErr(t, "ConsumeTicket after StartSession", err, imagestore.ErrTicketUsed)
	_, err = s.StartSession(ctx, hash("ticket"), hash("session-2"), in, now)
	wantErr(t, "StartSession again", err, imagestore.ErrTicketUsed)
	_, err = s.Session(ctx, hash("session-2"))
	wantErr(t, "Session of the refused second start", err, imagestore.ErrNotFound)

	// A ticket consumed by ConsumeTicket cannot start a session either.
	newTicket(t, s, a.ID, "plain", uploadID(2), t0.Add(time.Hour))
	_, err = s.ConsumeTicket(ctx, hash("plain"), now)
	must(t, "ConsumeTicket plain", err)
	_, err = s.StartSession(ctx, hash("plain"), hash("session-3"), in, now)
	wantErr(t, "StartSession on a consumed ticket", err, imagestore.ErrTicketUsed)

	_, err = s.Session(ctx, hash("unknown"))
	wantErr(t, "Session unknown", err, imagestore.ErrNotFound)
	if ids, want := sessionIDs(t, s), []string{uploadID(1)}; !slices.Equal(ids, want) {
		t.Errorf("SessionUploadIDs = %v, want %v", ids, want)
	}
}

func testStartSessionRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	exp := t0.Add(time.Hour)
	us := imagestore.UploadSession{Length: 10, HashState: hashState(t, ""), CreatedAt: t0, ExpiresAt: exp.Add(time.Hour)}
	tests := []struct {
		name string
		now  time.Time
		want error
	}{
		{"one nanosecond before expiry", exp.Add(-time.Nanosecond), nil},
		{"at expiry", exp, imagestore.ErrTicketExpired},
		{"after expiry", exp.Add(time.Hour), imagestore.ErrTicketExpired},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			secret := fmt.Sprintf("ticket-%d", i)
			session := fmt.Sprintf("session-%d", i)
			tk := newTicket(t, s, a.ID, secret, uploadID(i+1), exp)
			_, err := s.StartSession(ctx, hash(secret), hash(session), us, tc.now)
			if tc.want == nil {
				must(t, "StartSession", err)
				return
			}
			wantErr(t, "StartSession", err, tc.want)
			// Refused: the ticket stays unused and no session exists.
			stored, err := s.Ticket(ctx, hash(secret))
			must(t, "Ticket", err)
			checkTicket(t, "Ticket after refusal", stored, tk)
			_, err = s.Session(ctx, hash(session))
			wantErr(t, "Session after refusal", err, imagestore.ErrNotFound)
		})
	}
	t.Run("unknown ticket", func(t *testing.T) {
		_, err := s.StartSession(ctx, hash("unknown"), hash("session-unknown"), us, t0)
		wantErr(t, "StartSession", err, imagestore.ErrNotFound)
		_, err = s.Session(ctx, hash("session-unknown"))
		wantErr(t, "Session after refusal", err, imagestore.ErrNotFound)
	})
	// One transaction: a session that cannot be stored (its hash is
	// taken) leaves the ticket unused, for a retry with a fresh id.
	t.Run("session hash taken", func(t *testing.T) {
		tk := newTicket(t, s, a.ID, "dup", uploadID(50), exp)
		_, err := s.StartSession(ctx, hash("dup"), hash("session-0"), us, t0)
		wantErr(t, "StartSession with a taken session hash", err, imagestore.ErrExists)
		stored, err := s.Ticket(ctx, hash("dup"))
		must(t, "Ticket", err)
		checkTicket(t, "Ticket after refused session", stored, tk)
		got, err := s.Session(ctx, hash("session-0"))
		must(t, "Session session-0", err)
		if got.UploadID != uploadID(1) {
			t.Errorf("session-0 now names upload %s, want %s", got.UploadID, uploadID(1))
		}
		_, err = s.StartSession(ctx, hash("dup"), hash("session-fresh"), us, t0)
		must(t, "StartSession retry", err)
	})
	if ids, want := sessionIDs(t, s), []string{uploadID(1), uploadID(50)}; !slices.Equal(ids, want) {
		t.Errorf("SessionUploadIDs = %v, want %v", ids, want)
	}
}

func testStartSessionConcurrent(t *testing.T, s imagestore.Store) {
	const n = 8
	a := newTenant(t, s, "alpha")
	newTicket(t, s, a.ID, "race", uploadID(1), t0.Add(time.Hour))
	us := imagestore.UploadSession{Length: 10, HashState: hashState(t, ""), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}

	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = s.StartSession(t.Context(), hash("race"), hash(fmt.Sprintf("session-%d", i)), us, t0)
		})
	}
	close(start)
	wg.Wait()

	winner, used := -1, 0
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("callers %d and %d both started a session", winner, i)
			}
			winner = i
		case errors.Is(err, imagestore.ErrTicketUsed):
			used++
		default:
			t.Errorf("caller %d: %v, want nil or ErrTicketUsed", i, err)
		}
	}
	if winner < 0 || used != n-1 {
		t.Fatalf("%d winners and %d ErrTicketUsed, want 1 and %d", n-used, used, n-1)
	}
	for i := range n {
		_, err := s.Session(t.Context(), hash(fmt.Sprintf("session-%d", i)))
		if i == winner {
			must(t, "Session of the winner", err)
		} else {
			wantErr(t, fmt.Sprintf("Session of loser %d", i), err, imagestore.ErrNotFound)
		}
	}
	if ids := sessionIDs(t, s); !slices.Equal(ids, []string{uploadID(1)}) {
		t.Errorf("SessionUploadIDs = %v, want exactly one session", ids)
	}
}

func testSaveProgress(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	us := newSession(t, s, a.ID, "s1", uploadID(1), t0.Add(time.Hour))
	other := newSession(t, s, a.ID, "s2", uploadID(2), t0.Add(time.Hour))

	state := hashState(t, "0123456789")
	later := t0.Add(3*time.Hour + time.Nanosecond)
	must(t, "SaveProgress", s.SaveProgress(ctx, us.UploadID, 10, state, later))
	want := us
	want.Offset, want.HashState, want.ExpiresAt = 10, state, later
	got, err := s.Session(ctx, hash("s1"))
	must(t, "Session", err)
	checkSession(t, "Session after SaveProgress", got, want)

	// Expiry follows the last call, even backwards; the offset reaches
	// the end of the upload.
	state = hashState(t, "the whole image")
	must(t, "SaveProgress to the end", s.SaveProgress(ctx, us.UploadID, us.Length, state, t0.Add(time.Minute)))
	want.Offset, want.HashState, want.ExpiresAt = us.Length, state, t0.Add(time.Minute)
	got, err = s.Session(ctx, hash("s1"))
	must(t, "Session", err)
	checkSession(t, "Session after second SaveProgress", got, want)

	got, err = s.Session(ctx, hash("s2"))
	must(t, "Session s2", err)
	checkSession(t, "other session untouched", got, other)

	err = s.SaveProgress(ctx, uploadID(9), 1, state, later)
	wantErr(t, "SaveProgress unknown", err, imagestore.ErrNotFound)
	must(t, "EndSession", s.EndSession(ctx, us.UploadID))
	err = s.SaveProgress(ctx, us.UploadID, 1, state, later)
	wantErr(t, "SaveProgress after EndSession", err, imagestore.ErrNotFound)
	_, err = s.Session(ctx, hash("s1"))
	wantErr(t, "SaveProgress after EndSession recreated the session", err, imagestore.ErrNotFound)
}

func testEndSession(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	us := newSession(t, s, a.ID, "s1", uploadID(1), t0.Add(time.Hour))
	other := newSession(t, s, a.ID, "s2", uploadID(2), t0.Add(time.Hour))

	must(t, "EndSession", s.EndSession(ctx, us.UploadID))
	_, err := s.Session(ctx, hash("s1"))
	wantErr(t, "Session after EndSession", err, imagestore.ErrNotFound)
	must(t, "EndSession twice", s.EndSession(ctx, us.UploadID))
	must(t, "EndSession unknown", s.EndSession(ctx, uploadID(9)))

	got, err := s.Session(ctx, hash("s2"))
	must(t, "Session s2", err)
	checkSession(t, "other session after EndSession", got, other)
	if ids := sessionIDs(t, s); !slices.Equal(ids, []string{uploadID(2)}) {
		t.Errorf("SessionUploadIDs = %v, want [%s]", ids, uploadID(2))
	}
	// Ending the session does not give the ticket back.
	_, err = s.ConsumeTicket(ctx, hash("ticket-s1"), t0)
	wantErr(t, "ConsumeTicket after EndSession", err, imagestore.ErrTicketUsed)
}

func testExpireSessions(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	h := time.Hour
	newSession(t, s, a.ID, "A", uploadID(1), t0.Add(1*h))
	newSession(t, s, a.ID, "B", uploadID(2), t0.Add(1*h))
	newSession(t, s, a.ID, "C", uploadID(3), t0.Add(2*h))
	newSession(t, s, a.ID, "D", uploadID(4), t0.Add(2*h))
	// Progress moves D's expiry past the others.
	must(t, "SaveProgress D", s.SaveProgress(ctx, uploadID(4), 5, hashState(t, "12345"), t0.Add(10*h)))

	steps := []struct {
		name    string
		now     time.Time
		expired []string
		live    []string // secrets whose sessions remain
	}{
		{"nothing expired", t0, nil, []string{"A", "B", "C", "D"}},
		{"one nanosecond before A and B", t0.Add(h - time.Nanosecond), nil, []string{"A", "B", "C", "D"}},
		// Dead at ExpiresAt.
		{"A and B at expiry", t0.Add(h), []string{uploadID(1), uploadID(2)}, []string{"C", "D"}},
		{"A and B only once", t0.Add(h), nil, []string{"C", "D"}},
		{"C after expiry; D was extended", t0.Add(5 * h), []string{uploadID(3)}, []string{"D"}},
		{"D", t0.Add(10 * h), []string{uploadID(4)}, nil},
		{"empty", t0.Add(100 * h), nil, nil},
	}
	secretID := map[string]string{"A": uploadID(1), "B": uploadID(2), "C": uploadID(3), "D": uploadID(4)}
	for _, st := range steps {
		ids, err := s.ExpireSessions(ctx, st.now)
		must(t, "ExpireSessions "+st.name, err)
		slices.Sort(ids)
		if !slices.Equal(ids, st.expired) {
			t.Errorf("ExpireSessions %s = %v, want %v", st.name, ids, st.expired)
		}
		var wantLive []string
		for _, secret := range st.live {
			_, err := s.Session(ctx, hash(secret))
			must(t, st.name+": Session "+secret, err)
			wantLive = append(wantLive, secretID[secret])
		}
		for secret, id := range secretID {
			if !slices.Contains(wantLive, id) {
				_, err := s.Session(ctx, hash(secret))
				wantErr(t, st.name+": Session "+secret, err, imagestore.ErrNotFound)
			}
		}
		if ids := sessionIDs(t, s); !slices.Equal(ids, wantLive) {
			t.Errorf("%s: SessionUploadIDs = %v, want %v", st.name, ids, wantLive)
		}
	}
	// An expired, swept session takes no more progress.
	err := s.SaveProgress(ctx, uploadID(1), 1, hashState(t, "1"), t0.Add(100*h))
	wantErr(t, "SaveProgress after expiry", err, imagestore.ErrNotFound)
}

func testSessionUploadIDs(t *testing.T, s imagestore.Store) {
	if ids := sessionIDs(t, s); len(ids) != 0 {
		t.Fatalf("SessionUploadIDs on an empty store = %v", ids)
	}
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	newSession(t, s, a.ID, "s3", uploadID(3), t0.Add(time.Hour))
	newSession(t, s, b.ID, "s1", uploadID(1), t0.Add(time.Hour))
	newSession(t, s, a.ID, "s2", uploadID(2), t0.Add(time.Hour))
	// Neither an unused ticket nor an image is a session.
	newTicket(t, s, a.ID, "unused", uploadID(4), t0.Add(time.Hour))
	newImage(t, s, a.ID, uploadID(5), t0, 1)

	want := []string{uploadID(1), uploadID(2), uploadID(3)}
	if ids := sessionIDs(t, s); !slices.Equal(ids, want) {
		t.Errorf("SessionUploadIDs = %v, want %v", ids, want)
	}
	must(t, "EndSession", s.EndSession(t.Context(), uploadID(2)))
	want = []string{uploadID(1), uploadID(3)}
	if ids := sessionIDs(t, s); !slices.Equal(ids, want) {
		t.Errorf("SessionUploadIDs after EndSession = %v, want %v", ids, want)
	}
}
