package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// newHost creates a tenant with a Stripe account, as a host needs one.
func newHost(t *testing.T, s imagestore.Store, name string) imagestore.Tenant {
	t.Helper()
	tn, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: name, InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: "vmshelf-1", StripeAccount: "acct_" + name}, hash("token-"+name))
	must(t, "CreateTenant "+name, err)
	return tn
}

// newListing stores an open listing of host at 600 cents a replica.
func newListing(t *testing.T, s imagestore.Store, host imagestore.Tenant, id string, capacity int, created time.Time) imagestore.Listing {
	t.Helper()
	l, err := s.CreateListing(t.Context(), imagestore.Listing{ID: id, HostID: host.ID, UnitPrice: 600, Currency: "eur",
		Capacity: capacity, CreatedAt: created})
	must(t, "CreateListing "+id, err)
	return l
}

// orderOf builds a valid order of quantity replicas of l by buyer, as the
// market handler would: prices copied from the listing, half the total
// as the fee, the host's account as the destination.
func orderOf(l imagestore.Listing, host, buyer imagestore.Tenant, id string, quantity int, created time.Time) imagestore.Order {
	total := l.UnitPrice * int64(quantity)
	return imagestore.Order{
		ID:           id,
		ListingID:    l.ID,
		BuyerID:      buyer.ID,
		HostID:       host.ID,
		Quantity:     quantity,
		ImageKind:    imagestore.ImageCatalogue,
		Image:        "debian-13",
		Name:         "web-" + id,
		UnitPrice:    l.UnitPrice,
		Total:        total,
		Fee:          total / 2,
		Currency:     l.Currency,
		Destination:  host.StripeAccount,
		ReserveUntil: created.Add(time.Hour),
		CreatedAt:    created,
	}
}

// stored is o as the store keeps it right after CreateOrder.
func stored(o imagestore.Order) imagestore.Order {
	o.State = imagestore.OrderAwaitingPayment
	o.Reason, o.CheckoutID, o.CheckoutURL = "", "", ""
	o.PaidAt, o.ExpiresAt, o.EndedAt = time.Time{}, time.Time{}, time.Time{}
	o.Note = ""
	return o
}

func placeOrder(t *testing.T, s imagestore.Store, o imagestore.Order, userData string) imagestore.Order {
	t.Helper()
	must(t, "CreateOrder "+o.ID, s.CreateOrder(t.Context(), o, userData, 0))
	return stored(o)
}

func checkListing(t *testing.T, op string, got, want imagestore.Listing) {
	t.Helper()
	for _, d := range []string{
		timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt),
		timeDiff("ClosedAt", got.ClosedAt, want.ClosedAt),
	} {
		if d != "" {
			t.Errorf("%s: listing %s: %s", op, want.ID, d)
		}
	}
	got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
	got.ClosedAt, want.ClosedAt = time.Time{}, time.Time{}
	if got != want {
		t.Errorf("%s: got %+v, want %+v", op, got, want)
	}
}

func checkListings(t *testing.T, op string, got []imagestore.Listing, want ...imagestore.Listing) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d listings %v, want %d %v", op, len(got), listingIDs(got), len(want), listingIDs(want))
	}
	for i := range got {
		checkListing(t, fmt.Sprintf("%s[%d]", op, i), got[i], want[i])
	}
}

func listingIDs(ls []imagestore.Listing) []string {
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.ID)
	}
	return ids
}

func checkOrder(t *testing.T, op string, got, want imagestore.Order) {
	t.Helper()
	for _, d := range []string{
		timeDiff("ReserveUntil", got.ReserveUntil, want.ReserveUntil),
		timeDiff("CreatedAt", got.CreatedAt, want.CreatedAt),
		timeDiff("PaidAt", got.PaidAt, want.PaidAt),
		timeDiff("ExpiresAt", got.ExpiresAt, want.ExpiresAt),
		timeDiff("EndedAt", got.EndedAt, want.EndedAt),
		timeDiff("BlockedSince", got.BlockedSince, want.BlockedSince),
		timeDiff("RefundNextAt", got.RefundNextAt, want.RefundNextAt),
		timeDiff("RefundedAt", got.RefundedAt, want.RefundedAt),
		timeDiff("DisputedAt", got.DisputedAt, want.DisputedAt),
		timeDiff("DisputeClosedAt", got.DisputeClosedAt, want.DisputeClosedAt),
	} {
		if d != "" {
			t.Errorf("%s: order %s: %s", op, want.ID, d)
		}
	}
	for _, o := range []*imagestore.Order{&got, &want} {
		o.ReserveUntil, o.CreatedAt, o.PaidAt, o.ExpiresAt, o.EndedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
		o.BlockedSince, o.RefundNextAt, o.RefundedAt, o.DisputedAt, o.DisputeClosedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
	}
	if got != want {
		t.Errorf("%s:\n got %+v\nwant %+v", op, got, want)
	}
}

func checkOrders(t *testing.T, op string, got []imagestore.Order, want ...imagestore.Order) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d orders %v, want %d %v", op, len(got), orderIDs(got), len(want), orderIDs(want))
	}
	for i := range got {
		checkOrder(t, fmt.Sprintf("%s[%d]", op, i), got[i], want[i])
	}
}

func orderIDs(orders []imagestore.Order) []string {
	var ids []string
	for _, o := range orders {
		ids = append(ids, o.ID)
	}
	return ids
}

func getOrder(t *testing.T, s imagestore.Store, id string) imagestore.Order {
	t.Helper()
	o, err := s.Order(t.Context(), id)
	must(t, "Order "+id, err)
	return o
}

func getListing(t *testing.T, s imagestore.Store, id string) imagestore.Listing {
	t.Helper()
	l, err := s.Listing(t.Context(), id)
	must(t, "Listing "+id, err)
	return l
}

