package market

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// hostTenant creates a box that hosts machines with account (empty: none
// yet, as before onboarding) and returns it with its token.
func (e *env) hostTenant(name, account string) (imagestore.Tenant, string) {
	e.t.Helper()
	token := imagestore.NewSecret()
	e.remember(token)
	t, err := e.st.CreateTenant(e.t.Context(), imagestore.Tenant{Name: name, InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: "node1", StripeAccount: account}, imagestore.HashSecret(token))
	if err != nil {
		e.t.Fatalf("CreateTenant(%s): %v", name, err)
	}
	return t, token
}

// onboard asks for an onboarding link and decodes the 200.
func (e *env) onboard(token string) onboardingAnswer {
	e.t.Helper()
	r := e.post("/market/stripe/onboarding", token, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("onboarding: %d %s", r.status, r.body)
	}
	var a onboardingAnswer
	decode(e.t, r, &a)
	return a
}

// accountEvent posts account.updated about account as the fake has it
// now, signed at the test clock's now.
func (e *env) accountEvent(id, account string) response {
	e.t.Helper()
	payload, sig, err := e.stripe.AccountUpdatedEvent(id, account, webhookSecret, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return e.postEvent(payload, sig)
}

// statusAccount is the account object of t's status.
func (e *env) statusAccount(token string) account {
	e.t.Helper()
	r := e.post("/market/vms/status", token, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("status: %d %s", r.status, r.body)
	}
	var st statusAnswer
	decode(e.t, r, &st)
	return st.Account
}

// TestOnboarding: a host without an account gets an Express account made
// for it, recorded at once, and a link whose return and refresh URLs are
// the Machines page's; asking again makes no second account.
func TestOnboarding(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.CheckoutReturnURL = "https://edge.example/machines?lang=en" })
	host, token := e.hostTenant("host", "")
	a := e.onboard(token)

	accounts := e.stripe.Accounts()
	if len(accounts) != 1 {
		t.Fatalf("Stripe has %d accounts, want 1: %+v", len(accounts), accounts)
	}
	acct := accounts[0]
	if a.Account != acct.ID || acct.Type != "express" || acct.TenantID != strconv.FormatInt(host.ID, 10) {
		t.Errorf("answer %+v, Stripe's account %+v; want the Express account of tenant %d", a, acct, host.ID)
	}
	if a.ChargesEnabled || a.PayoutsEnabled || !a.ExpiresAt.After(time.Now()) {
		t.Errorf("answer %+v; want nothing enabled yet, a link that expires in the future", a)
	}
	u, err := url.Parse(a.URL)
	if err != nil || !strings.HasPrefix(a.URL, e.stripe.URL+"/connect/onboard/"+acct.ID+"?") {
		t.Fatalf("link %q: want the fake's onboarding of %s", a.URL, acct.ID)
	}
	for k, want := range map[string]string{
		"return":  "https://edge.example/machines?lang=en&onboarding=return",
		"refresh": "https://edge.example/machines?lang=en&onboarding=refresh",
	} {
		if got := u.Query().Get(k); got != want {
			t.Errorf("the link's %s URL is %q, want %q", k, got, want)
		}
	}
	got, err := e.st.TenantByID(t.Context(), host.ID)
	if err != nil || got.StripeAccount != acct.ID || !got.StripeOnboarded {
		t.Errorf("the tenant after onboarding: %+v, %v; want account %s, onboarded", got, err, acct.ID)
	}
	if acc := e.statusAccount(token); !acc.StripeOnboarded || acc.StripeChargesEnabled || acc.StripePayoutsEnabled || acc.PayoutAccount {
		t.Errorf("status account %+v; want onboarded, nothing enabled, no payout account yet", acc)
	}

	// Again (the link expired, the page asks anew): the same account,
	// and Stripe is not asked to make one.
	again := e.onboard(token)
	if again.Account != acct.ID || len(e.stripe.Accounts()) != 1 || len(e.stripe.Received("/v1/accounts")) != 1 {
		t.Errorf("a second onboarding: %+v, %d accounts, %d creations; want the same account, made once",
			again, len(e.stripe.Accounts()), len(e.stripe.Received("/v1/accounts")))
	}
	if strings.Contains(e.logs.String(), a.URL) || strings.Contains(e.logs.String(), "/connect/onboard/") {
		t.Errorf("the link is in the log:\n%s", e.logs)
	}
	if !strings.Contains(e.logs.String(), "account="+acct.ID) {
		t.Errorf("no log line names the account:\n%s", e.logs)
	}
	wantLines(t, e.scrape(), `vmshelf_onboarding_links_total{result="ok"} 2`,
		`vmshelf_onboarding_links_total{result="refused"} 0`, `vmshelf_onboarding_links_total{result="unavailable"} 0`)
}

