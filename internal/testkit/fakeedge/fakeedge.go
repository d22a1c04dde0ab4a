// Package fakeedge is a fake vmshelf edge for the upload client's tests: a
// loopback httptest server that speaks the control plane's ticket and
// status routes and tus 1.0.0 creation, HEAD and PATCH as `vmshelf serve`
// does, for one upload at a time.
//
// It exists because the client's hard cases are ones the real edge cannot
// be made to do on cue: a PATCH cut partway (a proxy's restart), the
// answer to a creation lost after the session was made, a stored digest
// that is not the bytes' (a file changed, or bytes changed on the way),
// 503 busy with Retry-After on a chosen route. It needs no qemu, no store
// and no serve, and it records every request it answered, with when the
// request arrived and when its answer was written, so that a test can hold
// the client to the exact exchange and to its waits as the edge saw them.
package fakeedge

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// Route names a kind of request the fake edge answers.
type Route string

// The routes, as serve has them. A request on no route is recorded with
// its method and path as its Route.
const (
	Ticket Route = "ticket" // POST /market/vm-images/ticket
	Create Route = "create" // tus creation: POST on a ticket's upload URL
	Head   Route = "head"   // tus HEAD on the session
	Patch  Route = "patch"  // tus PATCH on the session
	Status Route = "status" // POST /market/vms/status
)

const (
	ticketPath    = "/market/vm-images/ticket"
	statusPath    = "/market/vms/status"
	uploadPrefix  = "/market/vm-images/upload/"
	sessionPrefix = "/market/vm-images/upload-sessions/"
)

// VirtualSize is the virtual size the fake edge lists for every stored
// image: it keeps the bytes but does not read them as a disk.
const VirtualSize = 64 << 20

// Options are what the fake edge does that a healthy edge would not.
// The zero value is a healthy edge.
type Options struct {
	// CutFirstPatchAfter makes the first PATCH keep this many bytes of its
	// body and close the connection without an answer, as a proxy's
	// restart does; 0 cuts nothing.
	CutFirstPatchAfter int
	// LoseFirstCreation makes the first creation make its session, which
	// uses its ticket, and then close the connection without an answer:
	// a retry with that ticket is the edge's 410 ticketUsed.
	LoseFirstCreation bool
	// WrongDigest makes the status list a stored image with a sha256
	// other than that of the bytes it holds.
	WrongDigest bool
	// Busy holds, per route, the Retry-After seconds of 503 busy answers
	// to give, one per request and in order, before that route is served
	// again. A PATCH is refused before its body is read, as serve does.
	Busy map[Route][]int
}

// Request is one request the fake edge answered.
type Request struct {
	Route  Route
	Status int       // the answer's status; 0 if the connection was closed instead
	At     time.Time // when the request arrived, before its body was read
	Done   time.Time // when its answer was written
}

// String is the route and the status, "patch 204" (or "patch hung up").
func (r Request) String() string {
	if r.Status == 0 {
		return string(r.Route) + " hung up"
	}
	return fmt.Sprintf("%s %d", r.Route, r.Status)
}

// Edge is a running fake edge. Its exported fields are set by Start and
// never change; the rest is read through its methods, safe to call while
// a client is uploading.
type Edge struct {
	URL      string // the control plane's base URL, on 127.0.0.1
	Token    string // the tenant's bearer token, which both control routes want
	UploadID string // the image every ticket is for: the edge keeps one

	t   testing.TB
	srv *httptest.Server

	mu       sync.Mutex
	opts     Options
	name     string          // the last ticket's image name
	efi      bool            // the last ticket's EFI flag
	tickets  map[string]bool // every ticket handed out: whether a creation used it
	session  string          // the id of the last creation's session; "" before one
	length   int64           // that session's Upload-Length
	held     []byte          // that session's bytes
	sessions int             // sessions created
	received int             // PATCH body bytes taken, over every session
	reported string          // the sha256 the status last listed
	requests []Request
}

// Start starts a fake edge on a loopback address, closed when the test
// ends. o's Busy map is copied: the caller's is left alone.
func Start(t testing.TB, o Options) *Edge {
	t.Helper()
	o.Busy = maps.Clone(o.Busy)
	for route, waits := range o.Busy {
		o.Busy[route] = slices.Clone(waits)
	}
	e := &Edge{
		Token: randomHex(32), UploadID: randomHex(12),
		t: t, opts: o, tickets: map[string]bool{},
	}
	// The handler reads e.srv.URL, which Start sets before it serves: e.srv
	// must be in place before the server starts.
	e.srv = httptest.NewUnstartedServer(e)
	e.srv.Start()
	e.URL = e.srv.URL
	t.Cleanup(e.srv.Close)
	return e
}

