package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/market"
)

// The control plane serves the page on exactly its paths, through its own
// router: GET and HEAD, its JSON 404 for any other path under /machines,
// its 405 for other methods, and the page's CSP naming the data plane.
func TestControlPlaneServesThePage(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	blobs, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := market.New(market.Config{PublicURL: "http://127.0.0.1:18480", TicketTTL: time.Hour, ImagesPerTenant: 3},
		st, blobs, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	cases := []struct {
		method, path string
		status       int
		reason       string // of a JSON error answer
	}{
		{http.MethodGet, "/machines", 200, ""},
		{http.MethodHead, "/machines", 200, ""},
		{http.MethodGet, "/machines/app.js", 200, ""},
		{http.MethodGet, "/machines/qcow2.js", 200, ""},
		{http.MethodGet, "/machines/style.css", 200, ""},
		{http.MethodGet, "/machines/third_party/tus-js-client/tus.min.js", 200, ""},
		{http.MethodHead, "/machines/third_party/tus-js-client/LICENSE", 200, ""},
		{http.MethodGet, "/machines/other", 404, "notFound"},
		{http.MethodGet, "/machines/", 404, "notFound"},
		{http.MethodGet, "/machines/index.html", 404, "notFound"},
		{http.MethodPost, "/machines", 405, "methodNotAllowed"},
		{http.MethodDelete, "/machines/app.js", 405, "methodNotAllowed"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), c.method, ts.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != c.status {
				t.Fatalf("status %d, want %d (%s)", res.StatusCode, c.status, body)
			}
			if c.reason != "" {
				var e struct{ Reason string }
				if err := json.Unmarshal(body, &e); err != nil || e.Reason != c.reason {
					t.Errorf("answer %q, want the JSON error with reason %q", body, c.reason)
				}
				return
			}
			csp := res.Header.Get("Content-Security-Policy")
			if want := "connect-src 'self' http://127.0.0.1:18480;"; !strings.Contains(csp, want) {
				t.Errorf("CSP %q lacks %q", csp, want)
			}
			if res.Header.Get("ETag") == "" || res.Header.Get("Referrer-Policy") != "no-referrer" {
				t.Errorf("ETag %q Referrer-Policy %q", res.Header.Get("ETag"), res.Header.Get("Referrer-Policy"))
			}
			if c.method == http.MethodHead && len(body) != 0 {
				t.Errorf("HEAD answered %d body bytes", len(body))
			}
		})
	}
}
