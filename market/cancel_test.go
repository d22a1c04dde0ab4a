package market

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// issued is a ticket as POST /market/vm-images/ticket answered it.
type issued struct {
	Ticket   string `json:"ticket"`
	UploadID string `json:"upload_id"`
}

// issue asks for a ticket named name and remembers its secret.
func (e *env) issue(token, name string) issued {
	e.t.Helper()
	r := e.post("/market/vm-images/ticket", token, `{"name":"`+name+`","efi":true}`)
	if r.status != http.StatusCreated {
		e.t.Fatalf("ticket %s: %d %s", name, r.status, r.body)
	}
	var tk issued
	decode(e.t, r, &tk)
	e.remember(tk.Ticket)
	return tk
}

// statusTickets is the tickets field of token's status, raw.
func (e *env) statusTickets(token string) []map[string]any {
	e.t.Helper()
	r := e.post("/market/vms/status", token, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("status: %d %s", r.status, r.body)
	}
	var raw map[string]json.RawMessage
	decode(e.t, r, &raw)
	if !strings.HasPrefix(string(raw["tickets"]), "[") {
		e.t.Fatalf("tickets = %s, want an array", raw["tickets"])
	}
	var tickets []map[string]any
	if err := json.Unmarshal(raw["tickets"], &tickets); err != nil {
		e.t.Fatalf("tickets: %v", err)
	}
	return tickets
}

// TestStatusTickets: status lists the unused, unexpired tickets, the ones
// the quota counts, oldest first, and never a ticket's capability.
func TestStatusTickets(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	_, bobToken := e.tenant("bob", true)
	if got := e.statusTickets(token); len(got) != 0 {
		t.Errorf("tickets before any: %v", got)
	}
	first := e.issue(token, "first")
	used := e.issue(token, "used")
	e.clock.Advance(time.Minute)
	later := e.issue(token, "later")
	e.issue(bobToken, "bob's")
	if _, err := e.st.ConsumeTicket(t.Context(), imagestore.HashSecret(used.Ticket), e.clock.Now()); err != nil {
		t.Fatal(err)
	}

	got := e.statusTickets(token)
	want := []map[string]any{
		{"upload_id": first.UploadID, "name": "first", "efi": true, "expires_at": t0.Add(time.Hour).Format(time.RFC3339)},
		{"upload_id": later.UploadID, "name": "later", "efi": true, "expires_at": t0.Add(time.Hour + time.Minute).Format(time.RFC3339)},
	}
	if len(got) != len(want) {
		t.Fatalf("tickets %v, want %v", got, want)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Errorf("ticket %d has fields %v, want exactly those of %v", i, got[i], want[i])
		}
		for k, v := range want[i] {
			if got[i][k] != v {
				t.Errorf("ticket %d: %s = %v, want %v", i, k, got[i][k], v)
			}
		}
	}
	r := e.post("/market/vms/status", token, "")
	for _, tk := range []issued{first, used, later} {
		if strings.Contains(string(r.body), tk.Ticket) {
			t.Errorf("status carries the capability of ticket %s", tk.UploadID)
		}
	}
	// At its expiry a ticket leaves the list, as it leaves the quota.
	e.clock.Advance(time.Hour - time.Minute)
	if got := e.statusTickets(token); len(got) != 1 || got[0]["upload_id"] != later.UploadID {
		t.Errorf("tickets at the first one's expiry: %v, want only %s", got, later.UploadID)
	}
}

