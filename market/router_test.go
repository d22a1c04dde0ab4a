package market

import "testing"

// Unknown paths are 404 and known paths with other methods 405, both in the
// edge's error shape; matching is exact, without ServeMux's prefixes and
// redirects.
func TestRouting(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/", 404, ""},
		{"GET", "/nope", 404, ""},
		{"GET", "/healthz/", 404, ""},
		{"GET", "//healthz", 404, ""},
		{"GET", "/%68ealthz", 404, ""},
		{"GET", "/market", 404, ""},
		{"GET", "/market/vm-images/", 404, ""},
		{"POST", "/market/vm-images/ticket/", 404, ""},
		{"POST", "/market/vm-images/ticket/x", 404, ""},
		// The data plane's route is not served here.
		{"PUT", "/market/vm-images/upload/abc", 404, ""},
		{"GET", "/market/vm-images/ticket", 405, "POST"},
		{"PUT", "/market/vms/status", 405, "POST"},
		{"POST", "/healthz", 405, "GET, HEAD"},
		{"DELETE", "/market/vm-images", 405, "GET, HEAD"},
		{"POST", "/metrics", 405, "GET, HEAD"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			// With a valid token too: routing decides before auth.
			r := e.do(c.method, c.path, token, nil)
			if c.status == 404 {
				wantError(t, r, 404, "notFound")
				return
			}
			wantError(t, r, 405, "methodNotAllowed")
			if got := r.header.Get("Allow"); got != c.allow {
				t.Errorf("Allow %q, want %q", got, c.allow)
			}
		})
	}
}
