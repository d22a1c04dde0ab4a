package market

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/vmshelf/vmshelf/internal/apierr"
)

// maxBody caps every control-plane request body (SPEC "Errors"). The
// largest body of any route (an order's user data, 16 KiB) fits with room.
const maxBody = 64 << 10

// errTooLarge is the answer to a body over maxBody. We chose 413 tooLarge
// over 400 badRequest: it names the actual problem, and it is the reason the
// data plane uses for the same fault.
var errTooLarge = apierr.New(http.StatusRequestEntityTooLarge, "tooLarge",
	"the request body is larger than 64 KiB")

func badRequest(msg string) error {
	return apierr.New(http.StatusBadRequest, "badRequest", msg)
}

// decodeBody reads r's body into dst, which must point to a struct. The body
// must be exactly one JSON object with only known fields. With allowEmpty an
// empty (or all-blank) body counts as {}.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) error {
	// A declared length over the cap is refused before reading a byte.
	if r.ContentLength > maxBody {
		return errTooLarge
	}
	// MaxBytesReader also catches chunked bodies and lying lengths, and
	// tells net/http to close the connection instead of draining the rest.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return errTooLarge
		}
		return badRequest("the request body could not be read")
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		if allowEmpty {
			return nil
		}
		return badRequest("the request body is empty; a JSON object is expected")
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
