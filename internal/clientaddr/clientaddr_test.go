package clientaddr

import (
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Proxies
		wantErr string // a part of the error; "" for none
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"10.1.2.3/8", Proxies{netip.MustParsePrefix("10.0.0.0/8")}, ""},
		// A bare address is that address alone, never a wider prefix.
		{"192.168.1.7", Proxies{netip.MustParsePrefix("192.168.1.7/32")}, ""},
		{"::1, fd00::/8", Proxies{netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fd00::/8")}, ""},
		{"10.0.0.0/33", nil, `"10.0.0.0/33"`},
		{"10.0.0.0/8,proxy.example", nil, `"proxy.example"`},
		{"fe80::1%eth0", nil, `"fe80::1%eth0"`},
		// A prefix so wide it trusts the world (or a good part of it) lets
		// any client write its own address: refused. The narrowest
		// refused and the widest accepted sit on the boundary.
		{"0.0.0.0/0", nil, `"0.0.0.0/0"`},
		{"::/0", nil, `"::/0"`},
		{"10.0.0.0/8, 0.0.0.0/0", nil, `"0.0.0.0/0"`},
		{"64.0.0.0/7", nil, `"64.0.0.0/7"`},
		{"11.0.0.0/8", Proxies{netip.MustParsePrefix("11.0.0.0/8")}, ""},
		{"2000::/3", nil, `"2000::/3"`},
		{"2001:db8::/31", nil, `"2001:db8::/31"`},
		{"2001:db8::/32", Proxies{netip.MustParsePrefix("2001:db8::/32")}, ""},
		// Unique local addresses are private whatever the prefix.
		{"fc00::/7", Proxies{netip.MustParsePrefix("fc00::/7")}, ""},
		{"fc00::/6", nil, `"fc00::/6"`},
		// An IPv4-mapped prefix is the IPv4 prefix it maps, so that it
		// matches (addresses are compared unmapped) and is judged as one.
		{"::ffff:0.0.0.0/96", nil, `"::ffff:0.0.0.0/96"`},
		{"::ffff:10.0.0.0/104", Proxies{netip.MustParsePrefix("10.0.0.0/8")}, ""},
	} {
		got, err := Parse(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Parse(%q): error %v, want one naming %s", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("Parse(%q): %v", tc.in, err)
		case tc.wantErr == "" && !reflect.DeepEqual(got, tc.want):
			t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestClient: the forwarding header counts only from a trusted peer, and
// only the one header the proxy writes; the right-most hop that is not
// itself trusted is the client, and a hop that does not parse ends the walk
// at the last trusted address.
func TestClient(t *testing.T) {
	trusted := Proxies{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
	loop := netip.MustParseAddr("127.0.0.1")
	xff := func(v string) [2]string { return [2]string{"X-Forwarded-For", v} }
	fwd := func(v string) [2]string { return [2]string{"Forwarded", v} }
	for _, tc := range []struct {
		name    string
		proxies Proxies
		header  Header
		peer    netip.Addr
		headers [][2]string
		want    string
	}{
		{"no proxies trusted", nil, XForwardedFor, loop, [][2]string{xff("192.0.2.1")}, "127.0.0.1"},
		{"untrusted peer forges", trusted, XForwardedFor, netip.MustParseAddr("192.0.2.9"), [][2]string{xff("192.0.2.1")}, "192.0.2.9"},
		{"trusted, no header", trusted, XForwardedFor, loop, nil, "127.0.0.1"},
		{"xff one hop", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1")}, "192.0.2.1"},
		{"xff right-most is the one the proxy saw", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.2, 192.0.2.1")}, "192.0.2.1"},
		{"xff trusted hop skipped", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1, 10.0.0.5")}, "192.0.2.1"},
		{"xff untrusted hop stops the walk", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1, 192.0.2.3")}, "192.0.2.3"},
		{"xff lines are one list, in order", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1"), xff("10.0.0.4, 192.0.2.4")}, "192.0.2.4"},
		{"xff lines walked across", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1"), xff("10.0.0.4")}, "192.0.2.1"},
		// Traefik rewrites X-Forwarded-For and passes a client's
		// Forwarded on untouched: what the client wrote there is
		// nothing, whichever comes first.
		{"xff: forwarded forged after", trusted, XForwardedFor, loop, [][2]string{xff("192.0.2.1"), fwd("for=198.51.100.7")}, "192.0.2.1"},
		{"xff: forwarded forged before", trusted, XForwardedFor, loop, [][2]string{fwd("for=198.51.100.7"), xff("192.0.2.1")}, "192.0.2.1"},
		{"xff: forwarded alone is nothing", trusted, XForwardedFor, loop, [][2]string{fwd("for=198.51.100.7")}, "127.0.0.1"},
		// A hop that does not parse ends the walk at the last trusted
		// address: the client's entries beyond it are never reached.
		{"xff: unparsable hop", trusted, XForwardedFor, loop, [][2]string{xff("198.51.100.7, unknown")}, "127.0.0.1"},
		{"xff: unparsable hop after a trusted one", trusted, XForwardedFor, loop, [][2]string{xff("198.51.100.7, garbage, 10.0.0.5")}, "10.0.0.5"},
		{"xff: empty entry", trusted, XForwardedFor, loop, [][2]string{xff("198.51.100.7,,10.0.0.5")}, "10.0.0.5"},
		{"xff: empty line", trusted, XForwardedFor, loop, [][2]string{xff("198.51.100.7"), xff("")}, "127.0.0.1"},
		{"xff: zone", trusted, XForwardedFor, loop, [][2]string{xff("198.51.100.7, fe80::1%eth0")}, "127.0.0.1"},
		{"xff: half-quoted", trusted, XForwardedFor, loop, [][2]string{xff(`198.51.100.7, "192.0.2.1`)}, "127.0.0.1"},

		{"forwarded with port", trusted, Forwarded, loop, [][2]string{fwd(`for="192.0.2.1:4711";proto=http`)}, "192.0.2.1"},
		{"forwarded ipv6", trusted, Forwarded, loop, [][2]string{fwd(`for="[2001:db8::1]:4711"`)}, "2001:db8::1"},
		{"forwarded: for in any case, after other pairs", trusted, Forwarded, loop, [][2]string{fwd(`proto=https;FOR=192.0.2.1`)}, "192.0.2.1"},
		{"forwarded lines are one list", trusted, Forwarded, loop, [][2]string{fwd("for=192.0.2.1"), fwd("for=10.0.0.4")}, "192.0.2.1"},
		{"forwarded: xff forged", trusted, Forwarded, loop, [][2]string{fwd("for=192.0.2.4"), xff("198.51.100.7")}, "192.0.2.4"},
		{"forwarded: xff alone is nothing", trusted, Forwarded, loop, [][2]string{xff("198.51.100.7")}, "127.0.0.1"},
		{"forwarded: obfuscated hop stops at the last readable", trusted, Forwarded, loop, [][2]string{fwd("for=198.51.100.7, for=unknown, for=10.0.0.7")}, "10.0.0.7"},
		{"forwarded: element without for stops the walk", trusted, Forwarded, loop, [][2]string{fwd("for=198.51.100.7, by=10.0.0.1")}, "127.0.0.1"},
		// A comma inside a quoted string separates nothing: the element
		// is one hop that does not parse.
		{"forwarded: quoted comma", trusted, Forwarded, loop, [][2]string{fwd(`for="198.51.100.7, for=10.0.0.7"`)}, "127.0.0.1"},
		{"mapped peer", trusted, XForwardedFor, netip.MustParseAddr("::ffff:127.0.0.1"), [][2]string{xff("192.0.2.1")}, "192.0.2.1"},
		{"mapped hop", trusted, XForwardedFor, loop, [][2]string{xff("::ffff:192.0.2.1")}, "192.0.2.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, kv := range tc.headers {
				h.Add(kv[0], kv[1])
			}
			trust := Trust{Proxies: tc.proxies, Header: tc.header}
			if got := trust.Client(tc.peer, h.Values).String(); got != tc.want {
				t.Errorf("Client = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseHeader(t *testing.T) {
	for in, want := range map[string]Header{"X-Forwarded-For": XForwardedFor, "x-forwarded-for": XForwardedFor, " Forwarded ": Forwarded, "FORWARDED": Forwarded} {
		if got, err := ParseHeader(in); err != nil || got != want {
			t.Errorf("ParseHeader(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "X-Real-Ip", "X-Forwarded-For,Forwarded", "Forwarded-For"} {
		if _, err := ParseHeader(in); err == nil || !strings.Contains(err.Error(), "X-Forwarded-For or Forwarded") {
			t.Errorf("ParseHeader(%q): err = %v, want a refusal naming the two", in, err)
		}
	}
	if Header(0) != XForwardedFor {
		t.Error("the zero Header is not X-Forwarded-For")
	}
}
