package gateway

import (
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/internal/logsample"
)

// CORS for the data plane, so that the Machines page (served by the
// control plane, on another origin) and any page the operator allows can
// upload with tus-js-client and read the answers. The capability in the
// URL is the authority, so credentials (cookies) are never allowed.
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
// preflight; it reports whether it answered the request. An origin not
// allowed gets no CORS headers (the browser then keeps the answer from
// the page) and its first request is logged.
func (g *Gateway) cors(ctx *fasthttp.RequestCtx) bool {
	origin := string(ctx.Request.Header.Peek("Origin"))
	if origin == "" || len(g.cfg.CORSOrigins) == 0 {
		return false
	}
	if !slices.Contains(g.cfg.CORSOrigins, origin) && !slices.Contains(g.cfg.CORSOrigins, "*") {
		g.corsRefused.log(g.log, origin, logsample.Redact(string(ctx.Path())))
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

// maxCORSRefusedLogged bounds the origins whose refusal is remembered:
// origins are the client's to choose, and each is logged once.
const maxCORSRefusedLogged = 64

// corsRefusals logs the first browser request of each origin the data
// plane does not allow, so that an operator who opened the page from
// another address learns why its uploads fail and which flag allows it.
type corsRefusals struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (c *corsRefusals) log(log *slog.Logger, origin, path string) {
	c.mu.Lock()
	n, seen := len(c.seen), c.seen[origin]
	if !seen && n <= maxCORSRefusedLogged {
		if c.seen == nil {
			c.seen = map[string]bool{}
		}
		c.seen[origin] = true
	}
	c.mu.Unlock()
	switch {
	case seen || n > maxCORSRefusedLogged:
	case n == maxCORSRefusedLogged:
		log.Warn("browser pages on more origins this edge does not allow tried the data plane; no further origin is logged")
	default:
		log.Warn("a browser page on an origin this edge does not allow tried the data plane; its browser keeps the answer from it. "+
			"If that page is yours, allow it with --cors-origin (or open the Machines page at the address the edge hands out)",
			"origin", origin, "path", path, "flag", "--cors-origin "+origin)
	}
}
