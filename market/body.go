package market

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// maxBody caps every control-plane request body (64 KiB, docs/api.md
// "Control plane"). The
// largest body of any route (an order's user data, 16 KiB) fits with room.
const maxBody = 64 << 10

// errTooLarge is the answer to a body over maxBody. We chose 413 tooLarge
// over 400 badRequest: it names the actual problem, and it is the reason the
// data plane uses for the same fault.
var errTooLarge = apierr.New(reason.TooLarge)

func badRequest(msg string) error {
	return apierr.New(reason.BadRequest).WithMsg(msg)
}

// errUnsupportedMediaType is the answer to a body that is not declared
// JSON: the control plane reads nothing else, and refusing other types
// keeps a form post from a browser page (text/plain, form encodings: no
// CORS preflight) away from the tenants' routes.
var errUnsupportedMediaType = apierr.New(reason.UnsupportedMediaType)

// errRequestTimeout is the answer to a body that did not arrive within
// Config.BodyTimeout; the connection is closed after it.
var errRequestTimeout = apierr.New(reason.RequestTimeout)

// DefaultBodyTimeout is Config.BodyTimeout's default: a body of at most
// 64 KiB that takes longer than this is not a slow client but one holding
// a connection.
const DefaultBodyTimeout = 10 * time.Second

// maxDepth bounds the nesting the key check walks; no request of the
// control plane nests at all.
const maxDepth = 32

// decodeBody reads r's body into dst, which must point to a struct. The body
// must be declared application/json (415 otherwise) and be exactly one JSON
// object in valid UTF-8, with only known fields, each spelt exactly as
// dst's json tags spell it and given once (400). With allowEmpty an empty
// (or all-blank) body counts as {}, and needs no Content-Type. A body that
// does not arrive within Config.BodyTimeout is 408, and the connection is
// closed.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) error {
	if r.ContentLength != 0 && !isJSON(r.Header.Get("Content-Type")) {
		return errUnsupportedMediaType
	}
	// A declared length over the cap is refused before reading a byte.
	if r.ContentLength > maxBody {
		return errTooLarge
	}
	// The deadline is on the socket, so it is wall-clock time, not the
	// injected clock. Set before the first read, it also bounds a client
	// that dribbles a byte now and then. Writers that cannot take a
	// deadline (tests' recorders) only lose the bound.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	// MaxBytesReader also catches chunked bodies and lying lengths, and
	// tells net/http to close the connection instead of draining the rest.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return errTooLarge
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return errRequestTimeout
		}
		return badRequest("the request body could not be read")
	}
	// The whole body is in. net/http clears the deadline itself when the
	// body hits its end (it starts its background read then), so it
	// neither cuts the handler's work nor the connection's next request.
	bodyRead(w)
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		if allowEmpty {
			return nil
		}
		return badRequest("the request body is empty; a JSON object is expected")
	}
	// encoding/json would quietly turn invalid UTF-8 into U+FFFD.
	if !utf8.Valid(body) {
		return badRequest("the request body is not valid UTF-8")
	}
	// json would happily decode null (or nothing at all) into a struct;
	// only an object is a request.
	if body[0] != '{' {
		return badRequest("the request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest(describeJSONError(err))
	}
	// Exactly one value: `{...}{...}` or `{...} x` is refused rather than
	// half-read.
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("the request body has data after the JSON object")
	}
	// encoding/json would quietly turn an escaped half of a surrogate
	// pair into U+FFFD, as it does invalid UTF-8.
	if err := checkSurrogates(body); err != nil {
		return err
	}
	// encoding/json matches keys case-insensitively and keeps the last of
	// duplicates; what it decoded is not necessarily what the client
	// meant, so both are refused.
	return checkKeys(body, fieldNames(dst))
}

