package market

import (
	"net/http"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Every tenant route refuses a request without a known token before it
// looks at the body, and answers 401 with a Bearer challenge.
func TestAuth(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	unknown := imagestore.NewSecret()
	e.remember(unknown)

	routes := []struct{ path, body string }{
		{"/market/vm-images/ticket", `{"name":"disk"}`},
		{"/market/vm-images/remove", `{"upload_id":"000000000000000000000000"}`},
		{"/market/vm-images/ticket/cancel", `{"upload_id":"000000000000000000000000"}`},
		{"/market/vms/status", `{}`},
	}
	headers := []struct {
		name, header string
	}{
		{"missing", ""},
		{"empty bearer", "Bearer "},
		{"other scheme", "Basic " + token},
		{"token without scheme", token},
		{"unknown token", "Bearer " + unknown},
		{"token with a character more", "Bearer " + token + "0"},
	}
	for _, ro := range routes {
		for _, h := range headers {
			t.Run(ro.path+"/"+h.name, func(t *testing.T) {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+ro.path, strings.NewReader(ro.body))
				if err != nil {
					t.Fatal(err)
				}
				if h.header != "" {
					req.Header.Set("Authorization", h.header)
				}
				req.Header.Set("Content-Type", "application/json")
				r := e.send(req)
				wantError(t, r, http.StatusUnauthorized, "unauthorized")
				if got := r.header.Get("WWW-Authenticate"); got != "Bearer" {
					t.Errorf("WWW-Authenticate %q, want Bearer", got)
				}
			})
		}
	}

	// Auth comes before body parsing: garbage from a stranger is a 401,
	// not a parse error that tells them about the route.
	wantError(t, e.post("/market/vm-images/ticket", "", "garbage"), http.StatusUnauthorized, "unauthorized")

	t.Run("ok", func(t *testing.T) {
		wantOK := func(h string) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+"/market/vms/status", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", h)
			if r := e.send(req); r.status != http.StatusOK {
				t.Errorf("Authorization %q: status %d, body %s", h[:10], r.status, r.body)
			}
		}
		wantOK("Bearer " + token)
		wantOK("bearer " + token) // the scheme is case-insensitive
	})
}
