package billing

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// testNow is the clock of the tests: a fixed instant, so that expiries are
// exact.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const testHost = "acct_1HostBox0000001"

// example is the documented order: 6.00 EUR × 3 = 18.00, 9.00 to the platform and
// 9.00 to the host.
func example() Checkout {
	return Checkout{
		OrderID:     "ord_42",
		Description: "3 × VM replica-month on box alpha",
		Currency:    "eur",
		UnitAmount:  600,
		Quantity:    3,
		Fee:         900,
		Destination: testHost,
		SuccessURL:  "https://edge.example/machines?paid={CHECKOUT_SESSION_ID}",
		CancelURL:   "https://edge.example/machines",
		ExpiresAt:   testNow.Add(31 * time.Minute),
	}
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		total, fee, host int64
	}{
		{1800, 900, 900}, // the documented example
		{1801, 900, 901}, // the odd cent is the host's
		{50, 25, 25},
		{51, 25, 26},
		{0, 0, 0},
		{MaxAmount, 49_999_999, 50_000_000},
	} {
		fee, host := Split(tc.total)
		if fee != tc.fee || host != tc.host {
			t.Errorf("Split(%d) = %d, %d; want %d, %d", tc.total, fee, host, tc.fee, tc.host)
		}
		if fee+host != tc.total {
			t.Errorf("Split(%d): %d + %d is not the total", tc.total, fee, host)
		}
	}
}

func TestGateAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Checkout)
	}{
		{"the documented example", func(*Checkout) {}},
		{"odd total, fee rounded down", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = 1801, 1, 900 }},
		{"exactly Stripe's minimum", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = 50, 1, 25 }},
		{"exactly Stripe's maximum", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = MaxAmount, 1, MaxAmount/2 }},
		{"GBP's lower minimum", func(c *Checkout) { c.Currency, c.UnitAmount, c.Quantity, c.Fee = "gbp", 30, 1, 15 }},
		{"expiry exactly 30 min", func(c *Checkout) { c.ExpiresAt = testNow.Add(MinExpiry) }},
		{"expiry exactly 24 h", func(c *Checkout) { c.ExpiresAt = testNow.Add(MaxExpiry) }},
		{"http return URLs", func(c *Checkout) { c.SuccessURL, c.CancelURL = "http://127.0.0.1:8481/ok", "http://127.0.0.1:8481/no" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := example()
			tc.edit(&c)
			if err := Gate(c, testNow); err != nil {
				t.Fatalf("Gate: %v", err)
			}
		})
	}
}

func TestGateRefuses(t *testing.T) {
	for _, tc := range gateRefusals {
		t.Run(tc.name, func(t *testing.T) {
			c := example()
			tc.edit(&c)
			err := Gate(c, testNow)
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrGate) {
				t.Fatalf("Gate = %v; want %v (and ErrGate)", err, tc.want)
			}
			if strings.Contains(err.Error(), testHost) {
				t.Errorf("the refusal names the host's account: %v", err)
			}
		})
	}
}