func testCreateListing(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	// Not UTC, every nanosecond digit set: stored as the instant, read
	// back in UTC.
	created := time.Date(2031, 3, 4, 9, 51, 7, 987654321, time.FixedZone("UTC+04:45", 4*3600+45*60))
	in := imagestore.Listing{ID: "l1", HostID: h.ID, UnitPrice: 650, Currency: "eur", Capacity: 5, CreatedAt: created,
		// A new listing is open and has no orders, whatever the caller says.
		ClosedAt: t0, Reserved: 2, Running: 1}
	got, err := s.CreateListing(ctx, in)
	must(t, "CreateListing", err)
	want := in
	want.ClosedAt, want.Reserved, want.Running = time.Time{}, 0, 0
	checkListing(t, "CreateListing", got, want)
	if !got.Open() || got.Free() != 5 {
		t.Errorf("new listing: Open %v, Free %d; want open with 5 free", got.Open(), got.Free())
	}
	checkListing(t, "Listing", getListing(t, s, "l1"), want)

	now, err := s.CreateListing(ctx, imagestore.Listing{ID: "l2", HostID: h.ID, UnitPrice: 1, Currency: "eur", Capacity: 1})
	must(t, "CreateListing without CreatedAt", err)
	if now.CreatedAt.IsZero() {
		t.Error("a zero CreatedAt was stored as the zero time, want now")
	}
	checkListing(t, "Listing l2", getListing(t, s, "l2"), now)

	tests := []struct {
		name string
		l    imagestore.Listing
		want error // nil: any error
	}{
		{"duplicate id", imagestore.Listing{ID: "l1", HostID: h.ID, UnitPrice: 1, Currency: "eur", Capacity: 1, CreatedAt: t0}, imagestore.ErrExists},
		{"unknown host", imagestore.Listing{ID: "l3", HostID: h.ID + 1000, UnitPrice: 1, Currency: "eur", Capacity: 1, CreatedAt: t0}, imagestore.ErrNotFound},
		{"capacity 0", imagestore.Listing{ID: "l4", HostID: h.ID, UnitPrice: 1, Currency: "eur", Capacity: 0, CreatedAt: t0}, nil},
		{"unit price 0", imagestore.Listing{ID: "l5", HostID: h.ID, UnitPrice: 0, Currency: "eur", Capacity: 1, CreatedAt: t0}, nil},
		{"no currency", imagestore.Listing{ID: "l6", HostID: h.ID, UnitPrice: 1, Capacity: 1, CreatedAt: t0}, nil},
		{"no id", imagestore.Listing{HostID: h.ID, UnitPrice: 1, Currency: "eur", Capacity: 1, CreatedAt: t0}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.CreateListing(t.Context(), tc.l)
			if tc.want != nil {
				wantErr(t, "CreateListing", err, tc.want)
			} else if err == nil {
				t.Fatalf("CreateListing(%+v) succeeded", tc.l)
			}
		})
	}
	// The refusals stored nothing and left l1 as it was.
	ls, err := s.Listings(ctx, h.ID)
	must(t, "Listings", err)
	// Oldest first: l2's "now" is the real clock, l1 is in the suite's
	// time.
	all := []imagestore.Listing{want, now}
	slices.SortFunc(all, func(a, b imagestore.Listing) int { return a.CreatedAt.Compare(b.CreatedAt) })
	checkListings(t, "Listings after refusals", ls, all...)
	_, err = s.Listing(ctx, "unknown")
	wantErr(t, "Listing unknown", err, imagestore.ErrNotFound)
}

func testListings(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	ls, err := s.OpenListings(ctx)
	must(t, "OpenListings empty", err)
	checkListings(t, "OpenListings on an empty store", ls)

	a := newHost(t, s, "alpha")
	b := newHost(t, s, "bravo")
	// Inserted out of order; two share a creation time.
	a3 := newListing(t, s, a, "la3", 3, t0.Add(2*time.Second))
	a2 := newListing(t, s, a, "la2", 2, t0.Add(time.Second))
	a1 := newListing(t, s, a, "la1", 1, t0.Add(time.Second))
	b1 := newListing(t, s, b, "lb1", 4, t0.Add(time.Nanosecond))

	ls, err = s.Listings(ctx, a.ID)
	must(t, "Listings alpha", err)
	checkListings(t, "Listings alpha", ls, a1, a2, a3)
	ls, err = s.OpenListings(ctx)
	must(t, "OpenListings", err)
	checkListings(t, "OpenListings", ls, b1, a1, a2, a3)

	// Closed listings stay the host's, but are no longer open.
	closed := t0.Add(time.Minute)
	must(t, "CloseListing", s.CloseListing(ctx, a.ID, "la2", closed))
	a2.ClosedAt = closed
	ls, err = s.Listings(ctx, a.ID)
	must(t, "Listings alpha after close", err)
	checkListings(t, "Listings alpha after close", ls, a1, a2, a3)
	ls, err = s.OpenListings(ctx)
	must(t, "OpenListings after close", err)
	checkListings(t, "OpenListings after close", ls, b1, a1, a3)

	ls, err = s.Listings(ctx, b.ID+a.ID+1000)
	must(t, "Listings of an unknown host", err)
	checkListings(t, "Listings of an unknown host", ls)
}

func testCloseListing(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	other := newHost(t, s, "other")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := placeOrder(t, s, orderOf(l, h, buyer, "o1", 2, t0), "")

	wantErr(t, "CloseListing by another host", s.CloseListing(ctx, other.ID, "l1", t0), imagestore.ErrNotFound)
	wantErr(t, "CloseListing unknown", s.CloseListing(ctx, h.ID, "unknown", t0), imagestore.ErrNotFound)
	if got := getListing(t, s, "l1"); !got.Open() {
		t.Fatal("a refused close closed the listing")
	}

	closed := t0.Add(time.Hour + time.Nanosecond)
	must(t, "CloseListing", s.CloseListing(ctx, h.ID, "l1", closed))
	want := l
	want.ClosedAt, want.Reserved = closed, 2
	got := getListing(t, s, "l1")
	checkListing(t, "Listing after close", got, want)
	if got.Open() || got.Free() != 0 {
		t.Errorf("closed listing: Open %v, Free %d; want closed with none free", got.Open(), got.Free())
	}
	// Closing again is not an error and keeps the first time.
	must(t, "CloseListing again", s.CloseListing(ctx, h.ID, "l1", closed.Add(time.Hour)))
	checkListing(t, "Listing after a second close", getListing(t, s, "l1"), want)

	// A closed listing takes no more orders; those placed go on.
	err := s.CreateOrder(ctx, orderOf(l, h, buyer, "o2", 1, t0), "", 0)
	wantErr(t, "CreateOrder on a closed listing", err, imagestore.ErrNoCapacity)
	_, err = s.Order(ctx, "o2")
	wantErr(t, "Order refused on a closed listing", err, imagestore.ErrNotFound)
	must(t, "PayOrder on a closed listing", payOrder(ctx, s, o.ID, t0, t0.Add(30*24*time.Hour)))
	want.Reserved, want.Running = 0, 2
	checkListing(t, "Listing after its order was paid", getListing(t, s, "l1"), want)
}

func testCreateOrder(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 10, t0)
	newImage(t, s, buyer.ID, uploadID(1), t0, 100)

	in := orderOf(l, h, buyer, "o1", 3, time.Date(2031, 3, 4, 1, 36, 7, 987654321, time.FixedZone("UTC-03:30", -(3*3600+30*60))))
	in.ImageKind, in.Image = imagestore.ImageUpload, uploadID(1)
	in.Fee = 899 // the store keeps what billing decided, within the total
	in.ReserveUntil = in.CreatedAt.Add(31*time.Minute + 1)
	// What only state changes set is ignored when the order is placed.
	in.State, in.Reason, in.CheckoutID, in.CheckoutURL = imagestore.OrderPaid, "why", "cs_1", "https://checkout.example/1"
	in.PaidAt, in.ExpiresAt, in.EndedAt = t0, t0.Add(time.Hour), t0.Add(2*time.Hour)
	must(t, "CreateOrder", s.CreateOrder(ctx, in, "#cloud-config\n", 0))
	want := stored(in)
	checkOrder(t, "Order", getOrder(t, s, "o1"), want)

	wantL := l
	wantL.Reserved = 3
	checkListing(t, "Listing after CreateOrder", getListing(t, s, "l1"), wantL)

	// A zero CreatedAt means now; a catalogue image needs no upload.
	now := orderOf(l, h, buyer, "o2", 1, time.Time{})
	now.ReserveUntil = t0
	must(t, "CreateOrder without CreatedAt", s.CreateOrder(ctx, now, "", 0))
	if got := getOrder(t, s, "o2"); got.CreatedAt.IsZero() {
		t.Error("a zero CreatedAt was stored as the zero time, want now")
	}

	// The whole free capacity may be taken by one order.
	full := placeOrder(t, s, orderOf(l, h, buyer, "o3", 6, t0), "")
	wantL.Reserved = 10
	checkListing(t, "Listing full", getListing(t, s, "l1"), wantL)
	checkOrder(t, "Order o3", getOrder(t, s, "o3"), full)
	wantErr(t, "CreateOrder on a full listing", s.CreateOrder(ctx, orderOf(l, h, buyer, "o4", 1, t0), "", 0), imagestore.ErrNoCapacity)
	// A retry of a placed order hears that it exists, even on a full listing.
	wantErr(t, "CreateOrder retried", s.CreateOrder(ctx, in, "#cloud-config\n", 0), imagestore.ErrExists)
	checkOrder(t, "Order after the retry", getOrder(t, s, "o1"), want)
}

