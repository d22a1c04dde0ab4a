package storetest

import (
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// undoTests are the suite's tests of the writes that take back what a
// request whose client was answered an error may have left.
var undoTests = []struct {
	name string
	fn   func(t *testing.T, s imagestore.Store)
}{
	{"WithdrawTicket", testWithdrawTicket},
	{"WithdrawTicketFirst", testWithdrawTicketFirst},
	{"UndoUpload", testUndoUpload},
	{"UndoUploadOfImage", testUndoUploadOfImage},
	{"UndoUploadLeavesOthers", testUndoUploadLeavesOthers},
}

// testWithdrawTicket: a ticket whose CreateTicket landed is cancelled by
// its withdrawal: its place in the quota is free, it starts no upload,
// and a second withdrawal (a retry) changes nothing.
func testWithdrawTicket(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	tk := newTicket(t, s, a.ID, "lost", uploadID(1), t0.Add(time.Hour))
	other := imagestore.Ticket{UploadID: uploadID(2), TenantID: a.ID, Name: "other", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	wantErr(t, "CreateTicket at quota", s.CreateTicket(ctx, other, hash("other"), 1), imagestore.ErrQuota)

	at := t0.Add(time.Second)
	for i := range 2 {
		must(t, "WithdrawTicket", s.WithdrawTicket(ctx, tk, hash("lost"), at))
		want := tk
		want.UsedAt = at
		checkTicket(t, "Ticket after WithdrawTicket", mustTicket(t, s, "lost"), want)
		if i == 0 {
			must(t, "CreateTicket in the withdrawn one's place", s.CreateTicket(ctx, other, hash("other"), 1))
		}
	}
	_, err := s.ConsumeTicket(ctx, hash("lost"), at)
	wantErr(t, "ConsumeTicket withdrawn", err, imagestore.ErrTicketUsed)
	wantErr(t, "CancelTicket withdrawn", s.CancelTicket(ctx, a.ID, tk.UploadID, at), imagestore.ErrTicketCancelled)
	if got, err := s.UnusedTickets(ctx, a.ID, at); err != nil || len(got) != 1 || got[0].UploadID != other.UploadID {
		t.Errorf("UnusedTickets after the withdrawal: %+v, %v; want only %s", got, err, other.UploadID)
	}
}

// testWithdrawTicketFirst: a withdrawal that comes before the
// CreateTicket it takes back (the server ran the late write after it)
// makes that write fail, and leaves a cancelled ticket; one for an
// unknown tenant is refused.
func testWithdrawTicketFirst(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	tk := imagestore.Ticket{UploadID: uploadID(1), TenantID: a.ID, Name: "late", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	at := t0.Add(time.Second)
	must(t, "WithdrawTicket before its CreateTicket", s.WithdrawTicket(ctx, tk, hash("late"), at))
	wantErr(t, "CreateTicket after its withdrawal", s.CreateTicket(ctx, tk, hash("late"), 0), imagestore.ErrExists)
	want := tk
	want.UsedAt = at
	checkTicket(t, "Ticket", mustTicket(t, s, "late"), want)
	if got, err := s.UnusedTickets(ctx, a.ID, at); err != nil || len(got) != 0 {
		t.Errorf("UnusedTickets: %+v, %v; want none", got, err)
	}
	n, err := s.SweepTickets(ctx, t0.Add(2*time.Hour), 24*time.Hour)
	if err != nil || n != 0 {
		t.Errorf("SweepTickets = %d, %v; a withdrawn ticket never expires unused", n, err)
	}
	stray := imagestore.Ticket{UploadID: uploadID(2), TenantID: a.ID + 100, Name: "x", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	wantErr(t, "WithdrawTicket of an unknown tenant", s.WithdrawTicket(ctx, stray, hash("stray"), at), imagestore.ErrNotFound)

	// A used ticket is left alone: its client had its answer after all.
	used := newTicket(t, s, a.ID, "used", uploadID(3), t0.Add(time.Hour))
	_, err = s.ConsumeTicket(ctx, hash("used"), at)
	must(t, "ConsumeTicket", err)
	must(t, "WithdrawTicket of a used ticket", s.WithdrawTicket(ctx, used, hash("used"), at.Add(time.Second)))
	_, err = s.ConsumeTicket(ctx, hash("used"), at)
	wantErr(t, "ConsumeTicket again", err, imagestore.ErrTicketUsed)
	wantErr(t, "CancelTicket of the used ticket", s.CancelTicket(ctx, a.ID, used.UploadID, at), imagestore.ErrTicketUsed)
}

// testUndoUpload: the undo of a plain upload's start and of a resumable
// one's gives the ticket back (usable again, counted again) and ends the
// session; nothing was committed, so no blob is to be removed.
func testUndoUpload(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	newTicket(t, s, a.ID, "put", uploadID(1), t0.Add(time.Hour))
	newTicket(t, s, a.ID, "tus", uploadID(2), t0.Add(time.Hour))
	started := t0.Add(time.Minute)
	_, err := s.ConsumeTicket(ctx, hash("put"), started)
	must(t, "ConsumeTicket", err)
	_, err = s.StartSession(ctx, hash("tus"), hash("session"), imagestore.UploadSession{Length: 10, HashState: hashState(t, ""),
		CreatedAt: started, ExpiresAt: started.Add(time.Hour)}, started)
	must(t, "StartSession", err)
	must(t, "IntendCommit", s.IntendCommit(ctx, uploadID(2), started))

	for _, id := range []string{uploadID(1), uploadID(2)} {
		removeBlob, err := s.UndoUpload(ctx, id, started)
		must(t, "UndoUpload "+id, err)
		if removeBlob != (id == uploadID(2)) {
			t.Errorf("UndoUpload %s: removeBlob %v; want true only where a commit was intended", id, removeBlob)
		}
	}
	if _, err := s.Session(ctx, hash("session")); err == nil {
		t.Error("the undone upload's session is still there")
	}
	intents, err := s.Intents(ctx)
	must(t, "Intents", err)
	if len(intents) != 1 || intents[0].UploadID != uploadID(2) || intents[0].Kind != imagestore.IntentRemove {
		t.Errorf("intents after the undo: %+v; want the commit intent turned into a remove intent", intents)
	}
	unused, err := s.UnusedTickets(ctx, a.ID, started)
	must(t, "UnusedTickets", err)
	if len(unused) != 2 {
		t.Fatalf("UnusedTickets after the undo: %+v; want both tickets back", unused)
	}
	third := imagestore.Ticket{UploadID: uploadID(3), TenantID: a.ID, Name: "third", CreatedAt: started, ExpiresAt: started.Add(time.Hour)}
	wantErr(t, "CreateTicket: the tickets given back count", s.CreateTicket(ctx, third, hash("third"), 2), imagestore.ErrQuota)
	// The same tickets start again, and a late undo of the first start
	// does not touch the second.
	again := started.Add(time.Minute)
	_, err = s.ConsumeTicket(ctx, hash("put"), again)
	must(t, "ConsumeTicket again", err)
	removeBlob, err := s.UndoUpload(ctx, uploadID(1), started)
	if err != nil || removeBlob {
		t.Fatalf("a late UndoUpload = %v, %v", removeBlob, err)
	}
	_, err = s.ConsumeTicket(ctx, hash("put"), again)
	wantErr(t, "ConsumeTicket of the restarted upload", err, imagestore.ErrTicketUsed)
	_, err = s.StartSession(ctx, hash("tus"), hash("session 2"), imagestore.UploadSession{Length: 10, HashState: hashState(t, ""),
		CreatedAt: again, ExpiresAt: again.Add(time.Hour)}, again)
	must(t, "StartSession again", err)
}

// testUndoUploadOfImage: an upload whose image was recorded after all
// (its AddImage landed though its caller heard no answer) loses the
// record: the blob is to be removed, the ticket is usable again; unless
// an order holds the image meanwhile.
func testUndoUploadOfImage(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	newTicket(t, s, a.ID, "put", uploadID(1), t0.Add(time.Hour))
	started := t0.Add(time.Minute)
	_, err := s.ConsumeTicket(ctx, hash("put"), started)
	must(t, "ConsumeTicket", err)
	must(t, "IntendCommit", s.IntendCommit(ctx, uploadID(1), started))
	newImage(t, s, a.ID, uploadID(1), started, 100)
	must(t, "CreateFetchToken", s.CreateFetchToken(ctx, hash("fetch"), imagestore.FetchToken{UploadID: uploadID(1), ExpiresAt: t0.Add(time.Hour)}))

	removeBlob, err := s.UndoUpload(ctx, uploadID(1), started)
	must(t, "UndoUpload", err)
	if !removeBlob {
		t.Error("UndoUpload of a recorded image: removeBlob false")
	}
	wantErr(t, "Image after the undo", func() error { _, err := s.Image(ctx, uploadID(1)); return err }(), imagestore.ErrNotFound)
	_, _, err = s.ImageForToken(ctx, hash("fetch"), started)
	wantErr(t, "ImageForToken after the undo", err, imagestore.ErrNotFound)
	intents, err := s.Intents(ctx)
	must(t, "Intents", err)
	if len(intents) != 1 || intents[0].Kind != imagestore.IntentRemove {
		t.Errorf("intents: %+v; want the image's remove intent", intents)
	}
	_, err = s.ConsumeTicket(ctx, hash("put"), started.Add(time.Minute))
	must(t, "ConsumeTicket of the ticket given back", err)
}

// testUndoUploadLeavesOthers: nothing of another upload, or of an upload
// that never started, changes; an unknown upload is no error.
func testUndoUploadLeavesOthers(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	newTicket(t, s, a.ID, "unused", uploadID(1), t0.Add(time.Hour))
	newTicket(t, s, a.ID, "cancelled", uploadID(2), t0.Add(time.Hour))
	must(t, "CancelTicket", s.CancelTicket(ctx, a.ID, uploadID(2), t0))
	for _, id := range []string{uploadID(1), uploadID(2), uploadID(9)} {
		if removeBlob, err := s.UndoUpload(ctx, id, t0); err != nil || removeBlob {
			t.Errorf("UndoUpload %s = %v, %v; want nothing done", id, removeBlob, err)
		}
	}
	unused, err := s.UnusedTickets(ctx, a.ID, t0)
	must(t, "UnusedTickets", err)
	if len(unused) != 1 || unused[0].UploadID != uploadID(1) {
		t.Errorf("UnusedTickets: %+v; want the unused one alone", unused)
	}
}
