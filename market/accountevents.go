package market

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
)

// What the webhook did with an account.updated event.
const (
	resultAccountUpdated = "accountUpdated" // the host's capabilities are recorded as Stripe has them now
	resultUnknownAccount = "unknownAccount" // no tenant of this edge has the account: logged, nothing changes
)

// accountUpdated handles account.updated: a host's Connect account
// changed (its onboarding finished, Stripe enabled or disabled charges or
// payouts). As with checkout events the event only says what to look at:
// the account is read again from Stripe, so that an old event delivered
// after a newer one (Stripe does not keep their order) cannot set flags
// Stripe no longer has. An account no tenant has costs no Stripe call.
func (s *Server) accountUpdated(ctx context.Context, ev billing.Event) (string, error) {
	if s.cfg.Payments == nil {
		return "", errPaymentsUnavailable // 503: Stripe retries once keys are set
	}
	known, err := s.accountKnown(ctx, ev.Account)
	if err != nil {
		return "", err
	}
	if !known {
		s.log.Warn("stripe account.updated for an account no tenant has; ignored", "event", logText(ev.ID), "account", logText(ev.Account))
		return resultUnknownAccount, nil
	}
	acct, err := s.cfg.Payments.Account(ctx, ev.Account)
	switch {
	case errors.Is(err, billing.ErrNotFound) || errors.Is(err, billing.ErrBadID):
		// Stripe does not (or no longer) know it as ours: nothing to
		// believe, and resending will not change that.
		s.log.Error("stripe account.updated names an account Stripe does not know; ignored",
			"event", logText(ev.ID), "account", logText(ev.Account), "err", err.Error())
		return resultUnknownAccount, nil
	case err != nil:
		return "", fmt.Errorf("re-read Stripe account %s: %w", ev.Account, err) // 503 when Stripe did not answer
	}
	t, err := s.st.SetAccountCapabilities(ctx, ev.Account, acct.ChargesEnabled, acct.PayoutsEnabled)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		// Its tenant lost the account between the two reads.
		s.log.Warn("stripe account.updated for an account no tenant has any more; ignored", "event", logText(ev.ID), "account", ev.Account)
		return resultUnknownAccount, nil
	case err != nil:
		return "", err
	}
	s.log.Info("stripe account updated", "tenant", t.Name, "account", ev.Account,
		"charges_enabled", acct.ChargesEnabled, "payouts_enabled", acct.PayoutsEnabled, "details_submitted", acct.DetailsSubmitted)
	return resultAccountUpdated, nil
}

// accountKnown reports whether a tenant of this edge has account.
func (s *Server) accountKnown(ctx context.Context, account string) (bool, error) {
	if account == "" {
		return false, nil
	}
	tenants, err := s.st.Tenants(ctx)
	if err != nil {
		return false, err
	}
	for _, t := range tenants {
		if t.StripeAccount == account {
			return true, nil
		}
	}
	return false, nil
}
