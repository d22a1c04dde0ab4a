// Package apierr carries an HTTP status and a machine-readable reason with an
// error from where it is decided to the handler that writes it, so that
// handlers only translate and never decide.
package apierr

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Error is an error a client is meant to see: a status, a stable reason code
// (docs/api.md "Errors" lists them) and a human sentence. Err, if set, is the internal cause;
// it is never shown to the client.
type Error struct {
	Status int
	Reason string
	Msg    string
	Err    error
	// RetryAfter, if positive, is sent as the answer's Retry-After header
	// (seconds): the error carries it, so that no writer has to know
	// which reasons want one.
	RetryAfter int
}

// New returns an error with the given status, reason and message.
func New(status int, reason, msg string) *Error {
	return &Error{Status: status, Reason: reason, Msg: msg}
}

// Wrap returns an error that shows status, reason and msg to the client and
// keeps err as its cause for logs and errors.Is.
func Wrap(err error, status int, reason, msg string) *Error {
	return &Error{Status: status, Reason: reason, Msg: msg, Err: err}
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// WithRetryAfter sets e's Retry-After in seconds and returns e.
func (e *Error) WithRetryAfter(seconds int) *Error {
	e.RetryAfter = seconds
	return e
}

// From returns the *Error in err's chain, or a 500 "internal" error that
// hides err's text from the client.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Status: http.StatusInternalServerError, Reason: "internal",
		Msg: "internal error; the operator's log has the details", Err: err}
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
