package market

import (
	"net/http"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestLoneSurrogateRefused: encoding/json turns an escaped half of a
// UTF-16 surrogate pair ("\ud800" alone) into U+FFFD without a word, so
// the text stored would not be the text sent. Every route that takes
// text refuses a lone high and a lone low surrogate (and a pair in the
// wrong order) with 400 badRequest, storing nothing; a valid pair (😀,
// "\ud83d\ude00") and an escaped backslash before "ud800" (the six
// characters, no escape) are text and pass.
func TestLoneSurrogateRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 100 })
	_, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "acct_1HostActive000002")
	listing := e.listing(host, 600, 10)
	orderBody := func(name, userData string) string {
		return `{"listing_id":"` + listing + `","quantity":1,"image":"debian-13","name":"` + name + `","user_data":"` + userData + `"}`
	}
	bad := map[string]string{
		"lone high":      `\ud800`,
		"lone low":       `\udc00`,
		"high at end":    `a\udbff`,
		"high then text": `\ud83dx`,
		"low then high":  `\ude00\ud83d`,
		"two highs":      `\ud83d\ud83d`,
		"upper-case hex": `\uD800`,
	}
	for what, esc := range bad {
		for _, c := range []struct{ route, path, body string }{
			{"ticket name", "/market/vm-images/ticket", `{"name":"disk ` + esc + `"}`},
			{"order name", "/market/vms/orders", orderBody(`web`+esc, "")},
			{"user_data", "/market/vms/orders", orderBody("web", `#cloud-config\n# `+esc)},
		} {
			t.Run(c.route+" "+what, func(t *testing.T) {
				r := e.post(c.path, buyer, c.body)
				wantError(t, r, http.StatusBadRequest, "badRequest")
				if !strings.Contains(string(r.body), "surrogate") {
					t.Errorf("refusal %s does not say what is wrong", r.body)
				}
			})
		}
	}
	if os, _ := e.st.Orders(t.Context(), buyerT.ID); len(os) != 0 {
		t.Errorf("refused orders were stored: %+v", os)
	}

	t.Run("valid pair and escaped backslash", func(t *testing.T) {
		r := e.post("/market/vm-images/ticket", buyer, `{"name":"disk \ud83d\ude00 \\ud800"}`)
		if r.status != http.StatusCreated {
			t.Fatalf("ticket with a valid pair: %d %s", r.status, r.body)
		}
		var tk ticketAnswer
		decode(t, r, &tk)
		e.remember(tk.Ticket)
		stored, err := e.st.Ticket(t.Context(), imagestore.HashSecret(tk.Ticket))
		if want := "disk \U0001F600 \\ud800"; err != nil || stored.Name != want {
			t.Errorf("stored ticket name %q, %v; want %q", stored.Name, err, want)
		}
		ud := `#cloud-config\n# \ud83d\ude00 \\udc00`
		r = e.post("/market/vms/orders", buyer, orderBody("web", ud))
		if r.status != http.StatusCreated {
			t.Fatalf("order with a valid pair in user_data: %d %s", r.status, r.body)
		}
		var a orderAnswer
		decode(t, r, &a)
		got, err := e.st.OrderUserData(t.Context(), a.OrderID)
		if err != nil || got != "#cloud-config\n# \U0001F600 \\udc00" {
			t.Errorf("stored user data %q, %v", got, err)
		}
	})
}
