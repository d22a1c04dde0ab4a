// Package web is the Machines page of the control plane: a handful of
// static files, embedded in the binary, that talk to the tenants' API
// (same origin) and upload to the data plane with tus-js-client. There is
// no build step and nothing is fetched from another site: what the binary
// serves is what is in static/.
//
// Every answer carries a Content-Security-Policy that allows scripts and
// styles from the page's own origin only (no inline code), and network
// requests to the page's origin and the data plane's: a token pasted into
// the page can only ever travel to the edge itself.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/internal/baseurl"
)

// The page's files, named one by one: static/README.md (where tus.min.js
// comes from) is for developers and stays out of the binary.
//
//go:embed static/index.html static/app.js static/qcow2.js static/format.js static/style.css
//go:embed static/tus.min.js static/tus-js-client-LICENSE.txt
var static embed.FS

// files are the page's paths and what each serves: exact paths, since the
// control plane's router has no prefixes.
var files = []struct{ path, file, contentType string }{
	{"/machines", "index.html", "text/html; charset=utf-8"},
	{"/machines/app.js", "app.js", "text/javascript; charset=utf-8"},
	{"/machines/qcow2.js", "qcow2.js", "text/javascript; charset=utf-8"},
	{"/machines/format.js", "format.js", "text/javascript; charset=utf-8"},
	{"/machines/style.css", "style.css", "text/css; charset=utf-8"},
	{"/machines/tus.min.js", "tus.min.js", "text/javascript; charset=utf-8"},
	{"/machines/tus-js-client-LICENSE.txt", "tus-js-client-LICENSE.txt", "text/plain; charset=utf-8"},
}

type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Page serves the Machines page's files. Build it with New; it is
// immutable and safe for concurrent use.
type Page struct {
	assets map[string]asset
	paths  []string
	csp    string
}

// New builds the page for a data plane reached at dataPlaneURL (market
// Config.PublicURL, e.g. "http://127.0.0.1:8480"): its origin is the one
// place besides the page's own the page may send requests to.
func New(dataPlaneURL string) (*Page, error) {
	origin, err := originOf(dataPlaneURL)
	if err != nil {
		return nil, err
	}
	p := &Page{assets: make(map[string]asset, len(files)), csp: CSP(origin)}
	for _, f := range files {
		b, err := fs.ReadFile(static, path.Join("static", f.file))
		if err != nil {
			return nil, fmt.Errorf("web: the embedded %s: %w", f.file, err)
		}
		sum := sha256.Sum256(b)
		p.assets[f.path] = asset{body: b, contentType: f.contentType,
			etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
		p.paths = append(p.paths, f.path)
	}
	return p, nil
}

// originOf is scheme://host[:port] of an absolute http(s) URL.
func originOf(raw string) (string, error) {
	u, err := baseurl.Parse(strings.TrimRight(raw, "/"))
	if err != nil || u.User != nil {
		return "", fmt.Errorf("web: data plane URL %q is not an http(s) URL like http://host:port", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

// CSP is the Content-Security-Policy of every file of the page, for a data
// plane at origin. 'self' covers the control plane's API; origin the
// uploads. No inline script or style is allowed, no frame may embed the
// page (a token form in someone else's frame), and no form may be sent
// anywhere by the browser itself: the page's forms are handled in script.
func CSP(origin string) string {
	return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self' " + origin + "; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
}

// Paths are the exact paths to register for GET and HEAD, the page's own
// ("/machines") first.
func (p *Page) Paths() []string { return slices.Clone(p.paths) }

// ServeHTTP answers GET and HEAD of the page's paths; any other path is a
// 404 and any other method a 405 (the control plane's router answers those
// itself, in its JSON shape, before they get here).
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, ok := p.assets[r.URL.EscapedPath()]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	// Upload session URLs are capabilities: no request of the page may
	// carry its address, or anything else, to another site.
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", p.csp)
	// Revalidated on every load, so a new binary's page is never mixed
	// with an old cached script; the ETag makes that a 304.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	// ServeContent does If-None-Match (304), HEAD and Content-Length; no
	// modification time, so the ETag alone decides.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
