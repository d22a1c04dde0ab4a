// Package clientaddr decides which address a request comes from, the same
// way on both planes: the TCP peer, unless the peer is a reverse proxy the
// operator trusts (--trusted-proxies), in which case the address that proxy
// forwards, in the one header it writes (--forwarded-header), is believed.
// The result keys the data plane's miss limiter and is the "remote" of both
// planes' log lines.
package clientaddr

import (
	"fmt"
	"net/netip"
	"strings"
)

// Proxies are the reverse proxies whose forwarding header is believed. The
// zero value trusts nobody: any client can write such a header, so it
// means something only from a known hop.
type Proxies []netip.Prefix

// The widest prefixes a list may trust. A trusted proxy's forwarding
// headers are believed, so trusting a prefix as wide as 0.0.0.0/0 or ::/0
// lets every client on the internet write the address it wants logged and
// rate-limited. A /8 is the widest private IPv4 range (10.0.0.0/8) and a
// /32 the smallest allocation a provider gets in IPv6; unique local
// addresses (fc00::/7) are private at any width.
const (
	minBitsIPv4 = 8
	minBitsIPv6 = 32
)

var uniqueLocal = netip.MustParsePrefix("fc00::/7")

// Parse reads a comma-separated list of CIDRs (10.0.0.0/8, fd00::/8) or
// bare addresses (192.0.2.7, meaning that address alone). Blank items are
// skipped; an empty list trusts nobody. An IPv4-mapped prefix
// (::ffff:10.0.0.0/104) is read as the IPv4 prefix it maps, as addresses
// are compared unmapped. A prefix wider than minBitsIPv4 or minBitsIPv6
// (outside fc00::/7) is refused. The error names the item.
func Parse(list string) (Proxies, error) {
	var out Proxies
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(item, "/") {
			p, err = netip.ParsePrefix(item)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(item); err == nil && a.Zone() == "" {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil || !p.IsValid() {
			return nil, fmt.Errorf("%q is not a CIDR (10.0.0.0/8) or an address", item)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if tooWide(p) {
			return nil, fmt.Errorf("%q trusts too much of the internet: any client in it could forge the address it is logged and limited by; "+
				"list the proxies' own addresses or prefixes (at most /%d for IPv4, /%d for IPv6 outside fc00::/7)", item, minBitsIPv4, minBitsIPv6)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// tooWide reports whether p is wider than a list may trust.
func tooWide(p netip.Prefix) bool {
	if p.Addr().Is4() {
		return p.Bits() < minBitsIPv4
	}
	if p.Bits() >= uniqueLocal.Bits() && uniqueLocal.Contains(p.Addr()) {
		return false
	}
	return p.Bits() < minBitsIPv6
}

// Trusts reports whether a is one of the proxies.
func (p Proxies) Trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, pr := range p {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// Header is the forwarding header a trusted proxy writes, the only one
// read. A proxy rewrites the header it writes and passes any other on as
// the client sent it: Traefik, nginx's and HAProxy's usual setups and the
// common ingress controllers replace or append to X-Forwarded-For and
// leave a client's Forwarded alone. Reading both, or the other one when
// the proxy's is missing, would let every client choose the address it is
// logged and limited by. The zero value is X-Forwarded-For.
type Header int

const (
	// XForwardedFor is the de-facto list of addresses, one per hop,
	// nearest last.
	XForwardedFor Header = iota
	// Forwarded is RFC 7239's header; its for= parameters are the hops.
	Forwarded
)

// String is the header's name as it is sent.
func (h Header) String() string {
	if h == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// ParseHeader reads a header's name, in any case: X-Forwarded-For or
// Forwarded.
func ParseHeader(name string) (Header, error) {
	for _, h := range []Header{XForwardedFor, Forwarded} {
		if strings.EqualFold(strings.TrimSpace(name), h.String()) {
			return h, nil
		}
	}
	return 0, fmt.Errorf("%q is not a forwarding header vmshelf reads: X-Forwarded-For or Forwarded", name)
}

// Trust is whom the forwarded address is believed from, and in which
// header. The zero value trusts nobody.
type Trust struct {
	Proxies Proxies
	Header  Header
}

// Client returns the address of the client behind peer. values returns
// every value of a request header by name, in the order received. When
// peer is a trusted proxy, the hops of t.Header (all its lines, read as
// one list in order) are read from the nearest back (the right-most
// first), and the first one that is not itself a trusted proxy is the
// client: the entries to its left were written by hops nobody vouches
// for. A hop that does not parse (an obfuscated name like "unknown", an
// empty entry, an element of Forwarded without for=) ends the walk at the
// last trusted address before it: what lies beyond an unreadable hop is
// anybody's writing.
func (t Trust) Client(peer netip.Addr, values func(name string) []string) netip.Addr {
	peer = peer.Unmap()
	if !t.Proxies.Trusts(peer) {
		return peer
	}
	var hops []string
	if t.Header == Forwarded {
		hops = forwardedFor(values("Forwarded"))
	} else {
		for _, v := range values("X-Forwarded-For") {
			hops = append(hops, strings.Split(v, ",")...)
		}
	}
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break
		}
		addr = a
		if !t.Proxies.Trusts(a) {
			break
		}
	}
	return addr
}

// forwardedFor lists the for= parameter of each element of the Forwarded
// lines (RFC 7239 4), nearest hop last; "" for an element without one.
// Commas and semicolons inside a quoted string separate nothing.
func forwardedFor(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, elem := range splitUnquoted(line, ',') {
			hop := ""
			for _, pair := range splitUnquoted(elem, ';') {
				name, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(name, "for") {
					hop = val
					break
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// splitUnquoted splits s at each sep outside a quoted string (RFC 9110
// 5.6.4, with its backslash escapes).
func splitUnquoted(s string, sep byte) []string {
	var parts []string
	quoted, escaped, from := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[from:i])
			from = i + 1
		}
	}
	return append(parts, s[from:])
}

// parseHop reads one forwarded address: 192.0.2.1, "[2001:db8::1]:4711",
// 192.0.2.1:80. Obfuscated names ("unknown", "_hidden"), an empty entry
// and a quote left open do not parse.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if unq, ok := strings.CutPrefix(s, `"`); ok {
		if s, ok = strings.CutSuffix(unq, `"`); !ok {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if ap, perr := netip.ParseAddrPort(s); perr == nil {
		a, err = ap.Addr(), nil
	}
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