// gateRefusals are the checkouts the gate must refuse, each with its
// reason. The CreateCheckout test sends them all and asserts that Stripe
// heard nothing.
var gateRefusals = []struct {
	name string
	edit func(*Checkout)
	want error
}{
	{"fee one cent short", func(c *Checkout) { c.Fee = 899 }, ErrFee},
	{"fee one cent over", func(c *Checkout) { c.Fee = 901 }, ErrFee},
	{"no fee", func(c *Checkout) { c.Fee = 0 }, ErrFee},
	{"the whole total as fee", func(c *Checkout) { c.Fee = 1800 }, ErrFee},
	{"odd total, fee rounded up", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = 1801, 1, 901 }, ErrFee},
	{"no destination", func(c *Checkout) { c.Destination = "" }, ErrDestination},
	{"destination without id", func(c *Checkout) { c.Destination = "acct_" }, ErrDestination},
	{"destination not an account", func(c *Checkout) { c.Destination = "cus_1HostBox" }, ErrDestination},
	{"destination with a path", func(c *Checkout) { c.Destination = "acct_1/../x" }, ErrDestination},
	{"total 49 cents", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = 49, 1, 24 }, ErrBelowMinimum},
	{"GBP below its minimum", func(c *Checkout) { c.Currency, c.UnitAmount, c.Quantity, c.Fee = "gbp", 29, 1, 14 }, ErrBelowMinimum},
	{"total above the maximum", func(c *Checkout) { c.UnitAmount, c.Quantity, c.Fee = MaxAmount, 2, MaxAmount }, ErrAboveMaximum},
	{"product overflows int64", func(c *Checkout) { c.UnitAmount, c.Quantity = 1<<62, 4 }, ErrAboveMaximum},
	{"quantity 0", func(c *Checkout) { c.Quantity = 0 }, ErrQuantity},
	{"negative quantity", func(c *Checkout) { c.Quantity = -3 }, ErrQuantity},
	{"unit amount 0", func(c *Checkout) { c.UnitAmount, c.Fee = 0, 0 }, ErrUnitAmount},
	{"negative unit amount", func(c *Checkout) { c.UnitAmount, c.Fee = -600, -900 }, ErrUnitAmount},
	{"upper-case currency", func(c *Checkout) { c.Currency = "EUR" }, ErrCurrency},
	{"two-letter currency", func(c *Checkout) { c.Currency = "eu" }, ErrCurrency},
	{"no currency", func(c *Checkout) { c.Currency = "" }, ErrCurrency},
	{"currency without a known minimum", func(c *Checkout) { c.Currency = "jpy" }, ErrCurrency},
	{"no order id", func(c *Checkout) { c.OrderID = "" }, ErrOrderID},
	{"order id with a space", func(c *Checkout) { c.OrderID = "ord 42" }, ErrOrderID},
	{"order id too long", func(c *Checkout) { c.OrderID = strings.Repeat("a", 201) }, ErrOrderID},
	{"no description", func(c *Checkout) { c.Description = " " }, ErrDescription},
	{"no success URL", func(c *Checkout) { c.SuccessURL = "" }, ErrReturnURL},
	{"no cancel URL", func(c *Checkout) { c.CancelURL = "" }, ErrReturnURL},
	{"relative cancel URL", func(c *Checkout) { c.CancelURL = "/machines" }, ErrReturnURL},
	{"success URL of another scheme", func(c *Checkout) { c.SuccessURL = "javascript:alert(1)" }, ErrReturnURL},
	{"no expiry", func(c *Checkout) { c.ExpiresAt = time.Time{} }, ErrExpiry},
	{"expiry in the past", func(c *Checkout) { c.ExpiresAt = testNow.Add(-time.Minute) }, ErrExpiry},
	{"expiry 29 min", func(c *Checkout) { c.ExpiresAt = testNow.Add(29 * time.Minute) }, ErrExpiry},
	// Stripe gets whole seconds: 30 min less a fraction is 29:59 there.
	{"expiry 30 min less a fraction", func(c *Checkout) { c.ExpiresAt = testNow.Add(MinExpiry - time.Millisecond) }, ErrExpiry},
	{"expiry 24 h and a second", func(c *Checkout) { c.ExpiresAt = testNow.Add(MaxExpiry + time.Second) }, ErrExpiry},
}

func TestMinimumAmount(t *testing.T) {
	for _, tc := range []struct {
		currency string
		min      int64
		ok       bool
	}{
		{"eur", 50, true}, {"usd", 50, true}, {"gbp", 30, true},
		{"jpy", 0, false}, {"EUR", 0, false}, {"", 0, false},
	} {
		min, ok := MinimumAmount(tc.currency)
		if min != tc.min || ok != tc.ok {
			t.Errorf("MinimumAmount(%q) = %d, %v; want %d, %v", tc.currency, min, ok, tc.min, tc.ok)
		}
	}
}

func TestPaidFor(t *testing.T) {
	paid := Session{
		ID: "cs_test_1", Status: StatusComplete, PaymentStatus: PaymentPaid,
		OrderID: "ord_42", ClientReferenceID: "ord_42", Currency: "eur",
		AmountTotal: 1800, Fee: 900, Destination: testHost,
	}
	for _, tc := range []struct {
		name string
		edit func(*Session)
		want error
	}{
		{"the order's paid charge", func(*Session) {}, nil},
		{"unpaid", func(s *Session) { s.PaymentStatus = PaymentUnpaid }, ErrNotPaid},
		{"nothing to pay", func(s *Session) { s.PaymentStatus = PaymentNoPaymentRequired }, ErrNotPaid},
		{"another order", func(s *Session) { s.OrderID = "ord_43" }, ErrMismatch},
		{"another client reference", func(s *Session) { s.ClientReferenceID = "ord_43" }, ErrMismatch},
		{"another currency", func(s *Session) { s.Currency = "usd" }, ErrMismatch},
		{"another total", func(s *Session) { s.AmountTotal = 1700 }, ErrMismatch},
		{"another fee", func(s *Session) { s.Fee = 1800 }, ErrMismatch},
		{"no fee known (no PaymentIntent)", func(s *Session) { s.Fee, s.Destination = 0, "" }, ErrMismatch},
		{"another destination", func(s *Session) { s.Destination = "acct_1Other" }, ErrMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := paid
			tc.edit(&s)
			err := s.PaidFor(example())
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("PaidFor = %v; want %v", err, tc.want)
			}
		})
	}
}

func TestAmount(t *testing.T) {
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{300, "nok", "3.00 NOK"}, {50, "nok", "0.50 NOK"}, {299, "nok", "2.99 NOK"},
		{5, "eur", "0.05 EUR"}, {1_000_000, "eur", "10000.00 EUR"}, {0, "sek", "0.00 SEK"}, {-250, "dkk", "-2.50 DKK"},
	} {
		if got := Amount(tc.minor, tc.currency); got != tc.want {
			t.Errorf("Amount(%d, %q) = %q, want %q", tc.minor, tc.currency, got, tc.want)
		}
	}
}