// testCreateOrderRefused: every refusal of CreateOrder, each leaving no
// order and no reservation behind.
func testCreateOrderRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	other := newHost(t, s, "other")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 4, t0)
	newImage(t, s, buyer.ID, uploadID(1), t0, 100)
	newImage(t, s, other.ID, uploadID(2), t0, 100)
	placeOrder(t, s, orderOf(l, h, buyer, "taken", 1, t0), "")

	valid := func() imagestore.Order { return orderOf(l, h, buyer, "new", 1, t0) }
	tests := []struct {
		name   string
		change func(o *imagestore.Order)
		want   error // nil: an error that is none of the sentinels
	}{
		{"id taken", func(o *imagestore.Order) { o.ID = "taken" }, imagestore.ErrExists},
		{"unknown listing", func(o *imagestore.Order) { o.ListingID = "unknown" }, imagestore.ErrNotFound},
		{"unknown buyer", func(o *imagestore.Order) { o.BuyerID = buyer.ID + other.ID + h.ID + 1000 }, imagestore.ErrNotFound},
		{"upload of another tenant", func(o *imagestore.Order) { o.ImageKind, o.Image = imagestore.ImageUpload, uploadID(2) }, imagestore.ErrNotFound},
		{"upload that does not exist", func(o *imagestore.Order) { o.ImageKind, o.Image = imagestore.ImageUpload, uploadID(9) }, imagestore.ErrNotFound},
		{"own listing", func(o *imagestore.Order) { o.BuyerID = h.ID }, imagestore.ErrOwnListing},
		{"more than free", func(o *imagestore.Order) { setQuantity(o, 4) }, imagestore.ErrNoCapacity},
		{"other host", func(o *imagestore.Order) { o.HostID, o.Destination = other.ID, other.StripeAccount }, nil},
		{"other price", func(o *imagestore.Order) { o.UnitPrice, o.Total, o.Fee = 500, 500, 250 }, nil},
		{"other currency", func(o *imagestore.Order) { o.Currency = "usd" }, nil},
		{"other destination", func(o *imagestore.Order) { o.Destination = other.StripeAccount }, nil},
		{"total not price × quantity", func(o *imagestore.Order) { o.Total++ }, nil},
		{"fee above total", func(o *imagestore.Order) { o.Fee = o.Total + 1 }, nil},
		{"negative fee", func(o *imagestore.Order) { o.Fee = -1 }, nil},
		{"quantity 0", func(o *imagestore.Order) { setQuantity(o, 0) }, nil},
		{"unknown image kind", func(o *imagestore.Order) { o.ImageKind = "iso" }, nil},
		{"no image", func(o *imagestore.Order) { o.Image = "" }, nil},
		{"no id", func(o *imagestore.Order) { o.ID = "" }, nil},
		{"no reservation deadline", func(o *imagestore.Order) { o.ReserveUntil = time.Time{} }, nil},
	}
	sentinels := []error{imagestore.ErrExists, imagestore.ErrNotFound, imagestore.ErrOwnListing, imagestore.ErrNoCapacity, imagestore.ErrOrderState}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.change(&o)
			err := s.CreateOrder(t.Context(), o, "#!/bin/sh\n", 0)
			if tc.want != nil {
				wantErr(t, "CreateOrder", err, tc.want)
				return
			}
			if err == nil {
				t.Fatalf("CreateOrder(%+v) succeeded", o)
			}
			for _, e := range sentinels {
				if errors.Is(err, e) {
					t.Errorf("CreateOrder: %v; a caller's bug is not %v", err, e)
				}
			}
		})
	}
	_, err := s.Order(ctx, "new")
	wantErr(t, "Order after the refusals", err, imagestore.ErrNotFound)
	want := l
	want.Reserved = 1
	checkListing(t, "Listing after the refusals", getListing(t, s, "l1"), want)
	orders, err := s.Orders(ctx, buyer.ID)
	must(t, "Orders", err)
	if ids := orderIDs(orders); !slices.Equal(ids, []string{"taken"}) {
		t.Errorf("Orders after the refusals = %v, want [taken]", ids)
	}
	// The refusals did not use up the capacity: the rest is still free.
	placeOrder(t, s, orderOf(l, h, buyer, "rest", 3, t0), "")
}

func setQuantity(o *imagestore.Order, q int) {
	o.Quantity = q
	o.Total = o.UnitPrice * int64(q)
	o.Fee = o.Total / 2
}

// testCreateOrderConcurrent: many buyers race for a listing's replicas.
// The count of free replicas and the insert must be one decision: a store
// that reads the capacity and inserts afterwards, unlocked, books more
// replicas than the listing has. The race runs several rounds, each on a
// listing of its own, so that one lucky schedule does not hide it.
func testCreateOrderConcurrent(t *testing.T, s imagestore.Store) {
	const (
		rounds   = 4
		n        = 50
		capacity = 7
	)
	h := newHost(t, s, "host")
	buyers := []imagestore.Tenant{newTenant(t, s, "b0"), newTenant(t, s, "b1"), newTenant(t, s, "b2")}
	for r := range rounds {
		l := newListing(t, s, h, fmt.Sprintf("l%d", r), capacity, t0)
		start := make(chan struct{})
		errs := make([]error, n)
		qty := make([]int, n)
		var wg sync.WaitGroup
		for i := range n {
			qty[i] = 1 + i%3
			o := orderOf(l, h, buyers[i%len(buyers)], fmt.Sprintf("o%d-%02d", r, i), qty[i], t0.Add(time.Duration(i)))
			wg.Go(func() {
				<-start
				errs[i] = s.CreateOrder(t.Context(), o, "", 0)
			})
		}
		close(start)
		wg.Wait()

		booked, minLost := 0, capacity+1
		for i, err := range errs {
			switch {
			case err == nil:
				booked += qty[i]
			case errors.Is(err, imagestore.ErrNoCapacity):
				minLost = min(minLost, qty[i])
			default:
				t.Errorf("round %d, order %d: %v, want nil or ErrNoCapacity", r, i, err)
			}
		}
		if booked > capacity {
			t.Fatalf("round %d: %d replicas booked on a listing of %d", r, booked, capacity)
		}
		got := getListing(t, s, l.ID)
		if got.Reserved != booked || got.Running != 0 {
			t.Errorf("round %d: Listing: Reserved %d, Running %d; want %d booked, 0 running", r, got.Reserved, got.Running, booked)
		}
		// Free only shrinks, so every refused order wanted more than is left.
		if minLost <= got.Free() {
			t.Errorf("round %d: an order of %d was refused, but %d replicas are free", r, minLost, got.Free())
		}
		stored := 0
		for _, b := range buyers {
			orders, err := s.Orders(t.Context(), b.ID)
			must(t, "Orders", err)
			for _, o := range orders {
				if o.ListingID == l.ID {
					stored += o.Quantity
				}
			}
		}
		if stored != booked {
			t.Errorf("round %d: stored orders hold %d replicas, the successful calls %d", r, stored, booked)
		}
	}
}

