package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// ticketTests are the suite's tests of listing and cancelling unused
// tickets.
var ticketTests = []struct {
	name string
	fn   func(t *testing.T, s imagestore.Store)
}{
	{"UnusedTickets", testUnusedTickets},
	{"CancelTicket", testCancelTicket},
	{"CancelTicketRefused", testCancelTicketRefused},
	{"CancelTicketConcurrent", testCancelTicketConcurrent},
}

// ticketCreatedAt issues a ticket created at created, expiring an hour
// later, without a quota.
func ticketCreatedAt(t *testing.T, s imagestore.Store, tenantID int64, secret, id string, created time.Time) imagestore.Ticket {
	t.Helper()
	tk := imagestore.Ticket{UploadID: id, TenantID: tenantID, Name: "ticket " + secret, EFI: true,
		CreatedAt: created, ExpiresAt: created.Add(time.Hour)}
	must(t, "CreateTicket "+secret, s.CreateTicket(t.Context(), tk, hash(secret), 0))
	return tk
}

func checkTickets(t *testing.T, op string, got []imagestore.Ticket, want ...imagestore.Ticket) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tickets, want %d: %+v", op, len(got), len(want), got)
	}
	for i := range got {
		checkTicket(t, fmt.Sprintf("%s [%d]", op, i), got[i], want[i])
	}
}

func testUnusedTickets(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	late := ticketCreatedAt(t, s, a.ID, "late", uploadID(1), t0.Add(time.Minute))
	t3 := ticketCreatedAt(t, s, a.ID, "t3", uploadID(3), t0)
	t2 := ticketCreatedAt(t, s, a.ID, "t2", uploadID(2), t0)
	ticketCreatedAt(t, s, a.ID, "used", uploadID(4), t0)
	ticketCreatedAt(t, s, a.ID, "session", uploadID(5), t0)
	ticketCreatedAt(t, s, a.ID, "cancelled", uploadID(6), t0)
	ticketCreatedAt(t, s, b.ID, "other", uploadID(7), t0)
	_, err := s.ConsumeTicket(ctx, hash("used"), t0)
	must(t, "ConsumeTicket", err)
	_, err = s.StartSession(ctx, hash("session"), hash("s"), imagestore.UploadSession{Length: 1, HashState: hashState(t, ""),
		CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, t0)
	must(t, "StartSession", err)
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, uploadID(6), t0))

	check := func(now time.Time, want ...imagestore.Ticket) {
		t.Helper()
		got, err := s.UnusedTickets(ctx, a.ID, now)
		must(t, "UnusedTickets", err)
		checkTickets(t, fmt.Sprintf("UnusedTickets at %v", now), got, want...)
	}
	// Oldest first, the same creation time by upload id; used, cancelled
	// and other tenants' tickets are not listed.
	check(t0, t2, t3, late)
	check(t0.Add(time.Hour), late) // t2 and t3 expired at their ExpiresAt
	check(t0.Add(time.Hour + time.Minute))
	got, err := s.UnusedTickets(ctx, 12345, t0)
	must(t, "UnusedTickets of an unknown tenant", err)
	if len(got) != 0 {
		t.Errorf("UnusedTickets of an unknown tenant: %+v", got)
	}
}

