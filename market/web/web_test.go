package web

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const dataPlane = "http://127.0.0.1:8480"

const consoles = "ws://127.0.0.1:8481"

func newPage(t *testing.T) *Page {
	t.Helper()
	p, err := New(dataPlane+"/", consoles)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every path answers its embedded file byte for byte, with the headers the
// page's safety rests on, for GET and HEAD.
func TestServesEveryFile(t *testing.T) {
	p := newPage(t)
	wantCSP := "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self' http://127.0.0.1:8480 ws://127.0.0.1:8481; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
	cases := []struct {
		path, file, contentType string
	}{
		{"/machines", "index.html", "text/html; charset=utf-8"},
		{"/machines/app.js", "app.js", "text/javascript; charset=utf-8"},
		{"/machines/qcow2.js", "qcow2.js", "text/javascript; charset=utf-8"},
		{"/machines/format.js", "format.js", "text/javascript; charset=utf-8"},
		{"/machines/style.css", "style.css", "text/css; charset=utf-8"},
		{"/machines/console.js", "console.js", "text/javascript; charset=utf-8"},
		{"/machines/api.js", "api.js", "text/javascript; charset=utf-8"},
		{"/machines/reasons.js", "reasons.js", "text/javascript; charset=utf-8"},
		{"/machines/dom.js", "dom.js", "text/javascript; charset=utf-8"},
		{"/machines/money.js", "money.js", "text/javascript; charset=utf-8"},
		{"/machines/status.js", "status.js", "text/javascript; charset=utf-8"},
		{"/machines/images.js", "images.js", "text/javascript; charset=utf-8"},
		{"/machines/orders.js", "orders.js", "text/javascript; charset=utf-8"},
		{"/machines/power.js", "power.js", "text/javascript; charset=utf-8"},
		{"/machines/listings.js", "listings.js", "text/javascript; charset=utf-8"},
		{"/machines/uploads.js", "uploads.js", "text/javascript; charset=utf-8"},
		{"/machines/transfer.js", "transfer.js", "text/javascript; charset=utf-8"},
		{"/machines/third_party/tus-js-client/tus.min.js", "third_party/tus-js-client/tus.min.js", "text/javascript; charset=utf-8"},
		{"/machines/third_party/tus-js-client/LICENSE", "third_party/tus-js-client/LICENSE", "text/plain; charset=utf-8"},
		// The vendored libraries: their entry points, what they import,
		// and their licences.
		{"/machines/third_party/novnc/core/rfb.js", "third_party/novnc/core/rfb.js", "text/javascript; charset=utf-8"},
		{"/machines/third_party/novnc/vendor/pako/lib/zlib/inflate.js", "third_party/novnc/vendor/pako/lib/zlib/inflate.js", "text/javascript; charset=utf-8"},
		{"/machines/third_party/novnc/LICENSE.txt", "third_party/novnc/LICENSE.txt", "text/plain; charset=utf-8"},
		{"/machines/third_party/novnc/docs/LICENSE.MPL-2.0", "third_party/novnc/docs/LICENSE.MPL-2.0", "text/plain; charset=utf-8"},
		{"/machines/third_party/novnc/vendor/pako/LICENSE", "third_party/novnc/vendor/pako/LICENSE", "text/plain; charset=utf-8"},
		{"/machines/third_party/xterm/xterm.mjs", "third_party/xterm/xterm.mjs", "text/javascript; charset=utf-8"},
		{"/machines/third_party/xterm/xterm.css", "third_party/xterm/xterm.css", "text/css; charset=utf-8"},
		{"/machines/third_party/xterm/LICENSE", "third_party/xterm/LICENSE", "text/plain; charset=utf-8"},
	}
	vendoredFiles := 0
	for _, dir := range vendored {
		_ = filepath.WalkDir(filepath.Join("static", dir), func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				vendoredFiles++
			}
			return err
		})
	}
	if got := p.Paths(); len(got) != len(files)+vendoredFiles || got[0] != "/machines" {
		t.Fatalf("Paths() = %d paths, want the page's %d and the %d vendored files, /machines first", len(got), len(files), vendoredFiles)
	}
	for _, c := range cases {
		want, err := os.ReadFile(filepath.Join("static", c.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			t.Run(method+" "+c.path, func(t *testing.T) {
				rec := httptest.NewRecorder()
				p.ServeHTTP(rec, httptest.NewRequest(method, c.path, nil))
				res := rec.Result()
				body, _ := io.ReadAll(res.Body)
				if res.StatusCode != http.StatusOK {
					t.Fatalf("status %d, want 200", res.StatusCode)
				}
				for h, v := range map[string]string{
					"Content-Type":            c.contentType,
					"X-Content-Type-Options":  "nosniff",
					"Referrer-Policy":         "no-referrer",
					"Cache-Control":           "no-cache",
					"Content-Security-Policy": wantCSP,
					"Content-Length":          strconv.Itoa(len(want)),
				} {
					if got := res.Header.Get(h); got != v {
						t.Errorf("%s = %q, want %q", h, got, v)
					}
				}
				etag := res.Header.Get("ETag")
				if len(etag) < 3 || etag[0] != '"' || etag[len(etag)-1] != '"' || strings.HasPrefix(etag, "W/") {
					t.Errorf("ETag = %q, want a strong entity tag", etag)
				}
				if res.Header.Get("Last-Modified") != "" {
					t.Errorf("Last-Modified = %q, want none: the ETag alone decides", res.Header.Get("Last-Modified"))
				}
				wantBody := want
				if method == http.MethodHead {
					wantBody = nil
				}
				if !bytes.Equal(body, wantBody) {
					t.Errorf("body of %d bytes is not the embedded %s (%d bytes)", len(body), c.file, len(wantBody))
				}
			})
		}
	}
}

