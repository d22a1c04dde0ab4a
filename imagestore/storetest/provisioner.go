package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The provisioner's records: an order's note, its replica states and the
// revocation of its fetch tokens.

// paidOrder places an order of quantity replicas and pays it at t0 for a
// month.
func paidOrder(t *testing.T, s imagestore.Store, l imagestore.Listing, host, buyer imagestore.Tenant, id string, quantity int) imagestore.Order {
	t.Helper()
	o := placeOrder(t, s, orderOf(l, host, buyer, id, quantity, t0), "")
	month := t0.Add(30 * 24 * time.Hour)
	must(t, "PayOrder "+id, payOrder(t.Context(), s, id, t0, month))
	o.State, o.PaidAt, o.ExpiresAt = imagestore.OrderPaid, t0, month
	return o
}

// testOrderNote: a note is empty on a new order, set and cleared in any
// state, read back by every query that returns orders, and leaves the
// rest of the order alone.
func testOrderNote(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	o := paidOrder(t, s, l, h, buyer, "o1", 2)
	other := paidOrder(t, s, l, h, buyer, "o2", 1)
	checkOrder(t, "new order", getOrder(t, s, "o1"), o)

	// Any text, newlines and non-ASCII included, round trips.
	const note = "the cluster cannot be reached: dial tcp 127.0.0.1:6443: connect: connection refused\nnächster Versuch"
	must(t, "SetOrderNote", s.SetOrderNote(ctx, "o1", note))
	o.Note = note
	checkOrder(t, "Order", getOrder(t, s, "o1"), o)
	checkOrder(t, "the other order", getOrder(t, s, "o2"), other)
	orders, err := s.Orders(ctx, buyer.ID)
	must(t, "Orders", err)
	checkOrders(t, "Orders", orders, other, o) // same creation time: by id, descending
	orders, err = s.OrdersInState(ctx, imagestore.OrderPaid)
	must(t, "OrdersInState", err)
	checkOrders(t, "OrdersInState", orders, o, other)

	// A state change keeps the note; the provisioner clears it.
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, "o1"))
	o.State = imagestore.OrderActive
	checkOrder(t, "Order after MarkOrderActive", getOrder(t, s, "o1"), o)
	must(t, "SetOrderNote again", s.SetOrderNote(ctx, "o1", "another"))
	o.Note = "another"
	checkOrder(t, "Order after a second note", getOrder(t, s, "o1"), o)
	must(t, "SetOrderNote clear", s.SetOrderNote(ctx, "o1", ""))
	o.Note = ""
	checkOrder(t, "Order after clearing", getOrder(t, s, "o1"), o)

	// In every state.
	for _, st := range imagestore.OrderStates {
		t.Run(string(st), func(t *testing.T) {
			id := "state-" + string(st)
			x := placeOrder(t, s, orderOf(l, h, buyer, id, 1, t0), "")
			switch st {
			case imagestore.OrderPaid, imagestore.OrderActive, imagestore.OrderExpired:
				must(t, "PayOrder", payOrder(ctx, s, id, t0, t0.Add(time.Hour)))
				x.State, x.PaidAt, x.ExpiresAt = imagestore.OrderPaid, t0, t0.Add(time.Hour)
			case imagestore.OrderCancelled:
				must(t, "CancelOrder", s.CancelOrder(ctx, id, "checkoutExpired", t0))
				x.State, x.Reason, x.EndedAt = imagestore.OrderCancelled, "checkoutExpired", t0
			}
			if st == imagestore.OrderActive || st == imagestore.OrderExpired {
				must(t, "MarkOrderActive", s.MarkOrderActive(ctx, id))
				x.State = imagestore.OrderActive
			}
			if st == imagestore.OrderExpired {
				must(t, "ExpireOrder", s.ExpireOrder(ctx, id, t0.Add(time.Hour)))
				x.State, x.EndedAt = imagestore.OrderExpired, t0.Add(time.Hour)
			}
			must(t, "SetOrderNote", s.SetOrderNote(ctx, id, "note in "+string(st)))
			x.Note = "note in " + string(st)
			checkOrder(t, "Order", getOrder(t, s, id), x)
		})
	}
	wantErr(t, "SetOrderNote unknown", s.SetOrderNote(ctx, "unknown", "x"), imagestore.ErrNotFound)
}

func checkReplicaStates(t *testing.T, op string, got []imagestore.ReplicaState, want ...imagestore.ReplicaState) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d replica states %+v, want %d %+v", op, len(got), got, len(want), want)
	}
	for i := range got {
		if d := timeDiff("ObservedAt", got[i].ObservedAt, want[i].ObservedAt); d != "" {
			t.Errorf("%s[%d]: %s", op, i, d)
		}
		g, w := got[i], want[i]
		g.ObservedAt, w.ObservedAt = time.Time{}, time.Time{}
		if g != w {
			t.Errorf("%s[%d]:\n got %+v\nwant %+v", op, i, g, w)
		}
	}
}