// testCancelTicket: a cancelled ticket no longer counts against the quota
// and can no longer start an upload, plain or resumable.
func testCancelTicket(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	first := newTicket(t, s, a.ID, "first", uploadID(1), t0.Add(time.Hour))
	newTicket(t, s, a.ID, "second", uploadID(2), t0.Add(time.Hour))
	third := imagestore.Ticket{UploadID: uploadID(3), TenantID: a.ID, Name: "third", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	wantErr(t, "CreateTicket at quota", s.CreateTicket(ctx, third, hash("third"), 2), imagestore.ErrQuota)

	at := t0.Add(time.Minute)
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, first.UploadID, at))
	stored, err := s.Ticket(ctx, hash("first"))
	must(t, "Ticket", err)
	want := first
	want.UsedAt = at
	checkTicket(t, "Ticket after CancelTicket", stored, want)
	// Its place in the quota is free at once.
	must(t, "CreateTicket after a cancel", s.CreateTicket(ctx, third, hash("third"), 2))

	// It cannot start an upload, and it stays out of the count.
	_, err = s.ConsumeTicket(ctx, hash("first"), at)
	wantErr(t, "ConsumeTicket cancelled", err, imagestore.ErrTicketUsed)
	_, err = s.StartSession(ctx, hash("first"), hash("session"), imagestore.UploadSession{Length: 1, HashState: hashState(t, ""),
		CreatedAt: at, ExpiresAt: at.Add(time.Hour)}, at)
	wantErr(t, "StartSession cancelled", err, imagestore.ErrTicketUsed)
	if ids := sessionIDs(t, s); len(ids) != 0 {
		t.Errorf("a cancelled ticket started sessions %v", ids)
	}
	fourth := imagestore.Ticket{UploadID: uploadID(4), TenantID: a.ID, Name: "fourth", CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	wantErr(t, "CreateTicket at quota again", s.CreateTicket(ctx, fourth, hash("fourth"), 2), imagestore.ErrQuota)
	checkTicket(t, "Ticket after refused uses", mustTicket(t, s, "first"), want)
	// Nor is it counted as expired when its time has passed.
	n, err := s.SweepTickets(ctx, t0.Add(2*time.Hour), 24*time.Hour)
	must(t, "SweepTickets", err)
	if n != 2 {
		t.Errorf("SweepTickets counted %d expired tickets, want 2 (second and third, not the cancelled one)", n)
	}
}

func mustTicket(t *testing.T, s imagestore.Store, secret string) imagestore.Ticket {
	t.Helper()
	tk, err := s.Ticket(t.Context(), hash(secret))
	must(t, "Ticket "+secret, err)
	return tk
}

// testCancelTicketRefused: what cannot be cancelled is left as it was.
func testCancelTicketRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	exp := t0.Add(time.Hour)
	own := newTicket(t, s, a.ID, "own", uploadID(1), exp)
	newTicket(t, s, a.ID, "put", uploadID(2), exp)
	newSession(t, s, a.ID, "session", uploadID(3), exp)
	newTicket(t, s, a.ID, "cancelled", uploadID(4), exp)
	newTicket(t, s, a.ID, "done", uploadID(5), exp)
	_, err := s.ConsumeTicket(ctx, hash("put"), t0)
	must(t, "ConsumeTicket put", err)
	tk, err := s.ConsumeTicket(ctx, hash("done"), t0)
	must(t, "ConsumeTicket done", err)
	must(t, "AddImage done", s.AddImage(ctx, imagestore.Image{UploadID: tk.UploadID, TenantID: a.ID, Name: "done",
		Size: 1, VirtualSize: 1, SHA256: "00", CreatedAt: t0}, 0))
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, uploadID(4), t0))
	before := map[string]imagestore.Ticket{}
	for _, secret := range []string{"own", "put", "ticket-session", "cancelled", "done"} {
		before[secret] = mustTicket(t, s, secret)
	}

	for _, c := range []struct {
		name   string
		tenant int64
		id     string
		now    time.Time
		want   error
	}{
		{"another tenant's", b.ID, own.UploadID, t0, imagestore.ErrNotFound},
		{"unknown tenant", 12345, own.UploadID, t0, imagestore.ErrNotFound},
		{"unknown id", a.ID, uploadID(99), t0, imagestore.ErrNotFound},
		{"a running plain upload's", a.ID, uploadID(2), t0, imagestore.ErrTicketUsed},
		{"a session's", a.ID, uploadID(3), t0, imagestore.ErrTicketUsed},
		{"an image's", a.ID, uploadID(5), t0, imagestore.ErrTicketUsed},
		{"cancelled already", a.ID, uploadID(4), t0.Add(time.Minute), imagestore.ErrTicketCancelled},
		{"at expiry", a.ID, own.UploadID, exp, imagestore.ErrTicketExpired},
		{"used, after expiry", a.ID, uploadID(2), exp.Add(time.Hour), imagestore.ErrTicketUsed},
	} {
		wantErr(t, "CancelTicket "+c.name, s.CancelTicket(ctx, c.tenant, c.id, c.now), c.want)
	}
	for secret, tk := range before {
		checkTicket(t, "Ticket "+secret+" after refused cancels", mustTicket(t, s, secret), tk)
	}
	// The running upload still holds its place: a cancel did not end it.
	wantErr(t, "CreateTicket beside the running upload", s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(6), TenantID: a.ID,
		Name: "x", CreatedAt: t0, ExpiresAt: exp}, hash("x"), 4), imagestore.ErrQuota)
	// One nanosecond before its expiry the ticket still cancels.
	must(t, "CancelTicket just before expiry", s.CancelTicket(ctx, a.ID, own.UploadID, exp.Add(-time.Nanosecond)))
}