// testListingCounts: reserved and running follow the orders' states, the
// same through every read of a listing, and a cancelled or expired order
// gives its replicas back exactly once.
func testListingCounts(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 10, t0)
	other := newListing(t, s, h, "l2", 10, t0.Add(time.Second))
	month := t0.Add(30 * 24 * time.Hour)
	check := func(when string, reserved, running int) {
		t.Helper()
		want := l
		want.Reserved, want.Running = reserved, running
		checkListing(t, when+": Listing", getListing(t, s, "l1"), want)
		ls, err := s.Listings(ctx, h.ID)
		must(t, when+": Listings", err)
		wantOther := other
		checkListings(t, when+": Listings", ls, want, wantOther)
		ls, err = s.OpenListings(ctx)
		must(t, when+": OpenListings", err)
		checkListings(t, when+": OpenListings", ls, want, wantOther)
		if got := getListing(t, s, "l1"); got.Free() != 10-reserved-running {
			t.Errorf("%s: Free = %d, want %d", when, got.Free(), 10-reserved-running)
		}
	}
	check("no orders", 0, 0)
	for i, q := range []int{1, 2, 3, 4} {
		placeOrder(t, s, orderOf(l, h, buyer, fmt.Sprintf("o%d", i+1), q, t0), "")
	}
	check("four orders awaiting payment", 10, 0)
	wantErr(t, "CreateOrder on a full listing", s.CreateOrder(ctx, orderOf(l, h, buyer, "o9", 1, t0), "", 0), imagestore.ErrNoCapacity)

	must(t, "PayOrder o2", payOrder(ctx, s, "o2", t0, month))
	check("o2 paid", 8, 2)
	must(t, "MarkOrderActive o2", s.MarkOrderActive(ctx, "o2"))
	check("o2 active", 8, 2)
	must(t, "PayOrder o3", payOrder(ctx, s, "o3", t0, month))
	check("o3 paid", 5, 5)

	must(t, "CancelOrder o1", s.CancelOrder(ctx, "o1", "checkoutExpired", t0))
	check("o1 cancelled", 4, 5)
	// Released once: cancelling again, or trying to pay, changes nothing.
	must(t, "CancelOrder o1 again", s.CancelOrder(ctx, "o1", "checkoutExpired", t0))
	wantErr(t, "PayOrder o1 after cancel", payOrder(ctx, s, "o1", t0, month), imagestore.ErrOrderState)
	check("o1 cancelled twice", 4, 5)
	// A paid order cannot be cancelled out of the count.
	wantErr(t, "CancelOrder o3 paid", s.CancelOrder(ctx, "o3", "paymentFailed", t0), imagestore.ErrOrderState)
	check("o3 still paid", 4, 5)

	// The freed replica can be ordered, and no more.
	placeOrder(t, s, orderOf(l, h, buyer, "o5", 1, t0), "")
	check("o5 took the freed replica", 5, 5)
	wantErr(t, "CreateOrder beyond", s.CreateOrder(ctx, orderOf(l, h, buyer, "o6", 1, t0), "", 0), imagestore.ErrNoCapacity)

	must(t, "ExpireOrder o2", s.ExpireOrder(ctx, "o2", month))
	check("o2 expired", 5, 3)
	must(t, "ExpireOrder o2 again", s.ExpireOrder(ctx, "o2", month.Add(time.Hour)))
	must(t, "PayOrder o2 expired", payOrder(ctx, s, "o2", t0, month))
	check("o2 expired twice and paid again", 5, 3)
	placeOrder(t, s, orderOf(l, h, buyer, "o7", 2, t0), "")
	check("o7 took the expired replicas", 7, 3)
}