// randomHex is n random bytes in hex, shaped as the edge's tokens and ids
// are. crypto/rand.Read never fails (Go 1.24 and later).
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Client is an HTTP client for the edge's server.
func (e *Edge) Client() *http.Client { return e.srv.Client() }

// TokenFile writes the edge's token to a 0600 file in dir, as a box keeps
// it, and returns its path.
func (e *Edge) TokenFile(dir string) string {
	e.t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte(e.Token+"\n"), 0o600); err != nil {
		e.t.Fatalf("write the fake edge's token file: %v", err)
	}
	return p
}

// Requests are the requests answered so far, in the order they were
// answered.
func (e *Edge) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requests)
}

// Tally is what the edge has taken of the upload so far.
type Tally struct {
	Tickets  int    // tickets handed out
	Sessions int    // sessions created
	Received int    // PATCH body bytes taken over every session: a byte sent twice counts twice
	Held     []byte // the last session's bytes (a copy)
	Reported string // the sha256 the status last listed, "" if it listed none
}

// Tally is what the edge has taken so far.
func (e *Edge) Tally() Tally {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Tally{Tickets: len(e.tickets), Sessions: e.sessions, Received: e.received, Held: slices.Clone(e.held), Reported: e.reported}
}

// ServeHTTP answers one request and records it.
func (e *Edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	route, status := e.serve(w, r)
	e.mu.Lock()
	e.requests = append(e.requests, Request{Route: route, Status: status, At: at, Done: time.Now()})
	e.mu.Unlock()
}

func (e *Edge) serve(w http.ResponseWriter, r *http.Request) (Route, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == ticketPath:
		return Ticket, e.ticket(w, r)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, uploadPrefix):
		return Create, e.create(w, r, strings.TrimPrefix(r.URL.Path, uploadPrefix))
	case r.Method == http.MethodHead && strings.HasPrefix(r.URL.Path, sessionPrefix):
		return Head, e.head(w, strings.TrimPrefix(r.URL.Path, sessionPrefix))
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, sessionPrefix):
		return Patch, e.patch(w, r, strings.TrimPrefix(r.URL.Path, sessionPrefix))
	case r.Method == http.MethodPost && r.URL.Path == statusPath:
		return Status, e.status(w, r)
	}
	// serve has more routes; a client that asks one of them here does
	// something its test did not expect.
	e.t.Errorf("the fake edge got %s %s, which it has no route for", r.Method, r.URL.Path)
	return Route(r.Method + " " + r.URL.Path), refuse(w, apierr.New(reason.NotFound))
}

