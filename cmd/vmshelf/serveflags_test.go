package main

import (
	"slices"
	"strings"
	"testing"
)

// TestPageAndCORSOrigins: the data plane lets the Machines page upload by
// default, also when the control plane listens on every address (the
// page's address is then the public URL's host, on the control port), and
// --cors-origin adds an origin beside the page's instead of replacing it.
func TestPageAndCORSOrigins(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		page     string
		origins  []string
		consoleB string
	}{
		{"defaults", nil, "http://127.0.0.1:8481/machines", []string{"http://127.0.0.1:8481"}, "ws://127.0.0.1:8481"},
		{"wildcard control plane", []string{"--control-addr", "0.0.0.0:9481", "--data-addr", "0.0.0.0:9480", "--public-url", "http://box.lan:9480"},
			"http://box.lan:9481/machines", []string{"http://box.lan:9481"}, "ws://box.lan:9481"},
		{"v6 wildcard control plane", []string{"--control-addr", "[::]:9481", "--public-url", "https://edge.example/"},
			"http://edge.example:9481/machines", []string{"http://edge.example:9481"}, "ws://edge.example:9481"},
		{"another page origin besides", []string{"--cors-origin", "https://box-ui.example"},
			"http://127.0.0.1:8481/machines", []string{"http://127.0.0.1:8481", "https://box-ui.example"}, "ws://127.0.0.1:8481"},
		{"return URL names the page", []string{"--checkout-return-url", "https://shop.example/machines", "--cors-origin", "https://shop.example"},
			"https://shop.example/machines", []string{"https://shop.example"}, "wss://shop.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseServeFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.pageURL(); got != tc.page {
				t.Errorf("page URL %q, want %q", got, tc.page)
			}
			if got := f.corsOrigins(); !slices.Equal(got, tc.origins) {
				t.Errorf("CORS origins %q, want %q", got, tc.origins)
			}
			if got := f.consoleBase(); got != tc.consoleB {
				t.Errorf("console base %q, want %q", got, tc.consoleB)
			}
		})
	}
}

// TestPublicBaseOfEveryAddress: a data plane listening on every address
// hands out no URL of its own: --public-url is required, and named.
func TestPublicBaseOfEveryAddress(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:8480", "[::]:8480", ":8480"} {
		if base, err := publicBase("", addr); err == nil || !strings.Contains(err.Error(), "--public-url") {
			t.Errorf("publicBase(%q) = %q, %v; want a refusal naming --public-url", addr, base, err)
		}
	}
	if base, err := publicBase("", "192.0.2.7:8480"); err != nil || base != "http://192.0.2.7:8480" {
		t.Errorf("publicBase of an address = %q, %v", base, err)
	}
	if base, err := publicBase("http://box.lan:8480", "0.0.0.0:8480"); err != nil || base != "http://box.lan:8480" {
		t.Errorf("publicBase with --public-url = %q, %v", base, err)
	}
}

// TestStripeStandInOnlyInDev: a --stripe-api-base on this machine (a
// stand-in: no money moves through it) is accepted only with --dev and a
// loopback --control-addr, and only then does the page say the payments
// are a demo; Stripe's own API, or another host's, is taken as before.
func TestStripeStandInOnlyInDev(t *testing.T) {
	unsetEnv(t, "VMSHELF_", "STRIPE_")
	for _, tc := range []struct {
		name    string
		args    []string
		refused bool
		demo    bool
	}{
		{"Stripe's own API", nil, false, false},
		{"Stripe's own API in dev", []string{"--dev"}, false, false},
		{"another host's API", []string{"--stripe-api-base", "https://stripe-proxy.example"}, false, false},
		{"a stand-in in dev on loopback", []string{"--dev", "--stripe-api-base", "http://127.0.0.1:12111"}, false, true},
		{"a stand-in on localhost, v6 control plane", []string{"--dev", "--control-addr", "[::1]:9481", "--stripe-api-base", "http://localhost:12111"}, false, true},
		{"a stand-in without --dev", []string{"--stripe-api-base", "http://127.0.0.1:12111"}, true, false},
		{"a stand-in on [::1] without --dev", []string{"--stripe-api-base", "http://[::1]:12111"}, true, false},
		{"a stand-in with a control plane on every address", []string{"--dev", "--control-addr", "0.0.0.0:9481", "--data-addr", "127.0.0.1:9480",
			"--stripe-api-base", "http://127.0.0.1:12111"}, true, false},
		{"a stand-in with a control plane on a LAN address", []string{"--dev", "--control-addr", "192.0.2.7:9481",
			"--stripe-api-base", "http://127.0.0.1:12111"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseServeFlags(tc.args)
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "--stripe-api-base") || !strings.Contains(err.Error(), "--dev") {
					t.Fatalf("%v: %v, want a refusal naming --stripe-api-base and --dev", tc.args, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := f.demoPayments(); got != tc.demo {
				t.Errorf("%v: demo payments %v, want %v", tc.args, got, tc.demo)
			}
		})
	}
}