// testOrderStates: every state change from every state, with what it
// leaves behind.
func testOrderStates(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	paidAt := t0.Add(time.Minute + 1)
	month := paidAt.Add(30 * 24 * time.Hour)
	cancelAt := t0.Add(2*time.Minute + 3)
	expireAt := month.Add(5)

	n := 0
	// orderIn places a fresh order and moves it to state through the
	// store's own changes, returning it as stored.
	orderIn := func(t *testing.T, state imagestore.OrderState) imagestore.Order {
		t.Helper()
		n++
		o := placeOrder(t, s, orderOf(l, h, buyer, fmt.Sprintf("o%d", n), 1, t0), "")
		must(t, "SetCheckout", s.SetCheckout(ctx, o.ID, "cs_"+o.ID, "https://checkout.example/"+o.ID))
		o.CheckoutID, o.CheckoutURL = "cs_"+o.ID, "https://checkout.example/"+o.ID
		switch state {
		case imagestore.OrderPaid, imagestore.OrderActive, imagestore.OrderExpired,
			imagestore.OrderRefunding, imagestore.OrderRefunded, imagestore.OrderRefundFailed:
			must(t, "PayOrder", payOrder(ctx, s, o.ID, paidAt, month))
			o.State, o.PaidAt, o.ExpiresAt = imagestore.OrderPaid, paidAt, month
		case imagestore.OrderCancelled:
			must(t, "CancelOrder", s.CancelOrder(ctx, o.ID, "checkoutExpired", cancelAt))
			o.State, o.Reason, o.EndedAt = imagestore.OrderCancelled, "checkoutExpired", cancelAt
		}
		if state == imagestore.OrderActive || state == imagestore.OrderExpired {
			must(t, "MarkOrderActive", s.MarkOrderActive(ctx, o.ID))
			o.State = imagestore.OrderActive
		}
		if state == imagestore.OrderExpired {
			must(t, "ExpireOrder", s.ExpireOrder(ctx, o.ID, expireAt))
			o.State, o.EndedAt = imagestore.OrderExpired, expireAt
		}
		if state.Refunded() {
			refundTo(t, s, &o, state, cancelAt)
		}
		checkOrder(t, "Order in "+string(state), getOrder(t, s, o.ID), o)
		return o
	}

	later := month.Add(time.Hour)
	ops := []struct {
		name string
		call func(id string) error
		// from: the states it applies in, with the order it makes;
		// left: the states it leaves alone (nil); all others are
		// ErrOrderState, unchanged.
		from map[imagestore.OrderState]func(o imagestore.Order) imagestore.Order
		left []imagestore.OrderState
	}{
		{"PayOrder", func(id string) error { return payOrder(ctx, s, id, later, later.Add(time.Hour)) },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderAwaitingPayment: func(o imagestore.Order) imagestore.Order {
					o.State, o.PaidAt, o.ExpiresAt = imagestore.OrderPaid, later, later.Add(time.Hour)
					return o
				},
			},
			[]imagestore.OrderState{imagestore.OrderPaid, imagestore.OrderActive, imagestore.OrderExpired}},
		{"CancelOrder", func(id string) error { return s.CancelOrder(ctx, id, "paymentFailed", later) },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderAwaitingPayment: func(o imagestore.Order) imagestore.Order {
					o.State, o.Reason, o.EndedAt = imagestore.OrderCancelled, "paymentFailed", later
					return o
				},
			},
			[]imagestore.OrderState{imagestore.OrderCancelled}},
		{"CancelOwnOrder", func(id string) error { return s.CancelOwnOrder(ctx, buyer.ID, id, "buyerCancelled", later) },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderAwaitingPayment: func(o imagestore.Order) imagestore.Order {
					o.State, o.Reason, o.EndedAt = imagestore.OrderCancelled, "buyerCancelled", later
					return o
				},
			}, nil},
		{"MarkOrderActive", func(id string) error { return s.MarkOrderActive(ctx, id) },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderPaid: func(o imagestore.Order) imagestore.Order {
					o.State = imagestore.OrderActive
					return o
				},
			},
			[]imagestore.OrderState{imagestore.OrderActive}},
		{"ExpireOrder", func(id string) error { return s.ExpireOrder(ctx, id, later) },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderPaid: func(o imagestore.Order) imagestore.Order {
					o.State, o.EndedAt = imagestore.OrderExpired, later
					return o
				},
				imagestore.OrderActive: func(o imagestore.Order) imagestore.Order {
					o.State, o.EndedAt = imagestore.OrderExpired, later
					return o
				},
			},
			[]imagestore.OrderState{imagestore.OrderExpired}},
		{"SetCheckout", func(id string) error { return s.SetCheckout(ctx, id, "cs_new", "https://checkout.example/new") },
			map[imagestore.OrderState]func(imagestore.Order) imagestore.Order{
				imagestore.OrderAwaitingPayment: func(o imagestore.Order) imagestore.Order {
					o.CheckoutID, o.CheckoutURL = "cs_new", "https://checkout.example/new"
					return o
				},
			}, nil},
	}
	for _, op := range ops {
		for _, from := range imagestore.OrderStates {
			t.Run(op.name+" from "+string(from), func(t *testing.T) {
				o := orderIn(t, from)
				err := op.call(o.ID)
				want := o
				switch change, ok := op.from[from]; {
				case ok:
					must(t, op.name, err)
					want = change(o)
				case slices.Contains(op.left, from):
					must(t, op.name+" (left as it is)", err)
				default:
					wantErr(t, op.name, err, imagestore.ErrOrderState)
				}
				checkOrder(t, "Order after "+op.name, getOrder(t, s, o.ID), want)
				// Applying it again changes nothing more.
				if err := op.call(o.ID); err != nil && !errors.Is(err, imagestore.ErrOrderState) {
					t.Errorf("%s again: %v", op.name, err)
				}
				if op.name != "SetCheckout" {
					checkOrder(t, "Order after "+op.name+" again", getOrder(t, s, o.ID), want)
				}
			})
		}
		t.Run(op.name+" unknown", func(t *testing.T) {
			wantErr(t, op.name, op.call("unknown"), imagestore.ErrNotFound)
		})
	}

	// An order's month is over at its ExpiresAt, not before.
	t.Run("ExpireOrder before the month is over", func(t *testing.T) {
		o := orderIn(t, imagestore.OrderActive)
		wantErr(t, "ExpireOrder early", s.ExpireOrder(ctx, o.ID, month.Add(-time.Nanosecond)), imagestore.ErrOrderState)
		checkOrder(t, "Order after an early ExpireOrder", getOrder(t, s, o.ID), o)
		must(t, "ExpireOrder at ExpiresAt", s.ExpireOrder(ctx, o.ID, month))
		o.State, o.EndedAt = imagestore.OrderExpired, month
		checkOrder(t, "Order after ExpireOrder", getOrder(t, s, o.ID), o)
	})
	// A cancelled order keeps its first reason and time.
	t.Run("CancelOrder keeps the first reason", func(t *testing.T) {
		o := orderIn(t, imagestore.OrderCancelled)
		must(t, "CancelOrder again", s.CancelOrder(ctx, o.ID, "paymentFailed", later))
		checkOrder(t, "Order after a second cancel", getOrder(t, s, o.ID), o)
	})
}

// testOrderTimeRoundTrip: every time of an order survives the store to the
// nanosecond, whatever zone it was given in, and comes back in UTC.
func testOrderTimeRoundTrip(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	zone := time.FixedZone("UTC+05:45", 5*3600+45*60)
	created := time.Date(2029, 12, 31, 23, 59, 59, 987654321, zone)
	o := orderOf(l, h, buyer, "o1", 1, created)
	o.ReserveUntil = created.Add(31*time.Minute + 7)
	want := placeOrder(t, s, o, "")
	checkOrder(t, "Order", getOrder(t, s, "o1"), want)

	paid := created.Add(time.Minute + 11).In(time.FixedZone("UTC-09:30", -(9*3600 + 30*60)))
	expires := paid.Add(30*24*time.Hour + 13)
	must(t, "PayOrder", payOrder(ctx, s, "o1", paid, expires))
	want.State, want.PaidAt, want.ExpiresAt = imagestore.OrderPaid, paid, expires
	checkOrder(t, "Order paid", getOrder(t, s, "o1"), want)
	ended := expires.Add(17).In(zone)
	must(t, "ExpireOrder", s.ExpireOrder(ctx, "o1", ended))
	want.State, want.EndedAt = imagestore.OrderExpired, ended
	checkOrder(t, "Order expired", getOrder(t, s, "o1"), want)

	c := placeOrder(t, s, orderOf(l, h, buyer, "o2", 1, created), "")
	cancelled := created.Add(19).In(zone)
	must(t, "CancelOrder", s.CancelOrder(ctx, "o2", "checkoutFailed", cancelled))
	c.State, c.Reason, c.EndedAt = imagestore.OrderCancelled, "checkoutFailed", cancelled
	checkOrder(t, "Order cancelled", getOrder(t, s, "o2"), c)

	// The listing's times too.
	closed := created.Add(23)
	must(t, "CloseListing", s.CloseListing(ctx, h.ID, "l1", closed))
	wantL := l
	wantL.ClosedAt = closed
	checkListing(t, "Listing", getListing(t, s, "l1"), wantL)
}

