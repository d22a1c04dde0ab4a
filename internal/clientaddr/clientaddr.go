// Package clientaddr decides which address a request comes from, the same
// way on both planes: the TCP peer, unless the peer is a reverse proxy the
// operator trusts (--trusted-proxies), in which case the address that proxy
// forwards is believed. The result keys the data plane's miss limiter and
// is the "remote" of both planes' log lines.
package clientaddr

import (
	"fmt"
	"net/netip"
	"strings"
)

// Proxies are the reverse proxies whose Forwarded / X-Forwarded-For
// headers are believed. The zero value trusts nobody: any client can write
// those headers, so they mean something only from a known hop.
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

// Client returns the address of the client behind peer. values returns
// every value of a request header by name ("Forwarded", "X-Forwarded-For"),
// in the order received. When peer is a trusted proxy, the forwarded
// addresses are read from the nearest hop back (the right-most first) and
// the first one that is not itself a trusted proxy is the client: the
// entries to its left were written by hops nobody vouches for. A hop that
// does not parse (an obfuscated name like "unknown") stops the walk at the
// last address that did.
func (p Proxies) Client(peer netip.Addr, values func(name string) []string) netip.Addr {
	peer = peer.Unmap()
	if !p.Trusts(peer) {
		return peer
	}
	hops := forwardedFor(values)
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break
		}
		addr = a
		if !p.Trusts(a) {
			break
		}
	}
	return addr
}

// forwardedFor lists the client addresses the forwarding headers name,
// nearest hop last: the for= parameters of the Forwarded headers (RFC 7239)
// if there are any, else the X-Forwarded-For entries. The two are not
// mixed: a proxy writes one or the other.
func forwardedFor(values func(name string) []string) []string {
	var hops []string
	for _, v := range values("Forwarded") {
		for _, elem := range strings.Split(v, ",") {
			for _, pair := range strings.Split(elem, ";") {
				name, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(name, "for") {
					hops = append(hops, val)
				}
			}
		}
	}
	if len(hops) > 0 {
		return hops
	}
	for _, v := range values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
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