// checkSurrogates refuses a \u escape of a UTF-16 surrogate that is not
// half of a pair: a high one (D800–DBFF) not followed at once by an
// escaped low one (DC00–DFFF), or a low one alone. Such text is not
// Unicode, and encoding/json would store U+FFFD in its place. body is
// valid JSON already, so a backslash is always the start of an escape
// inside a string, and every \u has four hex digits.
func checkSurrogates(body []byte) error {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		if i+6 > len(body) {
			break // not reached: the body is valid JSON
		}
		if body[i+1] != 'u' {
			i++ // \", \\, \n…: the escaped character is no escape itself
			continue
		}
		r := escapedUnit(body[i+2 : i+6])
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00 && i+12 <= len(body) && body[i+6] == '\\' && body[i+7] == 'u' &&
			isLowSurrogate(escapedUnit(body[i+8:i+12])):
			i += 11 // the pair
		case utf16.IsSurrogate(r):
			return badRequest("the request body has a \\u escape of half a UTF-16 surrogate pair without its other half (near byte " +
				strconv.Itoa(i) + "); text must be Unicode characters")
		default:
			i += 5
		}
	}
	return nil
}

// escapedUnit is the UTF-16 code unit of the four hex digits of a \u
// escape.
func escapedUnit(hex []byte) rune {
	n, err := strconv.ParseUint(string(hex), 16, 16)
	if err != nil {
		return utf8.RuneError // not reached: the body is valid JSON
	}
	return rune(n)
}

func isLowSurrogate(r rune) bool { return r >= 0xDC00 && r <= 0xDFFF }

// isJSON reports whether a Content-Type header names JSON: the media type
// application/json (any case), with no charset or charset=utf-8.
func isJSON(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}

// fieldNames returns the JSON names of the fields of the struct dst points
// to, as encoding/json spells them.
func fieldNames(dst any) map[string]bool {
	names := map[string]bool{}
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return names
	}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}

// checkKeys walks body, one JSON object already known to be valid, with
// json.Decoder's tokens: a key given twice in any object, or a top-level
// key that is not exactly one of fields, is a bad request.
func checkKeys(body []byte, fields map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // the opening brace
		return badRequest(describeJSONError(err))
	}
	return walkObject(dec, fields, 1)
}

// walkObject checks the keys of the object whose opening brace dec just
// read, and consumes it up to its closing brace. fields is nil below the
// top level: there only duplicates are looked for.
func walkObject(dec *json.Decoder, fields map[string]bool, depth int) error {
	if depth > maxDepth {
		return badRequest("the request body nests too deeply")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return badRequest(describeJSONError(err))
		}
		key, _ := tok.(string)
		if seen[key] {
			return badRequest("the request body has the field " + quoteField(key) + " more than once")
		}
		seen[key] = true
		if fields != nil && !fields[key] {
			for f := range fields {
				if strings.EqualFold(f, key) {
					return badRequest("the request body has the field " + quoteField(key) +
						"; field names are case-sensitive: write " + quoteField(f))
				}
			}
			return badRequest("the request body has an unknown field " + quoteField(key))
		}
		if err := walkValue(dec, depth); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return badRequest(describeJSONError(err))
	}
	return nil
}

// walkValue consumes one value, checking the objects in it.
func walkValue(dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return badRequest(describeJSONError(err))
	}
	switch tok {
	case json.Delim('{'):
		return walkObject(dec, nil, depth+1)
	case json.Delim('['):
		if depth+1 > maxDepth {
			return badRequest("the request body nests too deeply")
		}
		for dec.More() {
			if err := walkValue(dec, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing bracket
			return badRequest(describeJSONError(err))
		}
	}
	return nil
}

// describeJSONError turns a decoding error into a sentence for the client.
func describeJSONError(err error) string {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return "the request body is not valid JSON (near byte " + strconv.FormatInt(se.Offset, 10) + ")"
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "the request body ends in the middle of the JSON object"
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return "field " + quoteField(te.Field) + " must be " + kindName(te.Type)
	}
	// DisallowUnknownFields has no typed error; its text is stable API.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "the request body has an unknown field " + quoteField(strings.Trim(name, `"`))
	}
	return "the request body is not an acceptable JSON object"
}

// quoteField quotes a client-chosen field name, cut short so that an
// answer never echoes much of the request.
func quoteField(name string) string {
	const max = 64
	if len(name) > max {
		name = name[:max] + "…"
	}
	return `"` + strings.ToValidUTF8(name, "?") + `"`
}

func kindName(t reflect.Type) string {
	if t == nil {
		return "of another type"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}