// TestOnboardingRefused: who may not onboard, and what Stripe's silence
// answers.
func TestOnboardingRefused(t *testing.T) {
	e := newEnv(t)
	_, notHost := e.tenant("buyer", true)
	wantError(t, e.post("/market/stripe/onboarding", notHost, ""), http.StatusConflict, "notHosting")
	_, operators := e.hostTenant("operators", "acct_1HostActive000001")
	wantError(t, e.post("/market/stripe/onboarding", operators, ""), http.StatusConflict, "accountManagedElsewhere")
	_, notSharing := e.tenant("private", false)
	wantError(t, e.post("/market/stripe/onboarding", notSharing, ""), http.StatusConflict, "notSharing")
	wantError(t, e.post("/market/stripe/onboarding", "", ""), http.StatusUnauthorized, "unauthorized")
	wantError(t, e.post("/market/stripe/onboarding", operators, `{"country":"DE"}`), http.StatusBadRequest, "badRequest")

	host, token := e.hostTenant("host", "")
	e.stripe.Down(10) // every retry of the client too
	wantError(t, e.post("/market/stripe/onboarding", token, ""), http.StatusServiceUnavailable, "paymentsUnavailable")
	if got, _ := e.st.TenantByID(t.Context(), host.ID); got.StripeAccount != "" {
		t.Errorf("with Stripe down the tenant got account %q", got.StripeAccount)
	}
	e.stripe.Down(0)
	wantLines(t, e.scrape(), `vmshelf_onboarding_links_total{result="refused"} 2`,
		`vmshelf_onboarding_links_total{result="unavailable"} 1`, `vmshelf_onboarding_links_total{result="ok"} 0`)

	noKeys := newEnv(t, func(c *Config) { c.Payments = nil })
	_, token = noKeys.hostTenant("host", "")
	wantError(t, noKeys.post("/market/stripe/onboarding", token, ""), http.StatusServiceUnavailable, "paymentsUnavailable")
}

// TestOnboardingOperatorMeanwhile: the operator sets an account while the
// onboarding's account is being made: the operator's stands, and the
// request is refused.
func TestOnboardingOperatorMeanwhile(t *testing.T) {
	e := newEnv(t)
	host, _ := e.hostTenant("host", "")
	// The request authenticated the tenant without an account; the
	// operator's write lands before the onboarding's.
	host.StripeAccount = "acct_1HostActive000002"
	if err := e.st.UpdateTenant(t.Context(), host); err != nil {
		t.Fatal(err)
	}
	host.StripeAccount = ""
	if _, err := e.srv.onboardingLink(t.Context(), host); apiReason(err) != "accountManagedElsewhere" {
		t.Errorf("onboarding after the operator set an account: %v; want accountManagedElsewhere", err)
	}
	if got, _ := e.st.TenantByID(t.Context(), host.ID); got.StripeAccount != "acct_1HostActive000002" || got.StripeOnboarded {
		t.Errorf("tenant %+v; want the operator's account, not onboarded", got)
	}
}

