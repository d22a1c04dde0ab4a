package market

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/headwatch"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// router maps an exact path to its methods. It is deliberately smaller than
// http.ServeMux: no prefix ("/x/") patterns, no redirects for trailing
// slashes or unclean paths, and its own JSON 404/405, so that every answer of
// the control plane has the shape of docs/api.md "Errors".
type router struct {
	routes map[string]*route
	// observe is told the route label and status of every request; it is
	// how request metrics get a bounded "route" label.
	observe func(route string, code int)
	// fail writes an error answer (shared with the handlers so that 404 and
	// 405 are logged and shaped like every other error).
	fail func(w http.ResponseWriter, r *http.Request, err error)
}

type route struct {
	pattern string
	methods map[string]http.HandlerFunc
	allow   string // the Allow header for 405 answers
}

// otherRoute is the metrics label of every request that matched no route, so
// that scanners probing random paths cannot grow the label set.
const otherRoute = "other"

func newRouter(observe func(string, int), fail func(http.ResponseWriter, *http.Request, error)) *router {
	return &router{routes: map[string]*route{}, observe: observe, fail: fail}
}

// handle registers h for method on the exact path. A GET route also answers
// HEAD (net/http drops the body), as probes and curl -I expect.
func (rt *router) handle(method, path string, h http.HandlerFunc) {
	ro := rt.routes[path]
	if ro == nil {
		ro = &route{pattern: path, methods: map[string]http.HandlerFunc{}}
		rt.routes[path] = ro
	}
	if _, dup := ro.methods[method]; dup {
		panic("market: route registered twice: " + method + " " + path)
	}
	ro.methods[method] = h
	if method == http.MethodGet {
		if _, ok := ro.methods[http.MethodHead]; !ok {
			ro.methods[http.MethodHead] = h
		}
	}
	allow := make([]string, 0, len(ro.methods))
	for m := range ro.methods {
		allow = append(allow, m)
	}
	slices.Sort(allow)
	ro.allow = strings.Join(allow, ", ")
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	label := otherRoute
	defer func() {
		// A panicking handler is counted as the 500 it becomes, then
		// left to net/http, which logs it and drops the connection.
		if p := recover(); p != nil {
			rt.observe(label, http.StatusInternalServerError)
			panic(p)
		}
		rt.observe(label, sw.code())
	}()

	// Match the path as it was sent: "/healthz" but not "/healthz/",
	// "//healthz" or "/%68ealthz". EscapedPath is the wire form whenever
	// it differs from the default encoding.
	ro := rt.routes[r.URL.EscapedPath()]
	if ro != nil {
		label = ro.pattern
		r.Pattern = ro.pattern // for logs, as http.ServeMux would set it
	}
	// Before anything else, on any path: a head that reads two ways (a
	// header of one value given twice, a body framed by both lengths).
	// The connection closes after it: the bytes before a head a proxy
	// framed otherwise are not what the proxy sent either.
	if aerr := headwatch.Judge(r); aerr != nil {
		sw.Header().Set("Connection", "close")
		rt.fail(sw, r, aerr)
		return
	}
	if ro == nil {
		rt.fail(sw, r, apierr.New(reason.NotFound))
		return
	}
	h := ro.methods[r.Method]
	if h == nil {
		sw.Header().Set("Allow", ro.allow)
		rt.fail(sw, r, apierr.New(reason.MethodNotAllowed).
			WithMsg("this route does not accept "+strconv.Quote(r.Method)+"; it accepts "+ro.allow))
		return
	}
	h(sw, r)
}

// statusClientGone is the request counter's code of a request whose
// client left before its answer (nginx's 499): it got nothing.
const statusClientGone = 499

// statusWriter remembers the status a handler wrote, for the request
// counter.
type statusWriter struct {
	http.ResponseWriter
	status int
	gone   bool // the answer did not reach the client (clientGone)
	// bodyRead is set once a handler read the request body to its end:
	// until then an error answer closes the connection rather than wait
	// for the rest of a body nobody needs.
	bodyRead bool
}

// bodyRead notes that w's request body was read to its end.
func bodyRead(w http.ResponseWriter) {
	if sw, ok := w.(*statusWriter); ok {
		sw.bodyRead = true
	}
}

// bodyUnread reports whether the request r that w answers has a body that
// was not read to its end.
func bodyUnread(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength == 0 {
		return false
	}
	sw, ok := w.(*statusWriter)
	return !ok || !sw.bodyRead
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are interim, not the answer
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer (flush,
// deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clientGone notes that w's answer did not reach its client, which then
// counts as statusClientGone whatever was written.
func clientGone(w http.ResponseWriter) {
	if sw, ok := w.(*statusWriter); ok {
		sw.gone = true
	}
}

func (w *statusWriter) code() int {
	if w.gone {
		return statusClientGone
	}
	if w.status == 0 {
		return http.StatusOK // a handler that wrote nothing answered 200
	}
	return w.status
}
