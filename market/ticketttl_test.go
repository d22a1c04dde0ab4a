package market

import (
	"net/http"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestTicketTTLConfigured: a ticket lives --ticket-ttl, in the answer and
// in the store the data plane checks it against. Every other test runs at
// serve's default of an hour, where a ticket that ignored the setting
// looks right; an operator who shortens it for a shared box would get
// hour-long upload capabilities.
func TestTicketTTLConfigured(t *testing.T) {
	const ttl = 7 * time.Minute
	e := newEnv(t, func(c *Config) { c.TicketTTL = ttl })
	_, token := e.tenant("alice", true)
	r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	var a ticketAnswer
	decode(t, r, &a)
	e.remember(a.Ticket)
	if want := t0.Add(ttl); !a.ExpiresAt.Equal(want) {
		t.Errorf("expires_at %v, want %v (now + --ticket-ttl)", a.ExpiresAt, want)
	}
	tk, err := e.st.Ticket(t.Context(), imagestore.HashSecret(a.Ticket))
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(ttl); !tk.ExpiresAt.Equal(want) {
		t.Errorf("stored ticket expires %v, want %v", tk.ExpiresAt, want)
	}
}
