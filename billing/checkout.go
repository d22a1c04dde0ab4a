// Package billing is everything vmshelf needs of Stripe for the VM market:
// the one gate every machine payment passes, Checkout Sessions as
// destination charges (half to the platform, half to the host box), the
// host's payout capability, and the verification of Stripe's webhook
// events. The market calls it through Payments and ParseEvent and never
// needs to know Stripe's API.
package billing

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/internal/baseurl"
)

// Checkout is one order's payment: Quantity replicas at UnitAmount each (in
// the currency's minor units), paid by the buyer in one Checkout Session.
// Fee goes to the platform, the rest of the total to the host's Connect
// account Destination. Build Fee with Split; the gate refuses any other.
//
// A retry of CreateCheckout for the same order must pass the same Checkout
// (keep ExpiresAt with the order): Stripe compares the parameters of
// requests with one idempotency key and refuses a changed one.
type Checkout struct {
	// OrderID names the order at Stripe: the session's client_reference_id
	// and metadata[order_id] (also on the PaymentIntent), and the
	// idempotency key. 1..200 of [A-Za-z0-9_-].
	OrderID string
	// Description is the line item's name the buyer sees on Stripe's page.
	Description string
	// Currency is a lower-case ISO code with a known Stripe minimum (see
	// MinimumAmount), e.g. "eur".
	Currency   string
	UnitAmount int64
	Quantity   int
	// Fee is the platform's application fee: Split(Total()).
	Fee int64
	// Destination is the host's Connect account, "acct_…".
	Destination string
	// SuccessURL and CancelURL are where Stripe sends the buyer back;
	// absolute http(s) URLs. SuccessURL may carry Stripe's
	// {CHECKOUT_SESSION_ID} template.
	SuccessURL, CancelURL string
	// ExpiresAt is when Stripe expires the session if it is not paid: from
	// MinExpiry to MaxExpiry after the gate runs. Leave a margin above
	// MinExpiry (a minute) for the time between building the Checkout and
	// Stripe's own check.
	ExpiresAt time.Time
}

// Total is UnitAmount × Quantity. It is meaningful only for a Checkout that
// passed Gate, which bounds both factors.
func (c Checkout) Total() int64 { return c.UnitAmount * int64(c.Quantity) }

// Split divides an order's total (minor units, ≥ 0) between the platform
// and the host: the platform's fee is exactly half, rounded down to the
// cent, and the host gets the rest (1800 → 900/900, 1801 → 900/901; as
// docs/operations.md "The VM market" tells hosts).
func Split(total int64) (fee, host int64) {
	fee = total / 2 // truncation is floor for total ≥ 0
	return fee, total - fee
}

// Stripe's limits on a Checkout Session (docs.stripe.com: "Manage limited
// inventory" for expires_at, "Supported currencies" for the amounts).
const (
	// MinExpiry and MaxExpiry bound ExpiresAt from the session's creation.
	MinExpiry = 30 * time.Minute
	MaxExpiry = 24 * time.Hour
	// MaxAmount is the largest amount Stripe takes: eight digits of minor
	// units in every currency.
	MaxAmount = 99_999_999
)

// minimumAmount is Stripe's minimum charge in minor units of the
// two-decimal currencies a European market plausibly charges in
// (docs.stripe.com/currencies#minimum-and-maximum-charge-amounts).
// Currencies without an entry are refused: their minimum is not known
// here, and zero-decimal ones (JPY) have no cent to round the fee to.
var minimumAmount = map[string]int64{
	"eur": 50, "usd": 50, "chf": 50, "gbp": 30,
	"dkk": 250, "nok": 300, "sek": 300, "pln": 200,
}

// MinimumAmount is Stripe's minimum charge in currency (minor units) and
// whether the gate accepts the currency at all. The minimum is the
// presentment currency's: Stripe also requires that a charge converts to
// at least the minimum of the platform's settlement currency (EUR 0.50 for
// a euro platform), which only Stripe can check (a refusal, ErrRefused).
// The command line checks --currency with it before serving.
func MinimumAmount(currency string) (int64, bool) {
	m, ok := minimumAmount[currency]
	return m, ok
}

// Amount writes minor units of one of the gate's currencies (all of them
// two-decimal) in the currency's own units, as a person reads them:
// Amount(300, "nok") is "3.00 NOK".
func Amount(minor int64, currency string) string {
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, strings.ToUpper(currency))
}

// ErrGate is what every refusal of the gate is (errors.Is); the reasons
// below say which check refused. The gate refuses before Stripe is asked.
var ErrGate = errors.New("refused by the payment gate")

