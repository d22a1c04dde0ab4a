package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// A host onboards itself with Stripe Connect Express: the edge makes the
// box's Express account (once: the account id is kept, and Stripe's
// idempotency key per tenant makes a retry return the same account) and
// hands the host a one-time Account Link to Stripe's hosted onboarding.
// Whether the account can be paid is then what Stripe's account.updated
// events say (accountevents.go), never what the browser coming back says.

var (
	errAccountManagedElsewhere = apierr.New(reason.AccountManagedElsewhere)
	errPayoutsNotEnabled       = apierr.New(reason.PayoutsNotEnabled)
)

// The outcomes of POST /market/stripe/onboarding, the result label of
// vmshelf_onboarding_links_total.
const (
	onboardingOK          = "ok"          // a link was handed out
	onboardingRefused     = "refused"     // the box may not onboard here (4xx)
	onboardingUnavailable = "unavailable" // no link now: Stripe, its keys or the store (5xx)
)

// onboardingRequest is the route's body: empty, or {}.
type onboardingRequest struct{}

// onboardingAnswer is the 200 of POST /market/stripe/onboarding. The URL
// is a one-time capability to the account's onboarding: the host's
// browser follows it, nothing logs it.
type onboardingAnswer struct {
	URL            string    `json:"url"`
	ExpiresAt      time.Time `json:"expires_at"`
	Account        string    `json:"account"`
	ChargesEnabled bool      `json:"charges_enabled"`
	PayoutsEnabled bool      `json:"payouts_enabled"`
}

// onboarding is POST /market/stripe/onboarding (a machine route needing
// payments: sharing, VMs offered and Stripe keys are checked before).
func (s *Server) onboarding(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req onboardingRequest
	if err := s.decodeBody(w, r, &req, true); err != nil {
		s.fail(w, r, err)
		return
	}
	ans, err := s.onboardingLink(r.Context(), t)
	if err != nil {
		s.metrics.onboardingLinks.WithLabelValues(onboardingResult(err)).Inc()
		s.fail(w, r, err)
		return
	}
	s.metrics.onboardingLinks.WithLabelValues(onboardingOK).Inc()
	// Never the link: it opens the account's onboarding to whoever has it.
	s.log.Info("stripe onboarding link", "tenant", t.Name, "account", ans.Account)
	s.writeJSON(w, r, http.StatusOK, ans)
}

// onboardingResult is the metric's result of a refused request.
func onboardingResult(err error) string {
	if e := apierr.From(err); e.Status < 500 {
		return onboardingRefused
	}
	return onboardingUnavailable
}

// onboardingLink makes t's Express account if it has none, and a link to
// its onboarding.
func (s *Server) onboardingLink(ctx context.Context, t imagestore.Tenant) (onboardingAnswer, error) {
	if !t.InMesh || !t.HostsVMs || t.Appliance == "" {
		return onboardingAnswer{}, errNotHosting
	}
	switch {
	case t.StripeAccount != "" && !t.StripeOnboarded:
		return onboardingAnswer{}, errAccountManagedElsewhere
	case t.StripeAccount == "":
		account, err := s.cfg.Payments.CreateExpressAccount(ctx, t.ID, t.CreatedAt, "")
		if err != nil {
			return onboardingAnswer{}, stripeFailure("create the Express account", err)
		}
		// Kept at once: Stripe forgets the idempotency key after a day,
		// and a second account for one box is what it must never get.
		if t, err = s.st.SetOnboardedAccount(ctx, t.ID, account); err != nil {
			if errors.Is(err, imagestore.ErrExists) {
				// The operator set an account meanwhile: theirs stands.
				return onboardingAnswer{}, errAccountManagedElsewhere.WithCause(err)
			}
			return onboardingAnswer{}, fmt.Errorf("record the Express account of tenant %s: %w", t.Name, err)
		}
		s.log.Info("stripe express account created", "tenant", t.Name, "account", account)
	}
	link, expires, err := s.cfg.Payments.AccountLink(ctx, t.StripeAccount,
		onboardingURL(s.cfg.CheckoutReturnURL, "refresh"), onboardingURL(s.cfg.CheckoutReturnURL, "return"))
	if err != nil {
		return onboardingAnswer{}, stripeFailure("make the onboarding link of "+t.StripeAccount, err)
	}
	return onboardingAnswer{URL: link, ExpiresAt: expires.UTC(), Account: t.StripeAccount,
		ChargesEnabled: t.StripeChargesEnabled, PayoutsEnabled: t.StripePayoutsEnabled}, nil
}

// stripeFailure is the answer to a Stripe call of the onboarding that
// failed: no answer is the 503 the client may retry; anything else (a
// refusal of a request the edge built) is the edge's fault, a 500 whose
// cause stays in the log.
func stripeFailure(what string, err error) error {
	if errors.Is(err, billing.ErrUnavailable) {
		return stripeUnavailable(err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// onboardingURL is base (the Machines page, --checkout-return-url) with
// onboarding=outcome in its query, built as returnURL builds the
// checkout's: Stripe sends the host back there ("return"), or when the
// link is expired or used ("refresh"), where the page asks for a new one.
func onboardingURL(base, outcome string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base // checked at start-up; Stripe refuses it anyway
	}
	q := u.Query()
	q.Set("onboarding", outcome)
	u.RawQuery = q.Encode()
	return u.String()
}

// payoutAccount reports whether t's Stripe account can be paid, as far as
// the edge knows without asking Stripe: an onboarded account once
// account.updated said charges and payouts are enabled; an operator's
// account as soon as it is set (listing asks Stripe about it).
func payoutAccount(t imagestore.Tenant) bool {
	if t.StripeOnboarded {
		return t.StripeAccount != "" && t.StripeChargesEnabled && t.StripePayoutsEnabled
	}
	return t.StripeAccount != ""
}