// testCancelTicketConcurrent races cancels against plain and resumable
// starts of the same ticket: exactly one of them wins, whichever it is,
// and the ticket ends in the winner's state.
func testCancelTicketConcurrent(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	const rounds, each = 6, 2 // each kind of caller, per round
	for r := range rounds {
		secret := fmt.Sprintf("race-%d", r)
		tk := newTicket(t, s, a.ID, secret, uploadID(100+r), t0.Add(time.Hour))
		start := make(chan struct{})
		errs := make([]error, 3*each)
		var wg sync.WaitGroup
		for i := range 3 * each {
			now := t0.Add(time.Duration(i+1) * time.Second) // the winner's UsedAt names it
			wg.Go(func() {
				<-start
				switch i % 3 {
				case 0:
					errs[i] = s.CancelTicket(ctx, a.ID, tk.UploadID, now)
				case 1:
					_, errs[i] = s.ConsumeTicket(ctx, hash(secret), now)
				default:
					_, errs[i] = s.StartSession(ctx, hash(secret), hash(fmt.Sprintf("%s-session-%d", secret, i)),
						imagestore.UploadSession{Length: 1, HashState: hashState(t, ""), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, now)
				}
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("round %d: callers %d and %d both won", r, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, imagestore.ErrTicketUsed) && !errors.Is(err, imagestore.ErrTicketCancelled):
				t.Errorf("round %d: caller %d: %v, want nil, ErrTicketUsed or ErrTicketCancelled", r, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody won: %v", r, errs)
		}
		checkRaceWinner(t, s, a, secret, winner%3, t0.Add(time.Duration(winner+1)*time.Second))
		// Leave the next round a tenant without reservations.
		must(t, "EndUpload", s.EndUpload(ctx, tk.UploadID))
		must(t, "EndSession", s.EndSession(ctx, tk.UploadID))
	}
}

// checkRaceWinner checks the ticket is in the state its race's winner
// (0 cancel, 1 plain upload, 2 session) left: used at the winner's time,
// holding a quota place unless the cancel won.
func checkRaceWinner(t *testing.T, s imagestore.Store, a imagestore.Tenant, secret string, kind int, at time.Time) {
	t.Helper()
	ctx := t.Context()
	if got := mustTicket(t, s, secret); !got.UsedAt.Equal(at) {
		t.Errorf("%s: UsedAt = %v, want the winner's %v", secret, got.UsedAt, at)
	}
	if sessions := sessionIDs(t, s); (kind == 2) != (len(sessions) == 1) {
		t.Errorf("%s: winner kind %d, sessions %v", secret, kind, sessions)
	}
	probe := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: a.ID, Name: "probe", CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	err := s.CreateTicket(ctx, probe, hash("probe-"+probe.UploadID), 1)
	switch {
	case kind == 0 && err != nil:
		t.Errorf("%s: the cancel won, yet a ticket at a quota of one is refused: %v", secret, err)
	case kind != 0 && !errors.Is(err, imagestore.ErrQuota):
		t.Errorf("%s: an upload won (kind %d), yet a ticket at a quota of one was issued: %v", secret, kind, err)
	}
	if err == nil {
		must(t, "CancelTicket probe", s.CancelTicket(ctx, a.ID, probe.UploadID, at))
	}
}
