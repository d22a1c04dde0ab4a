package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// testConsoleTickets: a console ticket is the buyer's, used once, refused
// once expired, and of concurrent uses exactly one gets it.
func testConsoleTickets(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := paidOrder(t, s, l, h, b, "o1", 2)
	ct := imagestore.ConsoleTicket{TenantID: b.ID, OrderID: o.ID, Replica: 1, Kind: imagestore.ConsoleSerial,
		CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
	must(t, "CreateConsoleTicket", s.CreateConsoleTicket(ctx, hash("c1"), ct))
	if err := s.CreateConsoleTicket(ctx, hash("c2"), imagestore.ConsoleTicket{TenantID: h.ID, OrderID: o.ID,
		Kind: imagestore.ConsoleVNC, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("a ticket for the host of the order: %v, want ErrNotFound (only its buyer)", err)
	}
	if err := s.CreateConsoleTicket(ctx, hash("c3"), imagestore.ConsoleTicket{TenantID: b.ID, OrderID: o.ID,
		Kind: "ssh", CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}); err == nil {
		t.Error("a ticket of an unknown kind was stored")
	}
	// Exactly at its expiry it is gone; a nanosecond before, it works.
	if _, err := s.ConsumeConsoleTicket(ctx, hash("c1"), t0.Add(time.Minute)); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("a ticket at its expiry: %v, want ErrNotFound", err)
	}
	got, err := s.ConsumeConsoleTicket(ctx, hash("c1"), t0.Add(time.Minute-time.Nanosecond))
	if err != nil || got.TenantID != b.ID || got.OrderID != o.ID || got.Replica != 1 || got.Kind != imagestore.ConsoleSerial ||
		!got.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("ConsumeConsoleTicket = %+v, %v", got, err)
	}
	if _, err := s.ConsumeConsoleTicket(ctx, hash("c1"), t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("a used ticket: %v, want ErrNotFound", err)
	}
	if _, err := s.ConsumeConsoleTicket(ctx, hash("none"), t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("an unknown ticket: %v, want ErrNotFound", err)
	}

	const n = 8
	must(t, "CreateConsoleTicket", s.CreateConsoleTicket(ctx, hash("race"), ct))
	start := make(chan struct{})
	wins := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			_, err := s.ConsumeConsoleTicket(ctx, hash("race"), t0)
			wins[i] = err == nil
			if err != nil && !errors.Is(err, imagestore.ErrNotFound) {
				t.Errorf("ConsumeConsoleTicket: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	count := 0
	for _, w := range wins {
		if w {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d of %d concurrent uses got the ticket, want exactly 1", count, n)
	}
}
