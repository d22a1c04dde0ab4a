package main

import (
	"net/http"
	"path/filepath"
	"testing"
)

// TestE2ECORSDefaultsToThePage: the Machines page is served by the control
// plane and uploads to the data plane, another origin. Without flags the
// data plane lets exactly the page's origin upload (a preflight from it is
// answered, one from elsewhere is not); --checkout-return-url moves the
// page and the origin with it; --cors-origin overrides both.
func TestE2ECORSDefaultsToThePage(t *testing.T) {
	cases := []struct {
		name    string
		args    func(ctlAddr string) []string
		allowed func(ctlAddr string) string
		refused string
	}{
		{"default", func(string) []string { return nil },
			func(ctl string) string { return "http://" + ctl }, "http://evil.example"},
		{"checkout return url", func(string) []string {
			return []string{"--checkout-return-url", "https://edge.example/machines"}
		}, func(string) string { return "https://edge.example" }, "http://127.0.0.1:1"},
		// --cors-origin adds an origin beside the page's own: the page and
		// the data plane are one product.
		{"cors origin", func(string) []string {
			return []string{"--checkout-return-url", "https://edge.example/machines", "--cors-origin", "https://box.example:8443"}
		}, func(string) string { return "https://box.example:8443" }, "https://evil.example"},
		{"cors origin beside the page's", func(string) []string {
			return []string{"--checkout-return-url", "https://edge.example/machines", "--cors-origin", "https://box.example:8443"}
		}, func(string) string { return "https://edge.example" }, "http://edge.example"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dataAddr, ctlAddr := freeAddr(t), freeAddr(t)
			s := startServeAt(t, filepath.Join(t.TempDir(), "data"), dataAddr, ctlAddr, c.args(ctlAddr))
			preflight := func(origin string) *http.Response {
				req, err := http.NewRequest(http.MethodOptions, s.dataBase+"/market/vm-images/upload/0000", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Origin", origin)
				req.Header.Set("Access-Control-Request-Method", "POST")
				req.Header.Set("Access-Control-Request-Headers", "tus-resumable, upload-length")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			allowed := c.allowed(ctlAddr)
			if r := preflight(allowed); r.StatusCode != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Origin") != allowed {
				t.Errorf("preflight from %s: %d, Allow-Origin %q; want 204 allowing it", allowed, r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
			}
			if r := preflight(c.refused); r.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("preflight from %s allowed %q", c.refused, r.Header.Get("Access-Control-Allow-Origin"))
			}
		})
	}
}
