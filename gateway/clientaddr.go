package gateway

import (
	"net/netip"
	"strings"

	"github.com/valyala/fasthttp"
)

// clientAddr is the address a request comes from, the key of the miss
// limiter and the "remote" of the logs: the peer's IP, never its port.
// When the peer is one of Config.TrustedProxies, the address it forwards
// (Forwarded: for=, else X-Forwarded-For) is believed: the right-most one
// that is not itself a trusted proxy. Anyone else's forwarding headers are
// ignored, since any client can write them.
func (g *Gateway) clientAddr(ctx *fasthttp.RequestCtx) string {
	peer, ok := netip.AddrFromSlice(ctx.RemoteIP())
	if !ok {
		return ctx.RemoteIP().String()
	}
	peer = peer.Unmap()
	if !g.trusted(peer) {
		return peer.String()
	}
	hops := forwardedFor(ctx)
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break // a hop we cannot read: stop at the last one we could
		}
		addr = a
		if !g.trusted(a) {
			break
		}
	}
	return addr.String()
}

func (g *Gateway) trusted(a netip.Addr) bool {
	for _, p := range g.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedFor lists the client addresses the forwarding headers name,
// nearest hop last: the for= parameters of every Forwarded header if there
// is one, else every X-Forwarded-For entry.
func forwardedFor(ctx *fasthttp.RequestCtx) []string {
	var hops []string
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		if strings.EqualFold(string(k), "Forwarded") {
			for _, elem := range strings.Split(string(v), ",") {
				for _, pair := range strings.Split(elem, ";") {
					name, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(name, "for") {
						hops = append(hops, val)
					}
				}
			}
		}
	})
	if len(hops) > 0 {
		return hops
	}
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		if strings.EqualFold(string(k), "X-Forwarded-For") {
			hops = append(hops, strings.Split(string(v), ",")...)
		}
	})
	return hops
}

// parseHop reads one forwarded address: 192.0.2.1, "[2001:db8::1]:4711",
// 192.0.2.1:80. Obfuscated names ("unknown", "_hidden") do not parse.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
