// Package web is the Machines page of the control plane: a handful of
// static files, embedded in the binary, that talk to the tenants' API
// (same origin) and upload to the data plane with tus-js-client. There is
// no build step and nothing is fetched from another site: what the binary
// serves is what is in static/.
//
// Every answer carries a Content-Security-Policy that allows scripts and
// styles from the page's own origin only (no inline code), and network
// requests to the page's origin, the data plane's and the consoles'
// WebSocket origin: a token pasted into the page can only ever travel to
// the edge itself.
//
// Two libraries are vendored unchanged from npm, each in its own folder
// with its licence (static/README.md says how to update them): noVNC for a
// machine's screen and xterm.js for its serial console. They are ES
// modules, served file by file, as their packages ship them.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/internal/baseurl"
)

// The page's files: its own, named one by one, and the libraries vendored
// from npm, each in its folder under static/third_party. The READMEs and
// the third-party manifest are for developers and stay out of the binary.
//
//go:embed static/index.html static/style.css static/*.js
//go:embed static/third_party/novnc static/third_party/xterm static/third_party/tus-js-client
var static embed.FS

// vendored are the folders of the libraries vendored from npm: every file
// in them is served under /machines/third_party/<folder>/, its type by its
// extension.
var vendored = []string{"third_party/novnc", "third_party/xterm", "third_party/tus-js-client"}

// files are the page's paths and what each serves, its type by its
// extension: exact paths, since the control plane's router has no
// prefixes. Every script is an ES module that imports the others by
// name, app.js the one index.html loads.
var files = []struct{ path, file string }{
	{"/machines", "index.html"},
	{"/machines/app.js", "app.js"},
	{"/machines/qcow2.js", "qcow2.js"},
	{"/machines/format.js", "format.js"},
	{"/machines/style.css", "style.css"},
	{"/machines/console.js", "console.js"},
	{"/machines/api.js", "api.js"},
	{"/machines/reasons.js", "reasons.js"},
	{"/machines/dom.js", "dom.js"},
	{"/machines/money.js", "money.js"},
	{"/machines/status.js", "status.js"},
	{"/machines/images.js", "images.js"},
	{"/machines/orders.js", "orders.js"},
	{"/machines/power.js", "power.js"},
	{"/machines/listings.js", "listings.js"},
	{"/machines/uploads.js", "uploads.js"},
	{"/machines/transfer.js", "transfer.js"},
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
// Config.PublicURL, e.g. "http://127.0.0.1:8480") and consoles reached at
// consoleBase (market Config.ConsoleBase, e.g. "ws://127.0.0.1:8481"; ""
// for an edge without consoles): their origins are the places besides the
// page's own the page may send requests to.
func New(dataPlaneURL, consoleBase string) (*Page, error) {
	origin, err := originOf(dataPlaneURL)
	if err != nil {
		return nil, err
	}
	origins := []string{origin}
	if consoleBase != "" {
		ws, err := wsOriginOf(consoleBase)
		if err != nil {
			return nil, err
		}
		origins = append(origins, ws)
	}
	p := &Page{assets: make(map[string]asset, len(files)), csp: CSP(origins...)}
	for _, f := range files {
		if err := p.add(f.path, path.Join("static", f.file), typeOf(f.file)); err != nil {
			return nil, err
		}
	}
	for _, dir := range vendored {
		err := fs.WalkDir(static, path.Join("static", dir), func(name string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			return p.add("/machines/"+strings.TrimPrefix(name, "static/"), name, typeOf(name))
		})
		if err != nil {
			return nil, fmt.Errorf("web: the embedded %s: %w", dir, err)
		}
	}
	return p, nil
}

// add serves the embedded file name at urlPath.
func (p *Page) add(urlPath, name, contentType string) error {
	b, err := fs.ReadFile(static, name)
	if err != nil {
		return fmt.Errorf("web: the embedded %s: %w", name, err)
	}
	sum := sha256.Sum256(b)
	p.assets[urlPath] = asset{body: b, contentType: contentType,
		etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
	p.paths = append(p.paths, urlPath)
	return nil
}

// typeOf is the Content-Type of a file of the page by its extension: the
// page, scripts, styles, and the rest (licences, AUTHORS) plain text. A
// module script must be served as JavaScript, or the browser refuses it
// (and nosniff makes the browser hold the page to the type it is told).
func typeOf(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	}
	return "text/plain; charset=utf-8"
}

// originOf is scheme://host[:port] of an absolute http(s) URL.
func originOf(raw string) (string, error) {
	u, err := baseurl.Parse(strings.TrimRight(raw, "/"))
	if err != nil || u.User != nil {
		return "", fmt.Errorf("web: data plane URL %q is not an http(s) URL like http://host:port", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

// wsOriginOf is ws(s)://host[:port] of a console base URL.
func wsOriginOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" || u.User != nil {
		return "", fmt.Errorf("web: console URL %q is not a ws(s) URL like ws://host:port", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

// CSP is the Content-Security-Policy of every file of the page, for a data
// plane at origins[0] and the consoles' WebSocket at origins[1], if any.
// 'self' covers the control plane's API; the data plane the uploads; the
// console's origin is named because 'self' covers ws: only in browsers of
// CSP level 3. No inline script or style is allowed, no frame may embed the
// page (a token form in someone else's frame), and no form may be sent
// anywhere by the browser itself: the page's forms are handled in script.
func CSP(origins ...string) string {
	return "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self' " + strings.Join(origins, " ") + "; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
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
	http.ServeContent(w, oneLineLists(r), "", time.Time{}, bytes.NewReader(a.body))
}

// oneLineLists is r with each of If-None-Match and If-Match in one line:
// they are lists, which may come in several lines (RFC 9110 5.3), and
// ServeContent reads the first line alone. r itself is left as it is.
func oneLineLists(r *http.Request) *http.Request {
	for _, name := range []string{"If-None-Match", "If-Match"} {
		if lines := r.Header.Values(name); len(lines) > 1 {
			r = r.Clone(r.Context())
			r.Header.Set(name, strings.Join(lines, ", "))
		}
	}
	return r
}