func getReplicaStates(t *testing.T, s imagestore.Store, id string) []imagestore.ReplicaState {
	t.Helper()
	states, err := s.ReplicaStates(t.Context(), id)
	must(t, "ReplicaStates "+id, err)
	return states
}

// testReplicaStates: a set replaces the one before, whole; states come
// back by index with their times to the nanosecond in UTC; one order's
// states are not another's.
func testReplicaStates(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	paidOrder(t, s, l, h, buyer, "o1", 3)
	paidOrder(t, s, l, h, buyer, "o2", 1)

	checkReplicaStates(t, "ReplicaStates of a new order", getReplicaStates(t, s, "o1"))
	zone := time.FixedZone("UTC+05:45", 5*3600+45*60)
	seen := time.Date(2031, 3, 4, 9, 10, 11, 987654321, zone)
	r0 := imagestore.ReplicaState{Index: 0, Name: "vm-o1-0", State: imagestore.ReplicaRunning, Detail: "Running", ObservedAt: seen}
	r1 := imagestore.ReplicaState{Index: 1, Name: "vm-o1-1", State: imagestore.ReplicaImporting, Detail: "ImportInProgress",
		Progress: "42.50%", ObservedAt: seen.Add(1)}
	r2 := imagestore.ReplicaState{Index: 2, Name: "vm-o1-2", State: imagestore.ReplicaFailed, Detail: "ErrImagePull", ObservedAt: seen.Add(2)}
	// Given out of order, returned by index.
	must(t, "SetReplicaStates", s.SetReplicaStates(ctx, "o1", []imagestore.ReplicaState{r2, r0, r1}))
	checkReplicaStates(t, "ReplicaStates", getReplicaStates(t, s, "o1"), r0, r1, r2)
	checkReplicaStates(t, "ReplicaStates of the other order", getReplicaStates(t, s, "o2"))

	o2 := imagestore.ReplicaState{Index: 0, Name: "vm-o2-0", State: imagestore.ReplicaStarting, Detail: "Provisioning", ObservedAt: seen}
	must(t, "SetReplicaStates o2", s.SetReplicaStates(ctx, "o2", []imagestore.ReplicaState{o2}))

	// A later set replaces the whole set: a replica left out is gone.
	r1.State, r1.Detail, r1.Progress, r1.ObservedAt = imagestore.ReplicaRunning, "Running", "", seen.Add(time.Minute)
	must(t, "SetReplicaStates again", s.SetReplicaStates(ctx, "o1", []imagestore.ReplicaState{r1}))
	checkReplicaStates(t, "ReplicaStates after a smaller set", getReplicaStates(t, s, "o1"), r1)
	checkReplicaStates(t, "ReplicaStates of o2 after o1 changed", getReplicaStates(t, s, "o2"), o2)
	must(t, "SetReplicaStates none", s.SetReplicaStates(ctx, "o1", nil))
	checkReplicaStates(t, "ReplicaStates after an empty set", getReplicaStates(t, s, "o1"))

	// Every state name is storable, and the states outlive a state
	// change of the order (expired replicas show as the provisioner last
	// saw them).
	var all []imagestore.ReplicaState
	paidOrder(t, s, l, h, buyer, "o6", len(imagestore.ReplicaStateNames))
	for i, name := range imagestore.ReplicaStateNames {
		all = append(all, imagestore.ReplicaState{Index: i, Name: fmt.Sprintf("vm-o6-%d", i), State: name, Detail: "d" + name, ObservedAt: seen})
	}
	must(t, "SetReplicaStates of every state", s.SetReplicaStates(ctx, "o6", all))
	must(t, "ExpireOrder", s.ExpireOrder(ctx, "o6", t0.Add(31*24*time.Hour)))
	checkReplicaStates(t, "ReplicaStates after ExpireOrder", getReplicaStates(t, s, "o6"), all...)

	_, err := s.ReplicaStates(ctx, "unknown")
	wantErr(t, "ReplicaStates unknown", err, imagestore.ErrNotFound)
	wantErr(t, "SetReplicaStates unknown", s.SetReplicaStates(ctx, "unknown", []imagestore.ReplicaState{o2}), imagestore.ErrNotFound)
}