func testOrderQueries(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	l := newListing(t, s, h, "l1", 50, t0)
	// Placed out of order; two share a creation time.
	a2 := placeOrder(t, s, orderOf(l, h, a, "oa2", 1, t0.Add(time.Second)), "")
	a3 := placeOrder(t, s, orderOf(l, h, a, "oa3", 1, t0.Add(2*time.Second)), "")
	a1 := placeOrder(t, s, orderOf(l, h, a, "oa1", 1, t0.Add(time.Second)), "")
	a0 := placeOrder(t, s, orderOf(l, h, a, "oa0", 1, t0.Add(time.Nanosecond)), "")
	b1 := placeOrder(t, s, orderOf(l, h, b, "ob1", 2, t0), "")

	orders, err := s.Orders(ctx, a.ID)
	must(t, "Orders alpha", err)
	checkOrders(t, "Orders alpha (newest first)", orders, a3, a2, a1, a0)
	orders, err = s.Orders(ctx, b.ID)
	must(t, "Orders bravo", err)
	checkOrders(t, "Orders bravo", orders, b1)
	orders, err = s.Orders(ctx, h.ID)
	must(t, "Orders of the host", err)
	checkOrders(t, "Orders of the host (it bought nothing)", orders)

	must(t, "PayOrder oa1", payOrder(ctx, s, "oa1", t0, t0.Add(time.Hour)))
	a1.State, a1.PaidAt, a1.ExpiresAt = imagestore.OrderPaid, t0, t0.Add(time.Hour)
	must(t, "PayOrder ob1", payOrder(ctx, s, "ob1", t0, t0.Add(time.Hour)))
	b1.State, b1.PaidAt, b1.ExpiresAt = imagestore.OrderPaid, t0, t0.Add(time.Hour)

	orders, err = s.OrdersInState(ctx, imagestore.OrderAwaitingPayment)
	must(t, "OrdersInState awaitingPayment", err)
	checkOrders(t, "OrdersInState awaitingPayment (oldest first)", orders, a0, a2, a3)
	orders, err = s.OrdersInState(ctx, imagestore.OrderPaid)
	must(t, "OrdersInState paid", err)
	checkOrders(t, "OrdersInState paid", orders, b1, a1)
	for _, st := range []imagestore.OrderState{imagestore.OrderActive, imagestore.OrderExpired, imagestore.OrderCancelled} {
		orders, err = s.OrdersInState(ctx, st)
		must(t, "OrdersInState "+string(st), err)
		checkOrders(t, "OrdersInState "+string(st), orders)
	}
	_, err = s.Order(ctx, "unknown")
	wantErr(t, "Order unknown", err, imagestore.ErrNotFound)
}

func testOverdueOrders(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	place := func(id string, created, reserveUntil time.Time) imagestore.Order {
		o := orderOf(l, h, buyer, id, 1, created)
		o.ReserveUntil = reserveUntil
		return placeOrder(t, s, o, "")
	}
	h1 := t0.Add(time.Hour)
	// Oldest by creation, not by deadline.
	late := place("late", t0.Add(time.Second), h1)
	early := place("early", t0, h1.Add(time.Hour))
	soon := place("soon", t0.Add(2*time.Second), h1.Add(-time.Nanosecond))
	// Past their deadlines, but no longer awaiting payment.
	place("paid", t0, t0)
	must(t, "PayOrder", payOrder(ctx, s, "paid", t0, t0.Add(time.Hour)))
	place("cancelled", t0, t0)
	must(t, "CancelOrder", s.CancelOrder(ctx, "cancelled", "checkoutExpired", t0))

	steps := []struct {
		name string
		now  time.Time
		want []imagestore.Order
	}{
		{"none due", t0, nil},
		{"one nanosecond before the hour", h1.Add(-2 * time.Nanosecond), nil},
		{"soon at its deadline", h1.Add(-time.Nanosecond), []imagestore.Order{soon}},
		{"late at its deadline", h1, []imagestore.Order{late, soon}},
		{"all", h1.Add(time.Hour), []imagestore.Order{early, late, soon}},
	}
	for _, st := range steps {
		orders, err := s.OverdueOrders(ctx, st.now)
		must(t, "OverdueOrders "+st.name, err)
		checkOrders(t, "OverdueOrders "+st.name, orders, st.want...)
	}
	// Cancelled by the sweeper, an order is no longer overdue.
	must(t, "CancelOrder soon", s.CancelOrder(ctx, "soon", "checkoutExpired", h1))
	orders, err := s.OverdueOrders(ctx, h1.Add(time.Hour))
	must(t, "OverdueOrders after a cancel", err)
	checkOrders(t, "OverdueOrders after a cancel", orders, early, late)
}

func testOrderCounts(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	check := func(when string, want map[imagestore.OrderState]int64) {
		t.Helper()
		got, err := s.OrderCounts(ctx)
		must(t, "OrderCounts "+when, err)
		if len(got) != len(imagestore.OrderStates) {
			t.Errorf("OrderCounts %s has %d states, want all %d: %v", when, len(got), len(imagestore.OrderStates), got)
		}
		for _, st := range imagestore.OrderStates {
			if n, ok := got[st]; !ok || n != want[st] {
				t.Errorf("OrderCounts %s [%s] = %d (present %v), want %d", when, st, n, ok, want[st])
			}
		}
	}
	check("empty", nil)
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	month := t0.Add(30 * 24 * time.Hour)
	for i := range 9 {
		placeOrder(t, s, orderOf(l, h, buyer, fmt.Sprintf("o%d", i), 1, t0), "")
	}
	check("nine awaiting", map[imagestore.OrderState]int64{imagestore.OrderAwaitingPayment: 9})
	for _, id := range []string{"o0", "o1", "o2", "o3", "o4", "o5"} {
		must(t, "PayOrder "+id, payOrder(ctx, s, id, t0, month))
	}
	for _, id := range []string{"o1", "o2", "o3"} {
		must(t, "MarkOrderActive "+id, s.MarkOrderActive(ctx, id))
	}
	for _, id := range []string{"o3", "o4"} {
		must(t, "ExpireOrder "+id, s.ExpireOrder(ctx, id, month))
	}
	must(t, "CancelOrder o8", s.CancelOrder(ctx, "o8", "paymentFailed", t0))
	check("every state", map[imagestore.OrderState]int64{
		imagestore.OrderAwaitingPayment: 2, // o6, o7
		imagestore.OrderPaid:            2, // o0, o5
		imagestore.OrderActive:          2, // o1, o2
		imagestore.OrderExpired:         2, // o3, o4
		imagestore.OrderCancelled:       1, // o8
	})
}

// testOrderUserData: the user data is written with the order, read back
// only through OrderUserData, and carried by no field of anything else the
// store returns.
func testOrderUserData(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 10, t0)
	const secret = "#cloud-config\npassword: s3cr3t-user-data\n"
	placeOrder(t, s, orderOf(l, h, buyer, "o1", 1, t0), secret)
	placeOrder(t, s, orderOf(l, h, buyer, "o2", 1, t0), "")

	ud, err := s.OrderUserData(ctx, "o1")
	must(t, "OrderUserData", err)
	if ud != secret {
		t.Errorf("OrderUserData = %q, want %q", ud, secret)
	}
	ud, err = s.OrderUserData(ctx, "o2")
	must(t, "OrderUserData of an order without", err)
	if ud != "" {
		t.Errorf("OrderUserData of an order without = %q, want empty", ud)
	}
	_, err = s.OrderUserData(ctx, "unknown")
	wantErr(t, "OrderUserData unknown", err, imagestore.ErrNotFound)

	// Through every state and every read, no string field holds it.
	carries := func(op string, v any) {
		t.Helper()
		rv := reflect.ValueOf(v)
		for i := range rv.NumField() {
			if f := rv.Field(i); f.Kind() == reflect.String && strings.Contains(f.String(), "s3cr3t") {
				t.Errorf("%s: %s carries the user data", op, rv.Type().Field(i).Name)
			}
		}
	}
	reads := func(when string) {
		t.Helper()
		carries(when+": Order", getOrder(t, s, "o1"))
		orders, err := s.Orders(ctx, buyer.ID)
		must(t, "Orders", err)
		for _, o := range orders {
			carries(when+": Orders", o)
		}
		for _, st := range imagestore.OrderStates {
			orders, err := s.OrdersInState(ctx, st)
			must(t, "OrdersInState", err)
			for _, o := range orders {
				carries(when+": OrdersInState", o)
			}
		}
		orders, err = s.OverdueOrders(ctx, t0.Add(24*time.Hour))
		must(t, "OverdueOrders", err)
		for _, o := range orders {
			carries(when+": OverdueOrders", o)
		}
		carries(when+": Listing", getListing(t, s, "l1"))
	}
	reads("awaiting payment")
	must(t, "PayOrder", payOrder(ctx, s, "o1", t0, t0.Add(time.Hour)))
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, "o1"))
	reads("active")
	ud, err = s.OrderUserData(ctx, "o1")
	must(t, "OrderUserData after the state changes", err)
	if ud != secret {
		t.Errorf("OrderUserData after the state changes = %q, want %q", ud, secret)
	}
}

