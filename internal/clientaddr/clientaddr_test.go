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

// TestClient: forwarding headers count only from a trusted peer; the
// right-most hop that is not itself trusted is the client.
func TestClient(t *testing.T) {
	trusted := Proxies{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
	loop := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name    string
		proxies Proxies
		peer    netip.Addr
		headers [][2]string
		want    string
	}{
		{"no proxies trusted", nil, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1"}}, "127.0.0.1"},
		{"untrusted peer forges", trusted, netip.MustParseAddr("192.0.2.9"), [][2]string{{"X-Forwarded-For", "192.0.2.1"}}, "192.0.2.9"},
		{"trusted, no header", trusted, loop, nil, "127.0.0.1"},
		{"xff one hop", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1"}}, "192.0.2.1"},
		{"xff right-most is the one the proxy saw", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.2, 192.0.2.1"}}, "192.0.2.1"},
		{"xff trusted hop skipped", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1, 10.0.0.5"}}, "192.0.2.1"},
		{"xff untrusted hop stops the walk", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1, 192.0.2.3"}}, "192.0.2.3"},
		{"xff in two headers", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1"}, {"X-Forwarded-For", "192.0.2.4"}}, "192.0.2.4"},
		{"forwarded with port", trusted, loop, [][2]string{{"Forwarded", `for="192.0.2.1:4711";proto=http`}}, "192.0.2.1"},
		{"forwarded ipv6", trusted, loop, [][2]string{{"Forwarded", `for="[2001:db8::1]:4711"`}}, "2001:db8::1"},
		{"forwarded wins over xff", trusted, loop, [][2]string{{"X-Forwarded-For", "192.0.2.1"}, {"Forwarded", "for=192.0.2.4"}}, "192.0.2.4"},
		{"obfuscated hop stops at the last readable", trusted, loop, [][2]string{{"Forwarded", "for=unknown, for=10.0.0.7"}}, "10.0.0.7"},
		{"mapped peer", trusted, netip.MustParseAddr("::ffff:127.0.0.1"), [][2]string{{"X-Forwarded-For", "192.0.2.1"}}, "192.0.2.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, kv := range tc.headers {
				h.Add(kv[0], kv[1])
			}
			if got := tc.proxies.Client(tc.peer, h.Values).String(); got != tc.want {
				t.Errorf("Client = %s, want %s", got, tc.want)
			}
		})
	}
}