// A browser revalidating with the ETag gets a 304 without a body; a stale
// or foreign tag gets the file. The 304 keeps the caching headers.
func TestETagRevalidation(t *testing.T) {
	p := newPage(t)
	get := func(path string, inm ...string) *http.Response {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		for _, v := range inm {
			r.Header.Add("If-None-Match", v)
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		return rec.Result()
	}
	for _, path := range p.Paths() {
		etag := get(path).Header.Get("ETag")
		cases := []struct {
			name string
			inm  []string
			want int
		}{
			{"same tag", []string{etag}, http.StatusNotModified},
			{"in a list", []string{`"other", ` + etag}, http.StatusNotModified},
			{"in the second line of the list", []string{`"other"`, `W/"another", ` + etag}, http.StatusNotModified},
			{"weak form", []string{"W/" + etag}, http.StatusNotModified},
			{"star", []string{"*"}, http.StatusNotModified},
			{"stale tag", []string{`"0123"`}, http.StatusOK},
			{"none", nil, http.StatusOK},
		}
		for _, c := range cases {
			t.Run(path+" "+c.name, func(t *testing.T) {
				res := get(path, c.inm...)
				body, _ := io.ReadAll(res.Body)
				if res.StatusCode != c.want {
					t.Fatalf("status %d, want %d", res.StatusCode, c.want)
				}
				if c.want == http.StatusNotModified {
					if len(body) != 0 {
						t.Errorf("304 with %d body bytes", len(body))
					}
					if res.Header.Get("ETag") != etag || res.Header.Get("Cache-Control") != "no-cache" {
						t.Errorf("304 headers ETag %q Cache-Control %q, want %q and no-cache",
							res.Header.Get("ETag"), res.Header.Get("Cache-Control"), etag)
					}
				}
			})
		}
	}
	// Different files have different tags: one file's tag revalidates no
	// other.
	seen := map[string]string{}
	for _, path := range p.Paths() {
		tag := get(path).Header.Get("ETag")
		if other, dup := seen[tag]; dup {
			t.Errorf("%s and %s share the ETag %s", path, other, tag)
		}
		seen[tag] = path
	}
}

// Only the exact paths are files; anything else is a 404 and never the
// page (the router answers them first in the control plane; this is the
// handler's own guard).
func TestUnknownPaths(t *testing.T) {
	p := newPage(t)
	for _, path := range []string{"/machines/other", "/machines/", "/machines/index.html", "/machines/app.js/",
		"/machines/third_party/tus-js-client/tus.min.js.map", "/machines/../machines", "/machines/%61pp.js", "/"} {
		t.Run(path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.URL.RawPath, r.URL.Path = "", path
			if strings.Contains(path, "%") {
				r.URL.RawPath, r.URL.Path = path, "/machines/app.js"
			}
			p.ServeHTTP(rec, r)
			if rec.Code != http.StatusNotFound {
				t.Errorf("status %d, want 404", rec.Code)
			}
		})
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/machines", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /machines: %d Allow %q, want 405 with Allow: GET, HEAD", rec.Code, rec.Header().Get("Allow"))
	}
}