// testRemoveImageInUse: an upload that an order holding capacity runs
// cannot be removed; once the order ends, it can.
func testRemoveImageInUse(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	stranger := newTenant(t, s, "stranger")
	l := newListing(t, s, h, "l1", 50, t0)
	month := t0.Add(30 * 24 * time.Hour)
	exp := t0.Add(time.Hour)

	n := 0
	// useImage stores an image with a fetch token and an order of it in
	// state.
	useImage := func(t *testing.T, state imagestore.OrderState) (imagestore.Image, imagestore.Order) {
		t.Helper()
		n++
		img := newImage(t, s, buyer.ID, uploadID(n), t0, 100)
		must(t, "CreateFetchToken", s.CreateFetchToken(ctx, hash(img.UploadID), imagestore.FetchToken{UploadID: img.UploadID, OrderID: "o", ExpiresAt: exp}))
		o := orderOf(l, h, buyer, fmt.Sprintf("o%d", n), 1, t0)
		o.ImageKind, o.Image = imagestore.ImageUpload, img.UploadID
		placeOrder(t, s, o, "")
		switch state {
		case imagestore.OrderPaid, imagestore.OrderActive, imagestore.OrderExpired,
			imagestore.OrderRefunding, imagestore.OrderRefunded, imagestore.OrderRefundFailed:
			must(t, "PayOrder", payOrder(ctx, s, o.ID, t0, month))
		case imagestore.OrderCancelled:
			must(t, "CancelOrder", s.CancelOrder(ctx, o.ID, "checkoutExpired", t0))
		}
		if state == imagestore.OrderActive || state == imagestore.OrderExpired {
			must(t, "MarkOrderActive", s.MarkOrderActive(ctx, o.ID))
		}
		if state == imagestore.OrderExpired {
			must(t, "ExpireOrder", s.ExpireOrder(ctx, o.ID, month))
		}
		if state.Refunded() {
			o := stored(o)
			o.State = imagestore.OrderPaid
			refundTo(t, s, &o, state, t0)
		}
		return img, o
	}
	for _, st := range imagestore.OrderStates {
		t.Run(string(st), func(t *testing.T) {
			img, _ := useImage(t, st)
			// Another tenant learns nothing, in use or not.
			wantErr(t, "RemoveImage by another tenant", s.RemoveImage(ctx, stranger.ID, img.UploadID), imagestore.ErrNotFound)
			err := s.RemoveImage(ctx, buyer.ID, img.UploadID)
			if !st.Holds() {
				must(t, "RemoveImage of an image whose order ended", err)
				_, err := s.Image(ctx, img.UploadID)
				wantErr(t, "Image after RemoveImage", err, imagestore.ErrNotFound)
				return
			}
			wantErr(t, "RemoveImage of an image in use", err, imagestore.ErrInUse)
			// Refused in one transaction: the image and its token stay.
			got, err := s.Image(ctx, img.UploadID)
			must(t, "Image after a refused remove", err)
			checkImage(t, "Image after a refused remove", got, img)
			got, _, err = s.ImageForToken(ctx, hash(img.UploadID), t0)
			must(t, "ImageForToken after a refused remove", err)
			checkImage(t, "ImageForToken after a refused remove", got, img)
		})
	}
	t.Run("free once the order is cancelled", func(t *testing.T) {
		img, o := useImage(t, imagestore.OrderAwaitingPayment)
		wantErr(t, "RemoveImage", s.RemoveImage(ctx, buyer.ID, img.UploadID), imagestore.ErrInUse)
		must(t, "CancelOrder", s.CancelOrder(ctx, o.ID, "checkoutExpired", t0))
		must(t, "RemoveImage after the cancel", s.RemoveImage(ctx, buyer.ID, img.UploadID))
		// And a removed image cannot be ordered.
		o2 := orderOf(l, h, buyer, "after-remove", 1, t0)
		o2.ImageKind, o2.Image = imagestore.ImageUpload, img.UploadID
		wantErr(t, "CreateOrder of a removed image", s.CreateOrder(ctx, o2, "", 0), imagestore.ErrNotFound)
	})
	t.Run("a catalogue order does not hold an upload", func(t *testing.T) {
		n++
		img := newImage(t, s, buyer.ID, uploadID(n), t0, 100)
		o := orderOf(l, h, buyer, "catalogue", 1, t0)
		o.Image = img.UploadID // a catalogue id that happens to look alike
		placeOrder(t, s, o, "")
		must(t, "RemoveImage", s.RemoveImage(ctx, buyer.ID, img.UploadID))
	})
}

func testWebhookEvents(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	seen := func(id string, want bool) {
		t.Helper()
		got, err := s.WebhookEventSeen(ctx, id)
		must(t, "WebhookEventSeen "+id, err)
		if got != want {
			t.Errorf("WebhookEventSeen %s = %v, want %v", id, got, want)
		}
	}
	seen("evt_1", false)
	must(t, "RecordWebhookEvent", s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: "evt_1", Type: "checkout.session.completed", Result: "paid", At: t0}))
	seen("evt_1", true)
	seen("evt_2", false)
	// A replay is not an error.
	must(t, "RecordWebhookEvent again", s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: "evt_1", Type: "checkout.session.completed", Result: "replayed", At: t0.Add(time.Hour)}))
	seen("evt_1", true)
	must(t, "RecordWebhookEvent without At", s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: "evt_2", Type: "checkout.session.expired", Result: "cancelled"}))
	seen("evt_2", true)
	if err := s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{Type: "x", Result: "y", At: t0}); err == nil {
		t.Error("RecordWebhookEvent without an id succeeded")
	}
}

// testCreateOrderUnpaidLimit: a buyer's orders awaiting payment never
// pass CreateOrder's limit, even when they are placed at once; a paid or
// cancelled order no longer counts, and another buyer has a limit of its
// own.
func testCreateOrderUnpaidLimit(t *testing.T, s imagestore.Store) {
	const limit, n = 2, 12
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer, other := newTenant(t, s, "b0"), newTenant(t, s, "b1")
	l := newListing(t, s, h, "l1", 100, t0)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		o := orderOf(l, h, buyer, fmt.Sprintf("u%02d", i), 1, t0.Add(time.Duration(i)))
		wg.Go(func() {
			<-start
			errs[i] = s.CreateOrder(t.Context(), o, "", limit)
		})
	}
	close(start)
	wg.Wait()
	placed := 0
	for i, err := range errs {
		switch {
		case err == nil:
			placed++
		case !errors.Is(err, imagestore.ErrTooManyUnpaid):
			t.Errorf("order %d: %v, want nil or ErrTooManyUnpaid", i, err)
		}
	}
	if placed != limit {
		t.Fatalf("%d orders awaiting payment placed at once at a limit of %d", placed, limit)
	}
	must(t, "CreateOrder of another buyer", s.CreateOrder(ctx, orderOf(l, h, other, "v1", 1, t0), "", limit))
	wantErr(t, "CreateOrder beyond the limit", s.CreateOrder(ctx, orderOf(l, h, buyer, "u99", 1, t0), "", limit), imagestore.ErrTooManyUnpaid)
	must(t, "CreateOrder without a limit", s.CreateOrder(ctx, orderOf(l, h, buyer, "u98", 1, t0), "", 0))
	// Cancelling two of the three brings the buyer under the limit again.
	orders, err := s.Orders(ctx, buyer.ID)
	must(t, "Orders", err)
	for _, o := range orders[:2] {
		must(t, "CancelOrder", s.CancelOrder(ctx, o.ID, "checkoutExpired", t0.Add(time.Minute)))
	}
	must(t, "CreateOrder after cancelling", s.CreateOrder(ctx, orderOf(l, h, buyer, "u97", 1, t0), "", limit))
}

