// Package apierr carries an HTTP status and a machine-readable reason with an
// error from where it is decided to the handler that writes it, so that
// handlers only translate and never decide.
//
// Every answer is built from an entry of the table of reasons
// (internal/reason), so its status and reason code are the table's:
// apierr.New(reason.TicketUsed), apierr.Wrap(err, reason.Internal), and
// WithMsg where the place that refuses says more than the table's words.
//
// An answer code keys behaviour on (how a transfer is counted, whether a
// session ends, a log level) is declared once as a package-level *Error and
// recognised with errors.Is, never by comparing Reason with a literal: a
// misspelt reason then fails to compile instead of silently moving an
// answer to another class. The With* methods make copies, so a declared
// value is never changed, and every copy still matches it (see Is).
package apierr

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/vmshelf/vmshelf/internal/reason"
)

// Error is an error a client is meant to see: a status, a stable reason code
// (an entry of internal/reason's table, which docs/api.md "Errors" lists)
// and a human sentence. Err, if set, is the internal cause;
// it is never shown to the client.
//
// The answer's headers that belong to the error travel with it (the model
// is tusd's handler.Error with its HTTPResponse): the code that decides the
// error knows them, the writer applies them (EachHeader), and nothing sets
// a header on a response as a side effect of building an error that may
// not be the one answered.
type Error struct {
	Status int
	Reason string
	Msg    string
	Err    error
	// RetryAfter, if positive, is sent as the answer's Retry-After header
	// (seconds). It has a field of its own because it is the header most
	// refusals carry.
	RetryAfter int
	// Header holds the answer's other headers, in the order they are set
	// (Upload-Offset of a tus 409, Content-Range of a 416...).
	Header []Field
}

// Field is one answer header.
type Field struct{ Name, Value string }

// New returns the answer of the table's entry r: its status, its reason
// code and its words.
func New(r reason.Code) *Error {
	return &Error{Status: r.Status(), Reason: r.Name(), Msg: r.Words()}
}

// Wrap returns New(r) with err as its cause, for logs and errors.Is; the
// client never sees err.
func Wrap(err error, r reason.Code) *Error {
	e := New(r)
	e.Err = err
	return e
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, declared) true when err's chain holds an *Error
// with declared's status and reason: the status and reason are what a
// client tells answers apart by, so they are the identity. The message,
// the cause and the headers are not compared: they vary from one answer
// to the next (a size, a timeout, an offset) without making it another.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && t.Status == e.Status && t.Reason == e.Reason
}

// clone copies e; its header list is copied too, so that appending to the
// copy's never writes into e's.
func (e *Error) clone() *Error {
	c := *e
	c.Header = slices.Clone(e.Header)
	return &c
}

// WithCause returns a copy of e with err as its cause.
func (e *Error) WithCause(err error) *Error {
	c := e.clone()
	c.Err = err
	return c
}

// WithMsg returns a copy of e that says msg.
func (e *Error) WithMsg(msg string) *Error {
	c := e.clone()
	c.Msg = msg
	return c
}

// WithRetryAfter returns a copy of e answered with Retry-After: seconds.
func (e *Error) WithRetryAfter(seconds int) *Error {
	c := e.clone()
	c.RetryAfter = seconds
	return c
}

// WithHeader returns a copy of e answered with the header name: value,
// which replaces one of that name e already carries.
func (e *Error) WithHeader(name, value string) *Error {
	c := e.clone()
	for i, f := range c.Header {
		if strings.EqualFold(f.Name, name) {
			c.Header[i].Value = value
			return c
		}
	}
	c.Header = append(c.Header, Field{Name: name, Value: value})
	return c
}

// EachHeader calls set for each header of e's answer: Retry-After first,
// then Header in order. set is the writer's own, e.g. a fasthttp
// ResponseHeader's Set or an http.Header's.
func (e *Error) EachHeader(set func(name, value string)) {
	if e.RetryAfter > 0 {
		set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	for _, f := range e.Header {
		set(f.Name, f.Value)
	}
}

// From returns the *Error in err's chain, or a 500 "internal" error that
// hides err's text from the client.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Wrap(err, reason.Internal)
}

// Body is the JSON shape of every error answer.
type Body struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

// JSON returns the error's answer body.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(Body{Error: e.Msg, Reason: e.Reason})
	return b
}
