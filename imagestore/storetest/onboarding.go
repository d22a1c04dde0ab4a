package storetest

import (
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// wantAccount checks a tenant's Stripe account and its flags, as returned
// (got with an ID) and as every tenant query reads them back (got.Name).
func wantAccount(t *testing.T, s imagestore.Store, what string, got imagestore.Tenant, account string, onboarded, charges, payouts bool) {
	t.Helper()
	ctx := t.Context()
	check := func(how string, tn imagestore.Tenant) {
		t.Helper()
		if tn.StripeAccount != account || tn.StripeOnboarded != onboarded || tn.StripeChargesEnabled != charges || tn.StripePayoutsEnabled != payouts {
			t.Errorf("%s (%s): account %q onboarded %v charges %v payouts %v; want %q %v %v %v", what, how,
				tn.StripeAccount, tn.StripeOnboarded, tn.StripeChargesEnabled, tn.StripePayoutsEnabled, account, onboarded, charges, payouts)
		}
	}
	if got.ID != 0 { // a tenant a method returned, not just a name
		check("returned", got)
	}
	name := got.Name
	byName, err := s.Tenant(ctx, name)
	must(t, "Tenant", err)
	check("Tenant", byName)
	byID, err := s.TenantByID(ctx, byName.ID)
	must(t, "TenantByID", err)
	check("TenantByID", byID)
	byToken, err := s.TenantByToken(ctx, hash("token-"+name))
	must(t, "TenantByToken", err)
	check("TenantByToken", byToken)
	all, err := s.Tenants(ctx)
	must(t, "Tenants", err)
	for _, tn := range all {
		if tn.ID == byName.ID {
			check("Tenants", tn)
		}
	}
}

// testOnboardedAccount: onboarding records an account on a tenant that has
// none, again (a retry) changes nothing, and never replaces an account:
// another one, or one the operator set, is ErrExists and left as it was.
func testOnboardedAccount(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	wantAccount(t, s, "a new tenant", a, "", false, false, false)
	_, err := s.SetOnboardedAccount(ctx, a.ID+1000, "acct_1x")
	wantErr(t, "SetOnboardedAccount of no tenant", err, imagestore.ErrNotFound)

	got, err := s.SetOnboardedAccount(ctx, a.ID, "acct_1alpha")
	must(t, "SetOnboardedAccount", err)
	wantAccount(t, s, "onboarded", got, "acct_1alpha", true, false, false)
	_, err = s.SetAccountCapabilities(ctx, "acct_1alpha", true, false)
	must(t, "SetAccountCapabilities", err)
	got, err = s.SetOnboardedAccount(ctx, a.ID, "acct_1alpha")
	must(t, "SetOnboardedAccount again", err)
	wantAccount(t, s, "onboarded again", got, "acct_1alpha", true, true, false)

	_, err = s.SetOnboardedAccount(ctx, a.ID, "acct_1second")
	wantErr(t, "SetOnboardedAccount of a second account", err, imagestore.ErrExists)
	wantAccount(t, s, "after a second account was refused", imagestore.Tenant{Name: "alpha"}, "acct_1alpha", true, true, false)

	h := newHost(t, s, "host") // the operator's account, acct_host
	_, err = s.SetOnboardedAccount(ctx, h.ID, "acct_1other")
	wantErr(t, "SetOnboardedAccount over the operator's account", err, imagestore.ErrExists)
	wantAccount(t, s, "the operator's account", imagestore.Tenant{Name: "host"}, "acct_host", false, false, false)
}

// testAccountCapabilities: account.updated's flags land on the tenant
// with the account, and on no other; an account no tenant has is
// ErrNotFound.
func testAccountCapabilities(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	b := newTenant(t, s, "bravo")
	_, err := s.SetOnboardedAccount(ctx, a.ID, "acct_1alpha")
	must(t, "SetOnboardedAccount alpha", err)
	_, err = s.SetOnboardedAccount(ctx, b.ID, "acct_1bravo")
	must(t, "SetOnboardedAccount bravo", err)

	_, err = s.SetAccountCapabilities(ctx, "acct_1nobody", true, true)
	wantErr(t, "SetAccountCapabilities of an unknown account", err, imagestore.ErrNotFound)
	_, err = s.SetAccountCapabilities(ctx, "", true, true)
	wantErr(t, "SetAccountCapabilities of no account", err, imagestore.ErrNotFound)

	for _, c := range []struct{ charges, payouts bool }{{true, false}, {false, true}, {true, true}, {false, false}, {true, true}} {
		got, err := s.SetAccountCapabilities(ctx, "acct_1alpha", c.charges, c.payouts)
		must(t, "SetAccountCapabilities", err)
		if got.ID != a.ID {
			t.Fatalf("SetAccountCapabilities returned tenant %d (%s), want alpha", got.ID, got.Name)
		}
		wantAccount(t, s, "alpha after account.updated", got, "acct_1alpha", true, c.charges, c.payouts)
	}
	wantAccount(t, s, "bravo, untouched", imagestore.Tenant{Name: "bravo"}, "acct_1bravo", true, false, false)
}

// testOperatorAccountClearsOnboarding: UpdateTenant with the same account
// (tenant set of another flag) keeps the onboarding state; with another
// account (tenant set --stripe-account) it clears it, and the flags of
// the old account do not stand for the new one.
func testOperatorAccountClearsOnboarding(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	_, err := s.SetOnboardedAccount(ctx, a.ID, "acct_1alpha")
	must(t, "SetOnboardedAccount", err)
	_, err = s.SetAccountCapabilities(ctx, "acct_1alpha", true, true)
	must(t, "SetAccountCapabilities", err)

	cur, err := s.Tenant(ctx, "alpha")
	must(t, "Tenant", err)
	cur.Sharing = true
	cur.StripeOnboarded, cur.StripeChargesEnabled, cur.StripePayoutsEnabled = false, false, false // not UpdateTenant's to write
	must(t, "UpdateTenant, same account", s.UpdateTenant(ctx, cur))
	wantAccount(t, s, "another flag set", imagestore.Tenant{Name: "alpha"}, "acct_1alpha", true, true, true)

	cur.StripeAccount = "acct_operators"
	must(t, "UpdateTenant, another account", s.UpdateTenant(ctx, cur))
	wantAccount(t, s, "the operator's account set", imagestore.Tenant{Name: "alpha"}, "acct_operators", false, false, false)
	if got, err := s.Tenant(ctx, "alpha"); err != nil || !got.Sharing {
		t.Errorf("alpha after UpdateTenant: %+v, %v; want sharing", got, err)
	}
	// The operator's account hears account.updated too, but stays the
	// operator's; onboarding cannot take it over.
	_, err = s.SetAccountCapabilities(ctx, "acct_operators", true, true)
	must(t, "SetAccountCapabilities of the operator's account", err)
	wantAccount(t, s, "the operator's account updated", imagestore.Tenant{Name: "alpha"}, "acct_operators", false, true, true)
	_, err = s.SetOnboardedAccount(ctx, a.ID, "acct_1new")
	wantErr(t, "SetOnboardedAccount over the operator's account", err, imagestore.ErrExists)

	cur.StripeAccount = ""
	must(t, "UpdateTenant, no account", s.UpdateTenant(ctx, cur))
	wantAccount(t, s, "the account removed", imagestore.Tenant{Name: "alpha"}, "", false, false, false)
}