// testPayOrderOnce: of concurrent PayOrder calls for one order exactly one
// says it moved the order; later calls, on a paid, active or expired
// order, say it did not; a cancelled order is ErrOrderState.
func testPayOrderOnce(t *testing.T, s imagestore.Store) {
	const n = 10
	ctx := t.Context()
	h := newHost(t, s, "host")
	b := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := placeOrder(t, s, orderOf(l, h, b, "o1", 1, t0), "")
	month := t0.Add(30 * 24 * time.Hour)
	start := make(chan struct{})
	moved := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			moved[i], errs[i] = s.PayOrder(ctx, o.ID, t0, month)
		})
	}
	close(start)
	wg.Wait()
	count := 0
	for i := range n {
		must(t, "PayOrder", errs[i])
		if moved[i] {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d of %d concurrent PayOrder calls moved the order, want exactly 1", count, n)
	}
	if m, err := s.PayOrder(ctx, o.ID, t0, month); err != nil || m {
		t.Errorf("PayOrder on a paid order = %v, %v; want false, nil", m, err)
	}
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, o.ID))
	if m, err := s.PayOrder(ctx, o.ID, t0, month); err != nil || m {
		t.Errorf("PayOrder on an active order = %v, %v; want false, nil", m, err)
	}
	c := placeOrder(t, s, orderOf(l, h, b, "o2", 1, t0), "")
	must(t, "CancelOrder", s.CancelOrder(ctx, c.ID, "checkoutExpired", t0))
	if m, err := s.PayOrder(ctx, c.ID, t0, month); !errors.Is(err, imagestore.ErrOrderState) || m {
		t.Errorf("PayOrder on a cancelled order = %v, %v; want false, ErrOrderState", m, err)
	}
}

// testCancelOwnOrder: only its buyer cancels an order awaiting payment;
// to the host and every other tenant it is unknown, and stays as it was.
// The cancel gives the capacity back at once, and the order can be paid
// no more; a second cancel is refused like a cancel of a paid order.
func testCancelOwnOrder(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer, other := newTenant(t, s, "buyer"), newTenant(t, s, "other")
	l := newListing(t, s, h, "l1", 5, t0)
	o := placeOrder(t, s, orderOf(l, h, buyer, "o1", 3, t0), "")
	month := t0.Add(30 * 24 * time.Hour)
	for _, who := range []imagestore.Tenant{other, h} {
		wantErr(t, "CancelOwnOrder by "+who.Name, s.CancelOwnOrder(ctx, who.ID, o.ID, "buyerCancelled", t0), imagestore.ErrNotFound)
	}
	checkOrder(t, "Order after others' cancels", getOrder(t, s, o.ID), o)
	if got := getListing(t, s, l.ID); got.Reserved != 3 || got.Free() != 2 {
		t.Fatalf("after others' cancels the listing has %d reserved, %d free; want 3, 2", got.Reserved, got.Free())
	}
	wantErr(t, "CancelOwnOrder of an unknown order", s.CancelOwnOrder(ctx, buyer.ID, "o9", "buyerCancelled", t0), imagestore.ErrNotFound)

	at := t0.Add(time.Minute)
	must(t, "CancelOwnOrder", s.CancelOwnOrder(ctx, buyer.ID, o.ID, "buyerCancelled", at))
	o.State, o.Reason, o.EndedAt = imagestore.OrderCancelled, "buyerCancelled", at
	checkOrder(t, "Order after its buyer's cancel", getOrder(t, s, o.ID), o)
	if got := getListing(t, s, l.ID); got.Reserved != 0 || got.Free() != 5 {
		t.Errorf("after the cancel the listing has %d reserved, %d free; want 0, 5", got.Reserved, got.Free())
	}
	wantErr(t, "CancelOwnOrder again", s.CancelOwnOrder(ctx, buyer.ID, o.ID, "buyerCancelled", at), imagestore.ErrOrderState)
	wantErr(t, "PayOrder after the cancel", payOrder(ctx, s, o.ID, at, month), imagestore.ErrOrderState)
	checkOrder(t, "Order after a cancel and a payment", getOrder(t, s, o.ID), o)
}

// testCancelRacesPayment: a buyer's cancel and the payment of the same
// order, started together, many times over: exactly one of them applies
// to each order, the other is ErrOrderState, and the listing counts
// exactly the orders that were paid. A store that reads the state and
// writes it in two steps lets both through (a paid order cancelled, its
// capacity given away twice).
func testCancelRacesPayment(t *testing.T, s imagestore.Store) {
	const n = 12
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", n, t0)
	month := t0.Add(30 * 24 * time.Hour)
	var orders []imagestore.Order
	for i := range n {
		orders = append(orders, placeOrder(t, s, orderOf(l, h, buyer, fmt.Sprintf("o%02d", i), 1, t0), ""))
	}
	start := make(chan struct{})
	cancelErrs, payErrs := make([]error, n), make([]error, n)
	moved := make([]bool, n)
	var wg sync.WaitGroup
	for i, o := range orders {
		wg.Go(func() {
			<-start
			cancelErrs[i] = s.CancelOwnOrder(ctx, buyer.ID, o.ID, "buyerCancelled", t0)
		})
		wg.Go(func() {
			<-start
			moved[i], payErrs[i] = s.PayOrder(ctx, o.ID, t0, month)
		})
	}
	close(start)
	wg.Wait()
	paid := 0
	for i, o := range orders {
		got := getOrder(t, s, o.ID)
		switch {
		case cancelErrs[i] == nil && errors.Is(payErrs[i], imagestore.ErrOrderState) && !moved[i]:
			if got.State != imagestore.OrderCancelled {
				t.Errorf("order %s: the cancel won, but the order is %s", o.ID, got.State)
			}
		case payErrs[i] == nil && moved[i] && errors.Is(cancelErrs[i], imagestore.ErrOrderState):
			paid++
			if got.State != imagestore.OrderPaid {
				t.Errorf("order %s: the payment won, but the order is %s", o.ID, got.State)
			}
		default:
			t.Errorf("order %s: cancel %v, payment moved %v with %v; want exactly one to apply and the other ErrOrderState",
				o.ID, cancelErrs[i], moved[i], payErrs[i])
		}
	}
	if got := getListing(t, s, l.ID); got.Reserved != 0 || got.Running != paid {
		t.Errorf("listing after the races: %d reserved, %d running; want 0 and the %d paid", got.Reserved, got.Running, paid)
	}
}
