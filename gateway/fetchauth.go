package gateway

import (
	"net/http"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// fetchCapability is what a fetch presents. The route has two forms:
//
//   - /market/vm-images/fetch/{token}: the 64-hex token is the last path
//     segment (uploadID is empty);
//   - /market/vm-images/fetch/{upload_id}: the URL names only the image and
//     the token comes in the Authorization header, so that the provisioner
//     can hand it to CDI in a Secret (secretExtraHeaders, or a secretRef's
//     basic-auth password) instead of in the DataVolume's URL. The token
//     must name that very image.
//
// Everything after this point (lookup, miss limiter, slot, ranges) is the
// same for both; the slot is keyed by token, so both forms of one token
// share it.
type fetchCapability struct {
	token    string
	uploadID string // the image the header form names; "" for the path form
}

// errNoCredential is the header form's answer to a request without a
// usable Authorization header. It is not a miss: nothing was looked up.
func errNoCredential(ctx *fasthttp.RequestCtx) *apierr.Error {
	// Both schemes are accepted; Bearer is what CDI's secretExtraHeaders
	// send, Basic what its secretRef (accessKeyId/secretKey) sends.
	ctx.Response.Header.Add("WWW-Authenticate", `Bearer realm="vmshelf"`)
	ctx.Response.Header.Add("WWW-Authenticate", `Basic realm="vmshelf"`)
	return apierr.New(reason.Unauthorized).WithMsg(
		"this fetch URL names an image: send its fetch token as Authorization: Bearer <token> (or as the basic-auth password)")
}

// fetchCapabilityOf reads the capability of a fetch whose last path
// segment is last: a well-formed upload id takes the token from the
// Authorization header, anything else is the path form's token (checked,
// like any token, by the lookup).
func fetchCapabilityOf(ctx *fasthttp.RequestCtx, last string) (fetchCapability, *apierr.Error) {
	if !imagestore.ValidUploadID(last) {
		return fetchCapability{token: last}, nil
	}
	token, ok := credential(string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)))
	if !ok {
		return fetchCapability{}, errNoCredential(ctx)
	}
	return fetchCapability{token: token, uploadID: last}, nil
}

// credential extracts the secret of an Authorization header: the token of
// "Bearer <token>", or the password of "Basic <base64(user:password)>"
// whatever the user name. The schemes are case-insensitive (RFC 9110
// §11.1). ok is false for no header, another scheme, a malformed one or an
// empty secret. The secret's shape is the lookup's business, as in the
// path form.
func credential(h string) (secret string, ok bool) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		secret = strings.TrimSpace(rest)
	case strings.EqualFold(scheme, "Basic"):
		// net/http's parser, not a second one: base64, the first colon
		// splits user from password.
		r := http.Request{Header: http.Header{"Authorization": {strings.TrimSpace(h)}}}
		_, secret, _ = r.BasicAuth()
	}
	return secret, secret != ""
}
