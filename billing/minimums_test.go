package billing

import (
	"errors"
	"testing"
)

// TestGateMinimumEveryCurrency: for every currency the gate knows, its
// minimum is Stripe's documented minimum charge
// (docs.stripe.com/currencies#minimum-and-maximum-charge-amounts), a total
// of exactly it passes and one minor unit less is refused. The other
// tests sit on EUR, USD, GBP and NOK only, so a wrong figure for DKK,
// SEK, PLN or CHF (a listing that cannot be paid, or a checkout Stripe
// refuses) went unseen. A currency added to the table must be added here.
func TestGateMinimumEveryCurrency(t *testing.T) {
	stripe := map[string]int64{
		"eur": 50, "usd": 50, "chf": 50, "gbp": 30,
		"dkk": 250, "nok": 300, "sek": 300, "pln": 200,
	}
	if len(minimumAmount) != len(stripe) {
		t.Errorf("the gate knows %d currencies, the test %d: %v", len(minimumAmount), len(stripe), minimumAmount)
	}
	for currency, want := range stripe {
		t.Run(currency, func(t *testing.T) {
			if got, ok := MinimumAmount(currency); !ok || got != want {
				t.Fatalf("MinimumAmount(%q) = %d, %v; Stripe's minimum is %d", currency, got, ok, want)
			}
			c := example()
			c.Currency, c.UnitAmount, c.Quantity, c.Fee = currency, want, 1, want/2
			if err := Gate(c, testNow); err != nil {
				t.Errorf("a total of exactly the minimum: %v", err)
			}
			c.UnitAmount, c.Fee = want-1, (want-1)/2
			if err := Gate(c, testNow); !errors.Is(err, ErrBelowMinimum) {
				t.Errorf("a total one below the minimum: %v, want ErrBelowMinimum", err)
			}
		})
	}
}
