// Package headerrule is the edge's one reading of a request head, the same
// on both planes: a header whose value is one item is given at most once,
// and a body is framed by Content-Length or by Transfer-Encoding, never by
// both. Of two lines of one header a proxy in front of the edge may keep
// the first and the edge the last (or join them), and of two framings each
// may pick another: the body one reads is then the next request of the
// other (request smuggling). Refusing the request is the only reading all
// of them share.
//
// A header whose value is a list (RFC 9110 5.3: Accept, Cache-Control,
// Forwarded, X-Forwarded-For, If-None-Match...) may come in several
// lines; they are one list, joined by commas, and are not refused here.
package headerrule

import (
	"strings"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// The answers to a head read two ways. Both planes answer them; the
// connection closes after either, since the bytes before a head a proxy
// framed otherwise are not what the proxy sent either.
var (
	// RepeatedHeader: a header of one value in more than one line (the
	// message names it).
	RepeatedHeader = apierr.New(reason.RepeatedHeader)
	// AmbiguousLength: the body's length is framed two ways.
	AmbiguousLength = apierr.New(reason.AmbiguousLength)
	// TransferEncodingBeforeHTTP11 is AmbiguousLength for a request older
	// than HTTP/1.1 with a Transfer-Encoding (RFC 9112 6.1: its framing is
	// faulty, whatever else it gives).
	TransferEncodingBeforeHTTP11 = AmbiguousLength.WithMsg(
		"Transfer-Encoding is not defined before HTTP/1.1, so the body's length is not clear; send Content-Length")
)

// singles are the headers whose value is one item, by the specification
// that defines them, and that the edge, a proxy before it or a library it
// uses acts on. Each is refused when given twice:
//   - framing and routing (RFC 9112 6.1-6.3, 3.2): Content-Length (even
//     twice with the same value, which RFC 9110 8.6 lets a server merge),
//     Transfer-Encoding (the edge takes only "chunked", and chunked twice
//     is forbidden), Host;
//   - the body and the credential: Content-Type, Authorization;
//   - conditional and range requests (RFC 9110 13, 14): Range, If-Range,
//     If-Modified-Since, If-Unmodified-Since (If-Match and If-None-Match
//     are lists);
//   - Expect: a list by its grammar, but 100-continue is the only
//     expectation there is, and both servers of the edge read the first
//     line alone where a proxy joining the lines reads another;
//   - tus 1.0: Tus-Resumable, Upload-Offset, Upload-Length,
//     Upload-Defer-Length, Upload-Metadata (one line of pairs);
//   - browsers (RFC 6454 7, Fetch): Origin, Access-Control-Request-Method;
//   - WebSocket (RFC 6455 11.3.1, 11.3.5): Sec-WebSocket-Key,
//     Sec-WebSocket-Version;
//   - Stripe's webhook: Stripe-Signature (one timestamp and its
//     signatures).
//
// X-HTTP-Method-Override is not honoured by the edge, so it is not here.
// At most 32: they are a bit set (Head.seen).
var singles = [...]string{
	"Content-Length", "Transfer-Encoding", "Host",
	"Content-Type", "Authorization",
	"Range", "If-Range", "If-Modified-Since", "If-Unmodified-Since",
	"Expect",
	"Tus-Resumable", "Upload-Offset", "Upload-Length", "Upload-Defer-Length", "Upload-Metadata",
	"Origin", "Access-Control-Request-Method",
	"Sec-WebSocket-Key", "Sec-WebSocket-Version",
	"Stripe-Signature",
}

// The framing headers' places in singles.
const (
	contentLength    = 0
	transferEncoding = 1
)

// longestSingle is the length of the longest name in singles.
const longestSingle = len("Access-Control-Request-Method")

// byLength lists singles' indexes by the length of their names, and
// lowered has the names in lower case: a line's name is compared with the
// few of its length only, one case folded.
var (
	byLength = func() (t [longestSingle + 1][]uint8) {
		for i, name := range singles {
			t[len(name)] = append(t[len(name)], uint8(i))
		}
		return t
	}()
	lowered = func() (t [len(singles)]string) {
		for i, name := range singles {
			t[i] = strings.ToLower(name)
		}
		return t
	}()
)

// Head judges one request head, a header line at a time. The zero value is
// a head with no line yet. It allocates nothing.
type Head struct {
	seen     uint32 // the singles given, a bit each
	repeated uint8  // 1 + the index of the first single given twice; 0: none
}

// Line takes the name of the head's next header line, as it came (any
// case).
func (h *Head) Line(name []byte) {
	i, ok := single(name)
	if !ok {
		return
	}
	bit := uint32(1) << i
	if h.seen&bit != 0 && h.repeated == 0 {
		h.repeated = i + 1
	}
	h.seen |= bit
}

// TransferEncoding reports whether the head has a Transfer-Encoding line.
func (h *Head) TransferEncoding() bool { return h.seen&(1<<transferEncoding) != 0 }

// Refusal is the answer to the head, or nil when it reads one way only.
// http11 is false for a request older than HTTP/1.1, which has no
// Transfer-Encoding.
func (h *Head) Refusal(http11 bool) *apierr.Error {
	switch {
	case h.repeated != 0:
		return Repeated(singles[h.repeated-1])
	case h.TransferEncoding() && h.seen&(1<<contentLength) != 0:
		return AmbiguousLength
	case h.TransferEncoding() && !http11:
		return TransferEncodingBeforeHTTP11
	}
	return nil
}

// Repeated is the answer to a head that gives the header name more than
// once.
func Repeated(name string) *apierr.Error {
	return RepeatedHeader.WithMsg("the header " + name + " is given more than once; it carries one value, send it once")
}

// single returns the index in singles of the header name, if it is one.
func single(name []byte) (uint8, bool) {
	if len(name) > longestSingle {
		return 0, false
	}
	for _, i := range byLength[len(name)] {
		if equalLower(name, lowered[i]) {
			return i, true
		}
	}
	return 0, false
}

// equalLower compares an ASCII header name with the lower-case s, which
// has b's length, ignoring b's case.
func equalLower(b []byte, s string) bool {
	for i := range len(b) {
		if lower(b[i]) != s[i] {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