// testReplicaStatesRefused: a set the order cannot have is an error and
// leaves the stored set as it was.
func testReplicaStatesRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	paidOrder(t, s, l, h, buyer, "o1", 2)
	good := imagestore.ReplicaState{Index: 0, Name: "vm-o1-0", State: imagestore.ReplicaRunning, Detail: "Running", ObservedAt: t0}
	must(t, "SetReplicaStates", s.SetReplicaStates(ctx, "o1", []imagestore.ReplicaState{good}))

	with := func(mod func(*imagestore.ReplicaState)) imagestore.ReplicaState {
		r := imagestore.ReplicaState{Index: 1, Name: "vm-o1-1", State: imagestore.ReplicaStarting, ObservedAt: t0}
		mod(&r)
		return r
	}
	tests := []struct {
		name   string
		states []imagestore.ReplicaState
	}{
		{"index past the quantity", []imagestore.ReplicaState{with(func(r *imagestore.ReplicaState) { r.Index = 2 })}},
		{"negative index", []imagestore.ReplicaState{with(func(r *imagestore.ReplicaState) { r.Index = -1 })}},
		{"repeated index", []imagestore.ReplicaState{with(func(*imagestore.ReplicaState) {}), with(func(*imagestore.ReplicaState) {})}},
		{"unknown state", []imagestore.ReplicaState{with(func(r *imagestore.ReplicaState) { r.State = "Running" })}},
		{"empty state", []imagestore.ReplicaState{with(func(r *imagestore.ReplicaState) { r.State = "" })}},
		{"zero time", []imagestore.ReplicaState{with(func(r *imagestore.ReplicaState) { r.ObservedAt = time.Time{} })}},
		// A good replica beside a bad one is not stored either.
		{"one good, one bad", []imagestore.ReplicaState{good, with(func(r *imagestore.ReplicaState) { r.Index = 5 })}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.SetReplicaStates(ctx, "o1", tc.states); err == nil {
				t.Errorf("SetReplicaStates %+v succeeded", tc.states)
			}
			checkReplicaStates(t, "ReplicaStates after a refused set", getReplicaStates(t, s, "o1"), good)
		})
	}
}

// testRevokeOrderTokens: an order's fetch tokens live through ExpireOrder
// and die at RevokeOrderTokens; other orders' and operators' tokens are
// untouched.
func testRevokeOrderTokens(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h := newHost(t, s, "host")
	buyer := newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 50, t0)
	img := newImage(t, s, buyer.ID, uploadID(1), t0, 100)
	month := t0.Add(30 * 24 * time.Hour)
	for _, o := range []string{"o1", "o2"} {
		x := orderOf(l, h, buyer, o, 1, t0)
		x.ImageKind, x.Image = imagestore.ImageUpload, img.UploadID
		placeOrder(t, s, x, "")
		must(t, "PayOrder "+o, payOrder(ctx, s, o, t0, month))
	}
	tokens := []struct{ secret, order string }{{"o1-a", "o1"}, {"o1-b", "o1"}, {"o2", "o2"}, {"operator", ""}}
	for _, tk := range tokens {
		must(t, "CreateFetchToken "+tk.secret, s.CreateFetchToken(ctx, hash(tk.secret),
			imagestore.FetchToken{UploadID: img.UploadID, OrderID: tk.order, ExpiresAt: month}))
	}
	valid := func(when string, want map[string]bool) {
		t.Helper()
		for _, tk := range tokens {
			got, _, err := s.ImageForToken(ctx, hash(tk.secret), month.Add(-time.Hour))
			switch {
			case want[tk.secret]:
				must(t, when+": ImageForToken "+tk.secret, err)
				checkImage(t, when+": ImageForToken "+tk.secret, got, img)
			default:
				wantErr(t, when+": ImageForToken "+tk.secret, err, imagestore.ErrNotFound)
			}
		}
	}
	all := map[string]bool{"o1-a": true, "o1-b": true, "o2": true, "operator": true}
	valid("before", all)

	// ExpireOrder halts nothing by itself and revokes nothing: the
	// provisioner revokes after halting.
	must(t, "ExpireOrder", s.ExpireOrder(ctx, "o1", month))
	valid("after ExpireOrder", all)

	n, err := s.RevokeOrderTokens(ctx, "o1", month)
	must(t, "RevokeOrderTokens o1", err)
	if n != 2 {
		t.Errorf("RevokeOrderTokens o1 = %d, want 2", n)
	}
	valid("after RevokeOrderTokens o1", map[string]bool{"o2": true, "operator": true})
	n, err = s.RevokeOrderTokens(ctx, "o1", month.Add(time.Hour))
	must(t, "RevokeOrderTokens o1 again", err)
	if n != 0 {
		t.Errorf("RevokeOrderTokens o1 again = %d, want 0", n)
	}
	n, err = s.RevokeOrderTokens(ctx, "unknown", month)
	must(t, "RevokeOrderTokens of an order without tokens", err)
	if n != 0 {
		t.Errorf("RevokeOrderTokens unknown = %d, want 0", n)
	}
	// An empty order id would name the operators' tokens.
	if _, err := s.RevokeOrderTokens(ctx, "", month); err == nil {
		t.Error("RevokeOrderTokens with an empty order id succeeded")
	}
	if _, err := s.RevokeOrderTokens(ctx, "o2", time.Time{}); err == nil {
		t.Error("RevokeOrderTokens at the zero time succeeded")
	}
	valid("after the refused revokes", map[string]bool{"o2": true, "operator": true})
	// A token made for an order after its revocation (a retried
	// provisioning) is live until revoked in its turn.
	must(t, "CreateFetchToken o1-c", s.CreateFetchToken(ctx, hash("o1-c"), imagestore.FetchToken{UploadID: img.UploadID, OrderID: "o1", ExpiresAt: month}))
	n, err = s.RevokeOrderTokens(ctx, "o1", month)
	must(t, "RevokeOrderTokens o1 third", err)
	if n != 1 {
		t.Errorf("RevokeOrderTokens o1 with one new token = %d, want 1", n)
	}
}
