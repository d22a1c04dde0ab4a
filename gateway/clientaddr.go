package gateway

import (
	"net/netip"
	"strings"

	"github.com/valyala/fasthttp"
)

// clientAddr is the address a request comes from, the key of the miss
// limiter and the "remote" of the logs: the peer's IP, never its port, or
// the client a trusted proxy forwards (clientaddr.Trust.Client, the rule
// the control plane follows too).
func (g *Gateway) clientAddr(ctx *fasthttp.RequestCtx) string {
	peer, ok := netip.AddrFromSlice(ctx.RemoteIP())
	if !ok {
		return ctx.RemoteIP().String()
	}
	return g.cfg.TrustedProxies.Client(peer, func(name string) []string {
		return headerValues(&ctx.Request.Header, name)
	}).String()
}

// headerValues returns every value of the request header name, matched
// case-insensitively, in the order received.
func headerValues(h *fasthttp.RequestHeader, name string) []string {
	var vs []string
	for k, v := range h.All() {
		if strings.EqualFold(string(k), name) {
			vs = append(vs, string(v))
		}
	}
	return vs
}
