package stripetest

import "net/http"

// Canned is an answer a test fixes for one route, in place of what the
// stand-in would answer: for the shapes of Stripe's answers that no state
// of the fake produces (a proxy's HTML page, a rate limit, an error that
// quotes the key, silence).
type Canned struct {
	Status int
	// Header is set after the defaults (JSON, CannedRequestID), so it may
	// replace them.
	Header map[string]string
	Body   string
	// Hold, if set, holds the answer until the request ends (its client
	// gave up) or Hold closes; then nothing is written. It plays a Stripe
	// that never answers.
	Hold <-chan struct{}
}

// CannedRequestID is the Request-Id of a canned answer, which the
// caller's errors then carry; the stand-in's own answers carry another.
const CannedRequestID = "req_fake1"

// Answer makes method and path (e.g. "POST", "/v1/refunds") answer status
// with the JSON body, whatever the fake's state, key or Down say.
func (s *Server) Answer(method, path string, status int, body string) {
	s.AnswerWith(method, path, Canned{Status: status, Body: body})
}

// AnswerWith makes method and path answer c, whatever the fake's state,
// key or Down say. The request is recorded all the same (History).
func (s *Server) AnswerWith(method, path string, c Canned) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.canned[method+" "+path] = c
}

// cannedFor is the canned answer of r's route, if a test set one. s.mu
// is held.
func (s *Server) cannedFor(r *http.Request) (Canned, bool) {
	c, ok := s.canned[r.Method+" "+r.URL.Path]
	return c, ok
}

// serveCanned writes c, or holds it (Canned.Hold). s.mu is not held, so
// a held answer stops no other request.
func serveCanned(w http.ResponseWriter, r *http.Request, c Canned) {
	if c.Hold != nil {
		select {
		case <-r.Context().Done():
		case <-c.Hold:
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", CannedRequestID)
	for k, v := range c.Header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(c.Status)
	_, _ = w.Write([]byte(c.Body))
}