// The gate's reasons. Each is also ErrGate.
var (
	ErrFee          error = gateReason("the fee is not exactly half the total")
	ErrDestination  error = gateReason("no valid destination account (acct_…)")
	ErrBelowMinimum error = gateReason("the total is below Stripe's minimum charge")
	ErrAboveMaximum error = gateReason("the total is above Stripe's maximum charge")
	ErrQuantity     error = gateReason("the quantity is below 1")
	ErrUnitAmount   error = gateReason("the unit amount is not positive")
	ErrCurrency     error = gateReason("the currency is not one the gate knows a minimum for")
	ErrOrderID      error = gateReason("the order id is empty or not 1..200 of [A-Za-z0-9_-]")
	ErrDescription  error = gateReason("the line item has no description")
	ErrReturnURL    error = gateReason("a success or cancel URL is missing or not absolute http(s)")
	ErrExpiry       error = gateReason("the expiry is outside Stripe's 30 min .. 24 h window")
)

// gateReason is a refusal of the gate that is also ErrGate, so that the
// market can tell a refused payment (errors.Is(err, ErrGate)) from a
// failed one and still name the reason.
type gateReason string

func (r gateReason) Error() string        { return string(r) }
func (r gateReason) Is(target error) bool { return target == ErrGate }

var (
	orderIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)
	// accountPattern is a Connect account id. It goes into a URL path
	// (TransfersActive), so nothing but the id's own alphabet passes.
	accountPattern = regexp.MustCompile(`^acct_[A-Za-z0-9]{1,250}$`)
	// sessionPattern is a Checkout Session id (cs_test_…, cs_live_…).
	sessionPattern  = regexp.MustCompile(`^cs_[A-Za-z0-9_]{1,250}$`)
	currencyPattern = regexp.MustCompile(`^[a-z]{3}$`)
)

// Gate is the one check every machine payment passes before Stripe is
// asked; CreateCheckout runs it first, and nothing else creates a Checkout
// Session. now is the clock the expiry window is measured from. The error
// is nil or one of the reasons above, wrapped with the numbers that
// failed; it names no secret and no account.
func Gate(c Checkout, now time.Time) error {
	fail := func(reason error, format string, args ...any) error {
		return fmt.Errorf("billing: checkout of order %q: %s: %w", c.OrderID, fmt.Sprintf(format, args...), reason)
	}
	if !orderIDPattern.MatchString(c.OrderID) {
		return fmt.Errorf("billing: checkout: %w", ErrOrderID)
	}
	if strings.TrimSpace(c.Description) == "" {
		return fail(ErrDescription, "empty")
	}
	if !currencyPattern.MatchString(c.Currency) {
		return fail(ErrCurrency, "%q is not three lower-case letters", c.Currency)
	}
	minimum, ok := MinimumAmount(c.Currency)
	if !ok {
		return fail(ErrCurrency, "%q", c.Currency)
	}
	if c.Quantity < 1 {
		return fail(ErrQuantity, "quantity %d", c.Quantity)
	}
	if c.UnitAmount <= 0 {
		return fail(ErrUnitAmount, "unit amount %d", c.UnitAmount)
	}
	// Compared before multiplying, so that no product overflows.
	if c.UnitAmount > MaxAmount/int64(c.Quantity) {
		return fail(ErrAboveMaximum, "%d × %d > %d", c.UnitAmount, c.Quantity, MaxAmount)
	}
	total := c.Total()
	if total < minimum {
		return fail(ErrBelowMinimum, "total %d %s < %d", total, c.Currency, minimum)
	}
	if fee, _ := Split(total); c.Fee != fee {
		return fail(ErrFee, "fee %d, want %d of total %d", c.Fee, fee, total)
	}
	if !accountPattern.MatchString(c.Destination) {
		return fail(ErrDestination, "missing or malformed")
	}
	if !absoluteHTTP(c.SuccessURL) {
		return fail(ErrReturnURL, "success URL")
	}
	if !absoluteHTTP(c.CancelURL) {
		return fail(ErrReturnURL, "cancel URL")
	}
	// Stripe gets whole seconds and checks them against its own clock at
	// creation; the gate checks what Stripe will see.
	ahead := time.Unix(c.ExpiresAt.Unix(), 0).Sub(now)
	if c.ExpiresAt.IsZero() || ahead < MinExpiry || ahead > MaxExpiry {
		return fail(ErrExpiry, "expires %s after now", ahead.Round(time.Second))
	}
	return nil
}

// absoluteHTTP reports whether s is an absolute http(s) URL with a host.
func absoluteHTTP(s string) bool {
	u, err := baseurl.Parse(s)
	return err == nil && u.User == nil
}