func (e *Edge) ticket(w http.ResponseWriter, r *http.Request) int {
	if r.Header.Get("Authorization") != "Bearer "+e.Token {
		return refuse(w, apierr.New(reason.Unauthorized))
	}
	if status, ok := e.refuseBusy(w, Ticket); ok {
		return status
	}
	var req struct {
		Name string `json:"name"`
		EFI  bool   `json:"efi"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return refuse(w, apierr.New(reason.BadRequest).WithMsg(fmt.Sprintf("the ticket request is not JSON: %v", err)))
	}
	tk := randomHex(32)
	e.tickets[tk] = false
	e.name, e.efi = req.Name, req.EFI
	return answerJSON(w, http.StatusCreated, map[string]any{
		"ticket": tk, "upload_id": e.UploadID, "upload_url": e.srv.URL + uploadPrefix + tk,
		"expires_at": time.Now().Add(time.Hour).UTC(),
	})
}

func (e *Edge) create(w http.ResponseWriter, r *http.Request, tk string) int {
	used, ok := e.tickets[tk]
	if !ok {
		return refuse(w, apierr.New(reason.TicketUnknown))
	}
	n, err := strconv.ParseInt(r.Header.Get("Upload-Length"), 10, 64)
	if r.Header.Get("Tus-Resumable") != "1.0.0" || err != nil || n < 0 {
		return refuse(w, apierr.New(reason.BadRequest).WithMsg("tus creation needs Tus-Resumable: 1.0.0 and Upload-Length"))
	}
	if used {
		return refuse(w, apierr.New(reason.TicketUsed))
	}
	e.tickets[tk] = true
	e.sessions++
	e.session, e.length, e.held = randomHex(32), n, nil
	if e.opts.LoseFirstCreation {
		e.opts.LoseFirstCreation = false
		return e.hangUp(w)
	}
	w.Header().Set("Tus-Resumable", "1.0.0")
	w.Header().Set("Location", sessionPrefix+e.session)
	w.WriteHeader(http.StatusCreated)
	return http.StatusCreated
}

func (e *Edge) head(w http.ResponseWriter, sid string) int {
	if e.session == "" || sid != e.session {
		return refuse(w, apierr.New(reason.SessionUnknown))
	}
	w.Header().Set("Tus-Resumable", "1.0.0")
	w.Header().Set("Upload-Offset", strconv.Itoa(len(e.held)))
	w.Header().Set("Upload-Length", strconv.FormatInt(e.length, 10))
	w.WriteHeader(http.StatusOK)
	return http.StatusOK
}

func (e *Edge) patch(w http.ResponseWriter, r *http.Request, sid string) int {
	if e.session == "" || sid != e.session {
		return refuse(w, apierr.New(reason.SessionUnknown))
	}
	if status, ok := e.refuseBusy(w, Patch); ok {
		return status
	}
	held := int64(len(e.held))
	off, err := strconv.ParseInt(r.Header.Get("Upload-Offset"), 10, 64)
	if err != nil || off != held {
		return refuse(w, apierr.New(reason.OffsetMismatch).WithHeader("Upload-Offset", strconv.FormatInt(held, 10)))
	}
	rest := e.length - held
	if cut := e.opts.CutFirstPatchAfter; cut > 0 {
		e.opts.CutFirstPatchAfter = 0
		b, _ := io.ReadAll(io.LimitReader(r.Body, min(int64(cut), rest)))
		e.take(b)
		return e.hangUp(w)
	}
	// One byte more than the session lacks tells a body that is too long.
	b, err := io.ReadAll(io.LimitReader(r.Body, rest+1))
	e.take(b[:min(int64(len(b)), rest)])
	switch {
	case err != nil:
		return refuse(w, apierr.New(reason.IncompleteBody))
	case int64(len(b)) > rest:
		return refuse(w, apierr.New(reason.BadRequest).WithMsg("the body is longer than the upload's rest"))
	}
	w.Header().Set("Tus-Resumable", "1.0.0")
	w.Header().Set("Upload-Offset", strconv.Itoa(len(e.held)))
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// take adds the bytes of a PATCH body to the session.
func (e *Edge) take(b []byte) {
	e.held = append(e.held, b...)
	e.received += len(b)
}

func (e *Edge) status(w http.ResponseWriter, r *http.Request) int {
	if r.Header.Get("Authorization") != "Bearer "+e.Token {
		return refuse(w, apierr.New(reason.Unauthorized))
	}
	images := []map[string]any{}
	if e.session != "" && int64(len(e.held)) == e.length {
		sum := sha256.Sum256(e.held)
		if e.opts.WrongDigest {
			sum[0] ^= 1
		}
		e.reported = hex.EncodeToString(sum[:])
		images = append(images, map[string]any{
			"upload_id": e.UploadID, "name": e.name, "efi": e.efi, "size": e.length,
			"virtual_size": VirtualSize, "sha256": e.reported, "created_at": time.Now().UTC(),
		})
	}
	return answerJSON(w, http.StatusOK, map[string]any{"available": true, "images": images})
}

// refuseBusy answers 503 busy with the next Retry-After queued for route,
// if one is.
func (e *Edge) refuseBusy(w http.ResponseWriter, route Route) (int, bool) {
	waits := e.opts.Busy[route]
	if len(waits) == 0 {
		return 0, false
	}
	e.opts.Busy[route] = waits[1:]
	return refuse(w, apierr.New(reason.Busy).WithRetryAfter(waits[0])), true
}

// hangUp closes the request's connection without an answer.
func (e *Edge) hangUp(w http.ResponseWriter) int {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		e.t.Errorf("the fake edge could not take the connection over to hang up: %v", err)
		return 0
	}
	if err := conn.Close(); err != nil {
		e.t.Errorf("the fake edge could not hang up: %v", err)
	}
	return 0
}

// refuse writes the error answer of a, in the JSON shape serve's have.
func refuse(w http.ResponseWriter, a *apierr.Error) int {
	a.EachHeader(w.Header().Set)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.JSON())
	return a.Status
}

func answerJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
	return status
}
