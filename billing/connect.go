package billing

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// AccountState is what a host's Connect account can do, as Stripe reports
// it (the account object's flags).
type AccountState struct {
	ID string // acct_…
	// ChargesEnabled: Stripe lets the account take charges.
	ChargesEnabled bool
	// PayoutsEnabled: Stripe pays the account's balance out to its bank.
	PayoutsEnabled bool
	// DetailsSubmitted: the host finished Stripe's onboarding form (Stripe
	// may still be verifying it, so the two above may be false yet).
	DetailsSubmitted bool
}

// countryPattern is an ISO 3166-1 alpha-2 code, as Stripe takes it.
var countryPattern = regexp.MustCompile(`^[A-Z]{2}$`)

// accountKey is the idempotency key of a tenant's Express account: one per
// tenant, so that a retry (a lost answer, a double click) gets the same
// account and never makes a second. The tenant's creation time is part of
// it: SQLite may give a removed tenant's id to the next one, which must
// not be handed the removed one's account within Stripe's 24 hours. The
// caller must keep the account id once it has it and never ask again.
func accountKey(tenantID int64, since time.Time) string {
	return "vmshelf-account-" + strconv.FormatInt(tenantID, 10) + "-" + strconv.FormatInt(since.UnixNano(), 10)
}

// CreateExpressAccount implements Payments: it creates the Connect Express
// account of tenant tenantID, created at since (metadata[tenant_id]) asking for the card
// payments and transfers capabilities that destination charges need, and
// returns its id. country is the host's ISO code ("DE"); empty lets the
// host choose it in onboarding. A retry must pass the same country: Stripe
// refuses a changed request under one idempotency key (ErrRefused).
func (s *Stripe) CreateExpressAccount(ctx context.Context, tenantID int64, since time.Time, country string) (string, error) {
	if tenantID <= 0 || since.IsZero() {
		return "", fmt.Errorf("billing: express account: tenant id %d created %v: %w", tenantID, since, ErrBadID)
	}
	if country != "" && !countryPattern.MatchString(country) {
		return "", fmt.Errorf("billing: express account of tenant %d: country %q is not two upper-case letters: %w", tenantID, country, ErrBadID)
	}
	p := &stripe.AccountCreateParams{
		Type: stripe.String(string(stripe.AccountTypeExpress)),
		// A destination charge needs transfers on the host's account;
		// Stripe also requires card_payments with it for most countries.
		Capabilities: &stripe.AccountCreateCapabilitiesParams{
			CardPayments: &stripe.AccountCreateCapabilitiesCardPaymentsParams{Requested: stripe.Bool(true)},
			Transfers:    &stripe.AccountCreateCapabilitiesTransfersParams{Requested: stripe.Bool(true)},
		},
		// So that an account in the Dashboard (or an account.updated
		// event) can be traced to its tenant.
		Metadata: map[string]string{"tenant_id": strconv.FormatInt(tenantID, 10)},
	}
	if country != "" {
		p.Country = stripe.String(country)
	}
	p.SetIdempotencyKey(accountKey(tenantID, since))
	var a *stripe.Account
	err := s.call(ctx, callCreateAccount, func(ctx context.Context) (err error) {
		a, err = s.client.V1Accounts.Create(ctx, p)
		return err
	})
	if err != nil {
		return "", err
	}
	return a.ID, nil
}

// AccountLink implements Payments: a one-time URL of Stripe's onboarding
// for account, and when it expires (minutes). Stripe sends the host to
// returnURL when they leave the flow (finished or not: read Account to
// know), and to refreshURL when the link is expired or used, where the
// caller makes a new link. Both must be absolute http(s) URLs.
func (s *Stripe) AccountLink(ctx context.Context, account, refreshURL, returnURL string) (string, time.Time, error) {
	if !accountPattern.MatchString(account) {
		return "", time.Time{}, fmt.Errorf("billing: account link: account: %w", ErrBadID)
	}
	if !absoluteHTTP(refreshURL) || !absoluteHTTP(returnURL) {
		return "", time.Time{}, fmt.Errorf("billing: account link of %s: refresh or return URL: %w", account, ErrBadURL)
	}
	p := &stripe.AccountLinkCreateParams{
		Account:    stripe.String(account),
		Type:       stripe.String(string(stripe.AccountLinkTypeAccountOnboarding)),
		RefreshURL: stripe.String(refreshURL),
		ReturnURL:  stripe.String(returnURL),
	}
	var l *stripe.AccountLink
	err := s.call(ctx, callCreateAccountLink, func(ctx context.Context) (err error) {
		l, err = s.client.V1AccountLinks.Create(ctx, p)
		return err
	})
	if err != nil {
		return "", time.Time{}, err
	}
	return l.URL, time.Unix(l.ExpiresAt, 0), nil
}

// Account implements Payments.
func (s *Stripe) Account(ctx context.Context, id string) (AccountState, error) {
	if !accountPattern.MatchString(id) {
		return AccountState{}, fmt.Errorf("billing: account: %w", ErrBadID)
	}
	var a *stripe.Account
	err := s.call(ctx, callGetAccount, func(ctx context.Context) (err error) {
		a, err = s.client.V1Accounts.GetByID(ctx, id, nil)
		return err
	})
	if err != nil {
		return AccountState{}, err
	}
	return AccountState{ID: a.ID, ChargesEnabled: a.ChargesEnabled, PayoutsEnabled: a.PayoutsEnabled,
		DetailsSubmitted: a.DetailsSubmitted}, nil
}
