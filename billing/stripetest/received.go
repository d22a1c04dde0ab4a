package stripetest

import (
	"net/http"
	"net/url"
	"slices"
)

// Request is one API request as the fake received it, before it decided
// anything: also the repeats, the ones it refused or failed, the ones a
// canned answer (AnswerWith) or Down answered, and the ones held.
type Request struct {
	Method, Path string
	Query        url.Values
	Form         url.Values // the body's form
	Header       http.Header
	// Chunked is whether the body came with Transfer-Encoding: chunked.
	// stripe-go sends its forms so, and net/http's server undoes it
	// before ParseForm, so Form alone would not tell.
	Chunked     bool
	Idempotency string // the Idempotency-Key header
}

// History returns every API request received so far, oldest first. The
// browser's pages (onboarding, checkout) are not the API and are not in it.
func (s *Server) History() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// Received returns every POST to path (e.g. "/v1/refunds") received so
// far, oldest first.
func (s *Server) Received(path string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.received {
		if r.Method == http.MethodPost && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// Requests is the number of API requests received so far.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.received)
}

// record keeps r, whose form is parsed, for History. s.mu is held.
func (s *Server) record(r *http.Request) {
	s.received = append(s.received, Request{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Form: r.PostForm,
		Header: r.Header.Clone(), Chunked: slices.Contains(r.TransferEncoding, "chunked"),
		Idempotency: r.Header.Get("Idempotency-Key"),
	})
}
