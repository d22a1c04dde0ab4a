package main

// End-to-end tests of a host's own Stripe onboarding (Connect Express)
// through the binary: the account made on POST /market/stripe/onboarding,
// the listing gate that waits for Stripe's account.updated, and the
// Machines page's way to Stripe and back.

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// onboardMarket is serve with Stripe keys and the fake Stripe, and a host
// (token) that hosts machines but has no Stripe account yet.
type onboardMarket struct {
	s     *server
	fake  *stripetest.Server
	whsec string
	host  string
}

// startOnboardMarket starts serve whose --checkout-return-url is its own
// Machines page, as a real edge's is, so that Stripe sends the host back
// there.
func startOnboardMarket(t *testing.T) *onboardMarket {
	t.Helper()
	needTool(t, "curl")
	key, whsec := stripeTestSecrets()
	fake, err := stripetest.New(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	ctl := freeAddr(t)
	s := startServeAt(t, filepath.Join(t.TempDir(), "data"), freeAddr(t), ctl, []string{"--vms-enable", "--stripe-api-base", fake.URL,
		"--checkout-return-url", "http://" + ctl + "/machines"}, env...)
	s.secret(key)
	s.secret(whsec)
	r := vmshelf(t, "tenant", "add", "host", "--in-mesh", "--sharing", "--hosts-vms", "--appliance", "node1", "--data-dir", s.dataDir)
	if r.code != 0 {
		t.Fatalf("tenant add host: exit %d: %s", r.code, r.stderr)
	}
	host := strings.TrimSuffix(r.stdout, "\n")
	s.secret(host)
	return &onboardMarket{s: s, fake: fake, whsec: whsec, host: host}
}

// accountUpdated posts Stripe's account.updated about the fake's only
// account, signed, as Stripe would, and wants it recorded.
func (m *onboardMarket) accountUpdated(t *testing.T, eventID string) string {
	t.Helper()
	accounts := m.fake.Accounts()
	if len(accounts) != 1 {
		t.Fatalf("the fake Stripe has %d accounts, want the host's one: %+v", len(accounts), accounts)
	}
	payload, sig, err := m.fake.AccountUpdatedEvent(eventID, accounts[0].ID, m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body := postWebhook(t, m.s, payload, sig)
	wantWebhookResult(t, "account.updated", code, body, "accountUpdated")
	return accounts[0].ID
}

// TestE2EOnboardedListing: a host onboarded through the edge is refused a
// listing (409 payoutsNotEnabled) until Stripe's signed account.updated
// says charges and payouts are enabled, and accepted after it; status and
// the metric say so, and no log line carries the link.
func TestE2EOnboardedListing(t *testing.T) {
	t.Parallel()
	m := startOnboardMarket(t)
	s := m.s
	code, body := s.ctl(t, "/market/stripe/onboarding", m.host, "")
	if code != http.StatusOK {
		t.Fatalf("onboarding: %d %s", code, body)
	}
	var link struct {
		URL            string    `json:"url"`
		ExpiresAt      time.Time `json:"expires_at"`
		Account        string    `json:"account"`
		ChargesEnabled bool      `json:"charges_enabled"`
		PayoutsEnabled bool      `json:"payouts_enabled"`
	}
	decode(t, body, &link)
	u, err := url.Parse(link.URL)
	if err != nil || !strings.HasPrefix(link.URL, m.fake.URL+"/connect/onboard/"+link.Account) ||
		u.Query().Get("return") != s.ctlBase+"/machines?onboarding=return" || u.Query().Get("refresh") != s.ctlBase+"/machines?onboarding=refresh" {
		t.Fatalf("onboarding answered %+v; want the fake's onboarding of the account, back to the Machines page", link)
	}
	const listing = `{"unit_price":600,"capacity":2}`
	code, body = s.ctl(t, "/market/vms/listings", m.host, listing)
	wantErrorBody(t, "a listing before account.updated", code, body, http.StatusConflict, "payoutsNotEnabled")

	if err := m.fake.EnableAccount(link.Account, true, true); err != nil {
		t.Fatal(err)
	}
	if got := m.accountUpdated(t, "evt_e2e_account_1"); got != link.Account {
		t.Fatalf("the fake's account %s is not the one onboarding answered (%s)", got, link.Account)
	}
	code, body = s.ctl(t, "/market/vms/listings", m.host, listing)
	if code != http.StatusCreated {
		t.Fatalf("a listing after account.updated: %d %s, want 201", code, body)
	}
	code, body = s.ctl(t, "/market/vms/status", m.host, "")
	var st struct {
		Account map[string]any `json:"account"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status: %v: %s", err, body)
	}
	for k, want := range map[string]any{"payout_account": true, "stripe_onboarded": true, "stripe_charges_enabled": true, "stripe_payouts_enabled": true} {
		if st.Account[k] != want {
			t.Errorf("status account.%s = %v, want %v (%d %s)", k, st.Account[k], want, code, body)
		}
	}
	if n := len(m.fake.Received("/v1/accounts")); n != 1 {
		t.Errorf("Stripe was asked to make %d accounts, want 1", n)
	}
	if !strings.Contains(rawMetrics(t, s), `vmshelf_onboarding_links_total{result="ok"} 1`) {
		t.Errorf("the metric does not count the link:\n%s", rawMetrics(t, s))
	}
	if logs := s.logs(); strings.Contains(logs, "/connect/onboard/") || !strings.Contains(logs, link.Account) {
		t.Errorf("serve's log carries the link, or names no account:\n%s", logs)
	}
}

// wantErrorBody checks a refusal's status and reason.
func wantErrorBody(t *testing.T, what string, code int, body []byte, status int, reason string) {
	t.Helper()
	var e struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(body, &e); err != nil || code != status || e.Reason != reason || e.Error == "" {
		t.Fatalf("%s: %d %s; want %d %s with its sentence", what, code, body, status, reason)
	}
}

// TestPageOnboarding: the host's page shows no listing form but "Set up
// payouts with Stripe"; the button takes the tab to Stripe's onboarding
// (the fake's), whose "finish" comes back to the page with
// ?onboarding=return, which says it is back and that Stripe has not
// confirmed yet; after Stripe's account.updated the page says payouts are
// enabled, shows the listing form, and a listing made with it is taken.
func TestPageOnboarding(t *testing.T) {
	t.Parallel()
	browserDir(t)
	m := startOnboardMarket(t)
	s := m.s
	var account string
	pr := startPage(t, "onboarding", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": m.host, "PAGE_STRIPE": m.fake.URL,
	}, map[string]action{
		// Stripe, once the host finished its onboarding, tells the edge.
		"accountUpdated": func([]byte) any {
			account = m.accountUpdated(t, "evt_page_account_1")
			return map[string]string{"account": account}
		},
	})
	pr.extra = s.logs
	type payouts struct {
		State       string `json:"state"`
		Text        string `json:"text"`
		Button      bool   `json:"button"`
		ButtonText  string `json:"buttonText"`
		Form        bool   `json:"form"`
		Result      string `json:"result"`
		ResultState string `json:"resultState"`
		URL         string `json:"url"`
	}
	var rep struct {
		commonReport
		Before    payouts     `json:"before"`
		AtStripe  string      `json:"atStripe"`
		Back      payouts     `json:"back"`
		Confirmed payouts     `json:"confirmed"`
		Listed    string      `json:"listed"`
		Store     pageStorage `json:"store"`
	}
	pr.wait(&rep)

	if b := rep.Before; b.State != "none" || !b.Button || b.ButtonText != "Set up payouts with Stripe" || b.Form || !strings.Contains(b.Text, "no Stripe account") {
		t.Errorf("before onboarding the page shows %+v; want no account in words, the button, no listing form", b)
	}
	if account == "" || !strings.HasPrefix(rep.AtStripe, m.fake.URL+"/connect/onboard/"+account+"?") {
		t.Errorf("the button took the tab to %q; want the fake's onboarding of %q", rep.AtStripe, account)
	}
	if b := rep.Back; !strings.HasSuffix(b.URL, "/machines") || !strings.HasPrefix(b.Result, "Back from Stripe: ") || b.ResultState != "pending" ||
		b.State != "pending" || b.Form || !b.Button {
		t.Errorf("back from Stripe the page shows %+v; want /machines without the query, \"Back from Stripe\", onboarding not finished, no form", b)
	}
	if c := rep.Confirmed; c.State != "enabled" || !strings.Contains(c.Text, "charges and payouts enabled") || !c.Form || c.Button ||
		!strings.Contains(c.Result, "enabled") || c.ResultState != "done" {
		t.Errorf("after account.updated the page shows %+v; want charges and payouts enabled, the listing form, no button", c)
	}
	if !strings.Contains(rep.Listed, "Listed") {
		t.Errorf("the listing made on the page: %q; want it taken", rep.Listed)
	}
	if st := marketStatusOf(t, s, &answers{}, m.host); len(st.Listings) != 1 || st.Listings[0].UnitPrice != 600 {
		t.Errorf("the host's listings %+v; want the page's at 6.00", st.Listings)
	}
	noToken(t, rep.Store, rep.AtStripe, m.host)
}
