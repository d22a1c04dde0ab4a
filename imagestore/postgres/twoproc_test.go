package postgres_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// procs is how many replicas each race runs: two, the smallest scale-out
// asks, is the smallest number where cross-process races exist.
const procs = 2

// TestMigrateTogether: replicas starting together on an empty database
// each open it, and the schema is applied once.
func TestMigrateTogether(t *testing.T) {
	url := cluster.NewDatabase(t)
	race(t, url, "migrate", "", 4)
	s := open(t, url)
	defer s.Close()
	if err := s.Verify(t.Context()); err != nil {
		t.Fatalf("Verify after racing migrations: %v", err)
	}
}

// TestConsumeTicketAcrossProcesses: every ticket is won by exactly one of
// the processes racing for all of them; the others hear ErrTicketUsed.
func TestConsumeTicketAcrossProcesses(t *testing.T) {
	const tickets = 60
	url := cluster.NewDatabase(t)
	s := open(t, url)
	defer s.Close()
	tn, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "box"}, imagestore.HashSecret("box"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range tickets {
		key := fmt.Sprintf("ticket-%d", i)
		tk := imagestore.Ticket{UploadID: fmt.Sprintf("%024x", i), TenantID: tn.ID, Name: key, ExpiresAt: time.Now().Add(time.Hour)}
		if err := s.CreateTicket(t.Context(), tk, imagestore.HashSecret(key), 0); err != nil {
			t.Fatal(err)
		}
	}
	outs := race(t, url, "consume", fmt.Sprint(tickets), procs)
	var won []string
	refused := 0
	for _, o := range outs {
		won = append(won, o.Won...)
		refused += o.Refused
	}
	slices.Sort(won)
	if n := len(slices.Compact(slices.Clone(won))); n != len(won) {
		t.Errorf("%d tickets were used twice", len(won)-n)
	}
	if len(won) != tickets || refused != tickets*(procs-1) {
		t.Errorf("%d tickets used, %d refused as used; want %d and %d", len(won), refused, tickets, tickets*(procs-1))
	}
}

// TestQuotaAcrossProcesses: tickets requested by two processes at once
// never take a tenant past its quota, and reach it.
func TestQuotaAcrossProcesses(t *testing.T) {
	url := cluster.NewDatabase(t)
	s := open(t, url)
	defer s.Close()
	if _, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "quota"}, imagestore.HashSecret("quota")); err != nil {
		t.Fatal(err)
	}
	outs := race(t, url, "tickets", fmt.Sprint(quota), procs)
	got := 0
	for _, o := range outs {
		got += len(o.Won)
	}
	if got != quota {
		t.Errorf("%d tickets issued at a quota of %d", got, quota)
	}
}

// TestCapacityAcrossProcesses: orders placed by two processes at once
// never book a listing past its capacity, and fill it.
func TestCapacityAcrossProcesses(t *testing.T) {
	const capacity = 7
	url := cluster.NewDatabase(t)
	s := open(t, url)
	defer s.Close()
	host, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "host", HostsVMs: true, StripeAccount: hostAccount}, imagestore.HashSecret("host"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "buyer"}, imagestore.HashSecret("buyer")); err != nil {
		t.Fatal(err)
	}
	l, err := s.CreateListing(t.Context(), imagestore.Listing{ID: imagestore.NewListingID(), HostID: host.ID, UnitPrice: 500, Currency: "eur", Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	outs := race(t, url, "orders", l.ID, procs)
	booked := 0
	for _, o := range outs {
		booked += len(o.Won)
	}
	got, err := s.Listing(t.Context(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if booked != capacity || got.Reserved != capacity {
		t.Errorf("%d orders placed, listing reserves %d; want both %d", booked, got.Reserved, capacity)
	}
}

// TestLeaseAcrossProcesses: processes racing AcquireLease on one name
// with holders of their own: exactly one holder wins each round, and the
// tokens strictly increase over the rounds (round r's is r+1).
func TestLeaseAcrossProcesses(t *testing.T) {
	const rounds = 20
	url := cluster.NewDatabase(t)
	outs := race(t, url, "lease", fmt.Sprint(rounds), procs)
	tokens := make(map[int][]int64)
	refused := 0
	for _, o := range outs {
		for _, w := range o.Won {
			var r int
			var tok int64
			if _, err := fmt.Sscanf(w, "%d:%d", &r, &tok); err != nil {
				t.Fatalf("outcome %q: %v", w, err)
			}
			tokens[r] = append(tokens[r], tok)
		}
		refused += o.Refused
	}
	last := int64(0)
	for r := range rounds {
		if len(tokens[r]) != 1 {
			t.Fatalf("round %d: %d winners (tokens %v), want 1", r, len(tokens[r]), tokens[r])
		}
		if tok := tokens[r][0]; tok <= last || tok != int64(r+1) {
			t.Errorf("round %d: token %d after %d, want %d", r, tok, last, r+1)
		}
		last = tokens[r][0]
	}
	if want := rounds * (procs*workers - 1); refused != want {
		t.Errorf("%d attempts refused as held, want %d", refused, want)
	}
}