// TestCancelTicket: a cancelled ticket frees its place in the quota at
// once and can no longer start an upload.
func TestCancelTicket(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	tks := []issued{e.issue(token, "one"), e.issue(token, "two"), e.issue(token, "three")}
	wantError(t, e.post("/market/vm-images/ticket", token, `{"name":"four"}`), http.StatusConflict, "imageQuota")

	body := `{"upload_id":"` + tks[1].UploadID + `"}`
	r := e.post("/market/vm-images/ticket/cancel", token, body)
	if r.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	var ans map[string]string
	decode(t, r, &ans)
	if len(ans) != 1 || ans["cancelled"] != tks[1].UploadID {
		t.Errorf("answer %v, want {cancelled: %s}", ans, tks[1].UploadID)
	}
	for _, tk := range e.statusTickets(token) {
		if tk["upload_id"] == tks[1].UploadID {
			t.Errorf("status still lists the cancelled ticket")
		}
	}
	if _, err := e.st.ConsumeTicket(t.Context(), imagestore.HashSecret(tks[1].Ticket), e.clock.Now()); !errors.Is(err, imagestore.ErrTicketUsed) {
		t.Errorf("ConsumeTicket of the cancelled ticket: %v, want ErrTicketUsed", err)
	}
	e.issue(token, "four") // in the place the cancel freed

	// A retry after a lost answer, or a cancel of an expired ticket, is
	// answered alike: the ticket holds nothing. Only the first counts.
	if r := e.post("/market/vm-images/ticket/cancel", token, body); r.status != http.StatusOK {
		t.Errorf("cancel again: %d %s", r.status, r.body)
	}
	e.clock.Advance(time.Hour)
	if r := e.post("/market/vm-images/ticket/cancel", token, `{"upload_id":"`+tks[0].UploadID+`"}`); r.status != http.StatusOK {
		t.Errorf("cancel of an expired ticket: %d %s", r.status, r.body)
	}
	wantLines(t, e.scrape(), "vmshelf_tickets_cancelled_total 1")
	// The expired ticket was left as it was: expired, not cancelled.
	if tk, err := e.st.Ticket(t.Context(), imagestore.HashSecret(tks[0].Ticket)); err != nil || !tk.UsedAt.IsZero() {
		t.Errorf("the expired ticket after a cancel: %+v, %v; want it unused", tk, err)
	}
}

// TestCancelTicketRefused: another tenant's or an unknown ticket is 404, a
// used one 409 saying how its upload ends, and nothing changes.
func TestCancelTicketRefused(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	_, bobToken := e.tenant("bob", true)
	_, shyToken := e.tenant("shy", false)
	own := e.issue(token, "own")
	running := e.issue(token, "running")
	if _, err := e.st.ConsumeTicket(t.Context(), imagestore.HashSecret(running.Ticket), e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	done := e.issue(token, "done")
	tk, err := e.st.ConsumeTicket(t.Context(), imagestore.HashSecret(done.Ticket), e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.AddImage(t.Context(), imagestore.Image{UploadID: tk.UploadID, TenantID: alice.ID, Name: "done",
		Size: 1, VirtualSize: 1, SHA256: "00", CreatedAt: e.clock.Now()}, 0); err != nil {
		t.Fatal(err)
	}
	cancel := func(id string) string { return `{"upload_id":"` + id + `"}` }
	for _, c := range []struct {
		name, token, body string
		status            int
		reason, says      string
	}{
		{"another tenant's", bobToken, cancel(own.UploadID), 404, "ticketUnknown", ""},
		{"not sharing", shyToken, cancel(own.UploadID), 409, "notSharing", ""},
		{"unknown", token, cancel(imagestore.NewUploadID()), 404, "ticketUnknown", ""},
		{"malformed id", token, cancel("../../etc/passwd"), 404, "ticketUnknown", ""},
		{"the capability instead of the id", token, cancel(own.Ticket), 404, "ticketUnknown", ""},
		{"missing id", token, `{}`, 404, "ticketUnknown", ""},
		{"unknown field", token, `{"upload_id":"` + own.UploadID + `","force":true}`, 400, "badRequest", ""},
		{"wrong type", token, `{"upload_id":1}`, 400, "badRequest", ""},
		{"running upload", token, cancel(running.UploadID), 409, "ticketUsed", "DELETE"},
		{"finished upload", token, cancel(done.UploadID), 409, "ticketUsed", "vmshelf rm"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.post("/market/vm-images/ticket/cancel", c.token, c.body)
			wantError(t, r, c.status, c.reason)
			if !strings.Contains(string(r.body), c.says) {
				t.Errorf("answer %s does not say %q", r.body, c.says)
			}
		})
	}
	if got := e.statusTickets(token); len(got) != 1 || got[0]["upload_id"] != own.UploadID {
		t.Errorf("tickets after refused cancels: %v, want only %s", got, own.UploadID)
	}
	wantLines(t, e.scrape(), "vmshelf_tickets_cancelled_total 0")
}