// TestOnboardedListing: an onboarded account lists once account.updated
// said charges and payouts are enabled, and not before; Stripe is not
// asked about transfers for it. The webhook's common path holds for the
// event: a replay changes nothing, a forged or stale one is refused, an
// account no tenant has is logged and acknowledged.
func TestOnboardedListing(t *testing.T) {
	e := newEnv(t)
	host, token := e.hostTenant("host", "")
	acct := e.onboard(token).Account
	const listing = `{"unit_price":600,"capacity":2}`
	wantError(t, e.post("/market/vms/listings", token, listing), http.StatusConflict, "payoutsNotEnabled")

	// Charges alone are not enough.
	if err := e.stripe.EnableAccount(acct, true, false); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.accountEvent("evt_acct_1", acct), resultAccountUpdated)
	wantError(t, e.post("/market/vms/listings", token, listing), http.StatusConflict, "payoutsNotEnabled")
	if acc := e.statusAccount(token); !acc.StripeChargesEnabled || acc.StripePayoutsEnabled || acc.PayoutAccount {
		t.Errorf("status account %+v; want charges only, no payout account", acc)
	}

	if err := e.stripe.EnableAccount(acct, true, true); err != nil {
		t.Fatal(err)
	}
	// A forged and a stale event change nothing.
	payload, _, _ := e.stripe.AccountUpdatedEvent("evt_acct_2", acct, webhookSecret, e.clock.Now())
	_, forged, _ := e.stripe.AccountUpdatedEvent("evt_acct_2", acct, "whsec_someoneelse0000000000", e.clock.Now())
	wantError(t, e.postEvent(payload, forged), http.StatusBadRequest, "badSignature")
	stale, staleSig, _ := e.stripe.AccountUpdatedEvent("evt_acct_2", acct, webhookSecret, e.clock.Now().Add(-10*time.Minute))
	wantError(t, e.postEvent(stale, staleSig), http.StatusBadRequest, "badSignature")
	wantError(t, e.post("/market/vms/listings", token, listing), http.StatusConflict, "payoutsNotEnabled")

	wantResult(t, e.accountEvent("evt_acct_2", acct), resultAccountUpdated)
	acc := e.statusAccount(token)
	if !acc.StripeOnboarded || !acc.StripeChargesEnabled || !acc.StripePayoutsEnabled || !acc.PayoutAccount {
		t.Errorf("status account %+v; want onboarded, charges and payouts enabled, a payout account", acc)
	}
	before := e.stripe.Requests()
	if r := e.post("/market/vms/listings", token, listing); r.status != http.StatusCreated {
		t.Fatalf("listing after payouts were enabled: %d %s", r.status, r.body)
	}
	if n := e.stripe.Requests() - before; n != 0 {
		t.Errorf("listing for an onboarded account asked Stripe %d times; want none (account.updated said it)", n)
	}

	// Stripe disables payouts: the replay of the old event enables
	// nothing, a new one records it, and the listing is no longer offered.
	if err := e.stripe.EnableAccount(acct, true, false); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.accountEvent("evt_acct_2", acct), resultDuplicate)
	if got, _ := e.st.TenantByID(t.Context(), host.ID); !got.StripePayoutsEnabled {
		t.Errorf("a replayed event changed the tenant: %+v", got)
	}
	wantResult(t, e.accountEvent("evt_acct_3", acct), resultAccountUpdated)
	if got, _ := e.st.TenantByID(t.Context(), host.ID); got.StripePayoutsEnabled || !got.StripeChargesEnabled {
		t.Errorf("after payouts were disabled: %+v", got)
	}
	_, buyer := e.tenant("buyer", true)
	if r := e.post("/market/vms/status", buyer, ""); !strings.Contains(string(r.body), `"offers":[]`) {
		t.Errorf("a host whose payouts were disabled is still offered: %s", r.body)
	}

	// An account of no tenant here (another platform's, a removed box's).
	wantResult(t, e.accountEvent("evt_acct_4", "acct_1HostInactive0001"), resultUnknownAccount)
	if !strings.Contains(e.logs.String(), "account.updated for an account no tenant has") {
		t.Errorf("the unknown account is not logged:\n%s", e.logs)
	}
	wantLines(t, e.scrape(), `vmshelf_webhook_events_total{result="accountUpdated",type="account.updated"} 3`,
		`vmshelf_webhook_events_total{result="unknownAccount",type="account.updated"} 1`)
}

// TestAccountEventStripeDown: an account.updated Stripe cannot be asked
// about is a 503 and not recorded, so Stripe's next delivery counts.
func TestAccountEventStripeDown(t *testing.T) {
	e := newEnv(t)
	_, token := e.hostTenant("host", "")
	acct := e.onboard(token).Account
	if err := e.stripe.EnableAccount(acct, true, true); err != nil {
		t.Fatal(err)
	}
	e.stripe.Down(10)
	r := e.accountEvent("evt_acct_down", acct)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("account.updated with Stripe down: %d %s, want 503", r.status, r.body)
	}
	e.stripe.Down(0)
	wantResult(t, e.accountEvent("evt_acct_down", acct), resultAccountUpdated)
	if r := e.post("/market/vms/listings", token, `{"unit_price":600,"capacity":2}`); r.status != http.StatusCreated {
		t.Errorf("listing: %d %s", r.status, r.body)
	}
}

// TestOperatorAccountListing: an account the operator set is still asked
// of Stripe (transfers active), whatever account.updated said of it.
func TestOperatorAccountListing(t *testing.T) {
	e := newEnv(t)
	_, inactive := e.hostTenant("host", "acct_1HostInactive0001")
	// The fake has it with charges on and payouts off.
	wantResult(t, e.accountEvent("evt_op_1", "acct_1HostInactive0001"), resultAccountUpdated)
	wantError(t, e.post("/market/vms/listings", inactive, `{"unit_price":600,"capacity":2}`), http.StatusConflict, "noPayoutAccount")
	if acc := e.statusAccount(inactive); acc.StripeOnboarded || !acc.PayoutAccount {
		t.Errorf("status account %+v; want not onboarded, payout_account as set by the operator", acc)
	}
	_, active := e.hostTenant("host2", "acct_1HostActive000001")
	if r := e.post("/market/vms/listings", active, `{"unit_price":600,"capacity":2}`); r.status != http.StatusCreated {
		t.Errorf("listing of the operator's active account: %d %s", r.status, r.body)
	}
}

// apiReason is the reason the client would read for err.
func apiReason(err error) string {
	if err == nil {
		return ""
	}
	return apierr.From(err).Reason
}