// The CSP names the data plane's origin, whatever path or slash its URL
// has, and New refuses what is not an http(s) URL.
func TestDataPlaneOrigin(t *testing.T) {
	for _, c := range []struct{ url, origin string }{
		{"http://127.0.0.1:8480", "http://127.0.0.1:8480"},
		{"https://edge.example/", "https://edge.example"},
		{"https://edge.example:8443/up/load", "https://edge.example:8443"},
	} {
		p, err := New(c.url, "")
		if err != nil {
			t.Fatalf("New(%q): %v", c.url, err)
		}
		if want := CSP(c.origin); p.csp != want || !strings.Contains(want, "connect-src 'self' "+c.origin+";") {
			t.Errorf("New(%q) CSP %q, want %q", c.url, p.csp, want)
		}
	}
	for _, bad := range []string{"", "/upload", "ftp://host", "http://", "http://u:p@host"} {
		if _, err := New(bad, ""); err == nil {
			t.Errorf("New(%q) = nil error, want a refusal", bad)
		}
	}
}

// The CSP names the consoles' WebSocket origin (a browser of CSP level 2
// does not count ws: as 'self'), and New refuses a console URL that is
// not ws: or wss:.
func TestConsoleOrigin(t *testing.T) {
	for _, c := range []struct{ base, origin string }{
		{"ws://127.0.0.1:8481", "ws://127.0.0.1:8481"},
		{"wss://edge.example/", "wss://edge.example"},
		{"wss://edge.example:8443/market", "wss://edge.example:8443"},
	} {
		p, err := New(dataPlane, c.base)
		if err != nil {
			t.Fatalf("New(%q): %v", c.base, err)
		}
		if want := "connect-src 'self' " + dataPlane + " " + c.origin + ";"; !strings.Contains(p.csp, want) {
			t.Errorf("New(_, %q) CSP %q, want %q in it", c.base, p.csp, want)
		}
	}
	for _, bad := range []string{"http://127.0.0.1:8481", "ws://", "127.0.0.1:8481", "wss://u:p@edge.example"} {
		if _, err := New(dataPlane, bad); err == nil {
			t.Errorf("New(_, %q) = nil error, want a refusal", bad)
		}
	}
}

// The page has no inline script or style, which the CSP would block: every
// script is a file of the page, every style is the stylesheet.
func TestNoInlineCode(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("static", "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	html := string(b)
	for _, bad := range []string{"<style", " style=", " onclick=", " onload=", " onsubmit=", " onchange=", "javascript:", "http://", "https://"} {
		if strings.Contains(html, bad) {
			t.Errorf("index.html contains %q: blocked by the CSP or fetched from elsewhere", bad)
		}
	}
	// tus-js-client is a classic script the modules find as window.tus;
	// app.js is the page's one entry point, importing the other modules.
	for _, src := range []string{`<script defer src="/machines/third_party/tus-js-client/tus.min.js"></script>`,
		`<script type="module" src="/machines/app.js"></script>`} {
		if !strings.Contains(html, src) {
			t.Errorf("index.html lacks %s", src)
		}
	}
	if n := strings.Count(html, "<script"); n != 2 {
		t.Errorf("index.html has %d script elements, want tus-js-client and app.js", n)
	}
}

// The page's scripts are ES modules: each is served, as JavaScript (a
// browser refuses a module of another type, and nosniff holds it to the
// type it is told), and every module one imports is served where its
// import finds it. A module left out of the files table, or served with a
// type the browser refuses, would leave the page without its scripts.
func TestModulesServedAsJavaScript(t *testing.T) {
	p := newPage(t)
	scripts, err := filepath.Glob(filepath.Join("static", "*.js"))
	if err != nil || len(scripts) < 10 {
		t.Fatalf("static/*.js: %d files (%v), want the page's modules", len(scripts), err)
	}
	imports := regexp.MustCompile(`(?m)^(?:import|export)\b[^'"]*?\bfrom\s+'([^']+)'|^import\s+'([^']+)'`)
	served := func(urlPath string) string {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, urlPath, nil))
		if rec.Code != http.StatusOK {
			return ""
		}
		return rec.Header().Get("Content-Type")
	}
	for _, s := range scripts {
		name := filepath.Base(s)
		if ct := served("/machines/" + name); ct != "text/javascript; charset=utf-8" {
			t.Errorf("/machines/%s: Content-Type %q, want text/javascript (or not served at all)", name, ct)
		}
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range imports.FindAllStringSubmatch(string(b), -1) {
			spec := m[1] + m[2]
			if !strings.HasPrefix(spec, "./") {
				t.Errorf("%s imports %q: the page imports its own files by relative path only", name, spec)
				continue
			}
			target := path.Join("/machines", spec)
			if ct := served(target); ct != "text/javascript; charset=utf-8" {
				t.Errorf("%s imports %s, served with Content-Type %q, want text/javascript", name, target, ct)
			}
		}
	}
	for _, name := range []string{"x.mjs", "x.js"} {
		if got := typeOf(name); got != "text/javascript; charset=utf-8" {
			t.Errorf("typeOf(%q) = %q, want text/javascript", name, got)
		}
	}
}
