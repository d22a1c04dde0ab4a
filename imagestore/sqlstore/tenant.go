package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// RemoveTenant counts what the tenant holds and deletes it only if that
// is nothing, in one write transaction: a ticket, image, listing or order
// made for the tenant meanwhile is either counted or refused by the
// foreign key once the tenant is gone. Ended tickets and closed listings
// go first, since they still name the tenant (a closed listing that has
// orders is not reached: its orders name the tenant as host).
func (s *Store) RemoveTenant(ctx context.Context, name string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("remove tenant: %w", err)
	}
	return s.write(ctx, "remove tenant", func(tx *Tx) error {
		id, err := queryOne(ctx, tx, "tenant", scanValue[int64], `SELECT id FROM tenants WHERE name = ?`, name)
		if err != nil {
			return err
		}
		var h imagestore.TenantInUse
		err = tx.QueryRowContext(ctx, `
SELECT (SELECT count(*) FROM images WHERE tenant_id = ?1),
       (SELECT count(*) FROM tickets WHERE tenant_id = ?1 AND used_at IS NULL AND expires_at > ?2),
       (SELECT count(*) FROM tickets WHERE tenant_id = ?1 AND put_running = 1),
       (SELECT count(*) FROM upload_sessions WHERE tenant_id = ?1),
       (SELECT count(*) FROM listings WHERE host_id = ?1 AND closed_at IS NULL),
       (SELECT count(*) FROM orders WHERE buyer_id = ?1 OR host_id = ?1)`, id, at).
			Scan(&h.Images, &h.Tickets, &h.Uploads, &h.Sessions, &h.Listings, &h.Orders)
		if err != nil {
			return err
		}
		if h != (imagestore.TenantInUse{}) {
			return &h
		}
		for _, q := range []string{
			`DELETE FROM tickets WHERE tenant_id = ?`,
			`DELETE FROM listings WHERE host_id = ?`,
			`DELETE FROM tenants WHERE id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// SetOnboardedAccount records account, made by the tenant's own
// onboarding, in one write transaction: read and conditional write
// together, so that two onboardings at once cannot both record an
// account, and an operator's account is never replaced.
func (s *Store) SetOnboardedAccount(ctx context.Context, tenantID int64, account string) (imagestore.Tenant, error) {
	if account == "" {
		return imagestore.Tenant{}, fmt.Errorf("set onboarded account of tenant %d: no account", tenantID)
	}
	var t imagestore.Tenant
	err := s.write(ctx, "set onboarded account", func(tx *Tx) (err error) {
		t, err = queryOne(ctx, tx, "tenant", scanTenant, `SELECT `+tenantCols+` FROM tenants WHERE id = ?`, tenantID)
		switch {
		case err != nil:
			return err
		case t.StripeAccount == account:
			// A retry, or the operator had already written this very
			// account: the caller made it by onboarding, so it is one.
			if _, err := tx.ExecContext(ctx, `UPDATE tenants SET stripe_onboarded = 1 WHERE id = ?`, tenantID); err != nil {
				return err
			}
			t.StripeOnboarded = true
			return nil
		case t.StripeAccount != "":
			return fmt.Errorf("tenant %d already has another Stripe account: %w", tenantID, imagestore.ErrExists)
		}
		if _, err := tx.ExecContext(ctx, `
UPDATE tenants SET stripe_account = ?, stripe_onboarded = 1, stripe_charges = 0, stripe_payouts = 0
WHERE id = ?`, account, tenantID); err != nil {
			return err
		}
		t.StripeAccount, t.StripeOnboarded, t.StripeChargesEnabled, t.StripePayoutsEnabled = account, true, false, false
		return nil
	})
	if err != nil {
		return imagestore.Tenant{}, err
	}
	return t, nil
}

// SetAccountCapabilities writes charges and payouts on every tenant whose
// account is account (an operator may have given one account to two
// boxes) and returns the onboarded one if any, else the oldest.
func (s *Store) SetAccountCapabilities(ctx context.Context, account string, charges, payouts bool) (imagestore.Tenant, error) {
	if account == "" {
		return imagestore.Tenant{}, fmt.Errorf("set account capabilities: no account: %w", imagestore.ErrNotFound)
	}
	var t imagestore.Tenant
	err := s.write(ctx, "set account capabilities", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE tenants SET stripe_charges = ?, stripe_payouts = ? WHERE stripe_account = ?`,
			charges, payouts, account)
		if err != nil {
			return err
		}
		if err := mustChange(res, "tenant with that Stripe account"); err != nil {
			return err
		}
		t, err = queryOne(ctx, tx, "tenant with that Stripe account", scanTenant,
			`SELECT `+tenantCols+` FROM tenants WHERE stripe_account = ? ORDER BY stripe_onboarded DESC, id LIMIT 1`, account)
		return err
	})
	if err != nil {
		return imagestore.Tenant{}, err
	}
	return t, nil
}
