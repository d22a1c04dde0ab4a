package gateway

import (
	"strings"

	"github.com/valyala/fasthttp"
)

// CORS for the data plane, so that a page on another origin (the box's own
// web UI) can upload with tus-js-client and read the answers. Off unless
// Config.CORSOrigin is set. The capability in the URL is the authority, so
// credentials (cookies) are never allowed.
var (
	corsAllowMethods = "POST, GET, HEAD, PATCH, DELETE, PUT, OPTIONS"
	corsAllowHeaders = strings.Join([]string{
		"Content-Type", "Upload-Length", "Upload-Offset", "Tus-Resumable", "Upload-Metadata",
		"Upload-Defer-Length", "Upload-Concat", "Upload-Checksum", "X-Requested-With", "X-HTTP-Method-Override", "Range", "If-Range",
	}, ", ")
	corsExposeHeaders = strings.Join([]string{
		"Location", "Upload-Offset", "Upload-Length", "Upload-Expires", "Upload-Metadata", "Tus-Resumable",
		"Tus-Version", "Tus-Extension", "Tus-Max-Size", "Retry-After", "ETag", "Content-Range", "Content-Length", "Accept-Ranges",
	}, ", ")
)

// cors adds the CORS headers for an allowed origin and answers a
// preflight; it reports whether it answered the request.
func (g *Gateway) cors(ctx *fasthttp.RequestCtx) bool {
	origin := string(ctx.Request.Header.Peek("Origin"))
	if g.cfg.CORSOrigin == "" || origin == "" || (g.cfg.CORSOrigin != "*" && origin != g.cfg.CORSOrigin) {
		return false
	}
	h := &ctx.Response.Header
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
	if !ctx.IsOptions() || len(ctx.Request.Header.Peek("Access-Control-Request-Method")) == 0 {
		return false
	}
	h.Set("Access-Control-Allow-Methods", corsAllowMethods)
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
	h.Set("Access-Control-Max-Age", "86400")
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}
