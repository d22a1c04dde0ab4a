package billing

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// testKey is the secret key of the tests. No error text may contain it.
const testKey = "sk_test_51VmshelfSecretKey0000000000000000"

// newFake is a stripetest.Server that accepts testKey and knows accounts
// (id → transfers capability), stopped when t ends. A test fixes what
// its routes answer (Answer, AnswerWith) and reads what they were sent
// (History).
func newFake(t *testing.T, accounts map[string]string) *stripetest.Server {
	t.Helper()
	fake, err := stripetest.New(testKey, accounts)
	if err != nil {
		t.Fatalf("stripetest.New: %v", err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	return fake
}

// clientOf is a Stripe client of fake at testNow, on a fresh registry.
func clientOf(t *testing.T, fake *stripetest.Server, edit ...func(*StripeConfig)) (*Stripe, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg := StripeConfig{
		SecretKey: testKey, APIBase: fake.URL, Timeout: 10 * time.Second,
		Metrics: reg, Now: func() time.Time { return testNow },
	}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := NewStripe(cfg)
	if err != nil {
		t.Fatalf("NewStripe: %v", err)
	}
	return s, reg
}

// Shapes of Stripe's answers, from its API reference (the Checkout Session
// and Account objects, the error object) with vmshelf's values.
const (
	// sessionOpen is a fresh session: no PaymentIntent yet.
	sessionOpen = `{
  "id": "cs_test_a1VmshelfOrder42",
  "object": "checkout.session",
  "amount_subtotal": 1800,
  "amount_total": 1800,
  "cancel_url": "https://edge.example/machines",
  "client_reference_id": "ord_42",
  "created": 1772366400,
  "currency": "eur",
  "expires_at": 1772368260,
  "livemode": false,
  "metadata": {"order_id": "ord_42"},
  "mode": "payment",
  "payment_intent": null,
  "payment_method_types": ["card"],
  "payment_status": "unpaid",
  "status": "open",
  "success_url": "https://edge.example/machines?paid={CHECKOUT_SESSION_ID}",
  "url": "https://checkout.stripe.com/c/pay/cs_test_a1VmshelfOrder42#fidkdWxOYHwnPyd1blpxYHZxWjA0"
}`
	// sessionPaid is the same session after the buyer paid, with its
	// PaymentIntent expanded.
	sessionPaid = `{
  "id": "cs_test_a1VmshelfOrder42",
  "object": "checkout.session",
  "amount_subtotal": 1800,
  "amount_total": 1800,
  "client_reference_id": "ord_42",
  "created": 1772366400,
  "currency": "eur",
  "expires_at": 1772368260,
  "livemode": false,
  "metadata": {"order_id": "ord_42"},
  "mode": "payment",
  "payment_intent": {
    "id": "pi_3VmshelfPaid0001",
    "object": "payment_intent",
    "amount": 1800,
    "amount_received": 1800,
    "application_fee_amount": 900,
    "capture_method": "automatic",
    "currency": "eur",
    "latest_charge": "ch_3VmshelfPaid0001",
    "metadata": {"order_id": "ord_42"},
    "status": "succeeded",
    "transfer_data": {"destination": "acct_1HostBox0000001"},
    "transfer_group": "group_pi_3VmshelfPaid0001"
  },
  "payment_status": "paid",
  "status": "complete",
  "url": null
}`
	sessionExpired = `{
  "id": "cs_test_a1VmshelfOrder42",
  "object": "checkout.session",
  "amount_total": 1800,
  "client_reference_id": "ord_42",
  "currency": "eur",
  "expires_at": 1772368260,
  "metadata": {"order_id": "ord_42"},
  "mode": "payment",
  "payment_intent": null,
  "payment_status": "unpaid",
  "status": "expired",
  "url": null
}`
	accountActive = `{
  "id": "acct_1HostBox0000001",
  "object": "account",
  "business_type": "individual",
  "capabilities": {"card_payments": "active", "transfers": "active"},
  "charges_enabled": true,
  "country": "DE",
  "default_currency": "eur",
  "details_submitted": true,
  "payouts_enabled": true,
  "type": "express"
}`
	accountPending = `{
  "id": "acct_1HostBox0000001",
  "object": "account",
  "capabilities": {"card_payments": "pending", "transfers": "pending"},
  "charges_enabled": false,
  "details_submitted": false,
  "payouts_enabled": false,
  "type": "express"
}`
	accountNoCapabilities = `{"id": "acct_1HostBox0000001", "object": "account", "type": "express"}`

	errNoSuchSession = `{"error": {"code": "resource_missing", "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
  "message": "No such checkout.session: 'cs_test_a1VmshelfOrder42'", "param": "session", "type": "invalid_request_error"}}`
	errNotExpirable = `{"error": {"message": "Only Checkout Sessions with a status in [\"open\"] can be expired. This Checkout Session has a status of ` + "`complete`" + `.",
  "type": "invalid_request_error"}}`
	errNoSuchDestination = `{"error": {"code": "resource_missing", "message": "No such destination: 'acct_1HostBox0000001'",
  "param": "payment_intent_data[transfer_data][destination]", "type": "invalid_request_error"}}`
	errBadKey = `{"error": {"message": "Invalid API Key provided: ` + testKey + `", "type": "invalid_request_error"}}`
	errRate   = `{"error": {"code": "rate_limit", "message": "Too many requests hit the API too quickly.", "type": "invalid_request_error"}}`
	errLock   = `{"error": {"code": "lock_timeout", "message": "This object cannot be accessed right now because another API request or Stripe process is currently accessing it.", "type": "invalid_request_error"}}`
	errAPI    = `{"error": {"message": "An unknown error occurred", "type": "api_error"}}`
	errNoAcct = `{"error": {"code": "account_invalid", "message": "The provided key does not have access to account 'acct_1HostBox0000001' (or that account does not exist).", "type": "invalid_request_error"}}`
	// errUnknownRoute is Stripe's answer to a route it does not have.
	errUnknownRoute = `{"error":{"message":"Unrecognized request URL (POST: /v1/refunds).","type":"invalid_request_error"}}`
)

// Shapes of the refund and Connect answers (the Refund, Account and
// Account Link objects of Stripe's API reference) with vmshelf's values.
const (
	refundSucceeded = `{
  "id": "re_3VmshelfRefund01",
  "object": "refund",
  "amount": 1800,
  "balance_transaction": "txn_3VmshelfRefund01",
  "charge": "ch_3VmshelfPaid0001",
  "created": 1772367600,
  "currency": "eur",
  "destination_details": null,
  "failure_reason": null,
  "metadata": {"order_id": "ord_42", "cause": "provisionfailed"},
  "payment_intent": "pi_3VmshelfPaid0001",
  "reason": null,
  "receipt_number": null,
  "source_transfer_reversal": null,
  "status": "succeeded",
  "transfer_reversal": "trr_3VmshelfRefund01"
}`
	refundFailed = `{
  "id": "re_3VmshelfRefund01",
  "object": "refund",
  "amount": 1800,
  "charge": "ch_3VmshelfPaid0001",
  "currency": "eur",
  "failure_reason": "expired_or_canceled_card",
  "metadata": {"order_id": "ord_42", "cause": "provisionfailed"},
  "payment_intent": {"id": "pi_3VmshelfPaid0001", "object": "payment_intent"},
  "status": "failed"
}`
	accountCreated = `{
  "id": "acct_1NewHost00000001",
  "object": "account",
  "capabilities": {"card_payments": "inactive", "transfers": "inactive"},
  "charges_enabled": false,
  "country": "DE",
  "details_submitted": false,
  "metadata": {"tenant_id": "7"},
  "payouts_enabled": false,
  "type": "express"
}`
	accountLinkCreated = `{
  "object": "account_link",
  "created": 1772366400,
  "expires_at": 1772366700,
  "url": "https://connect.stripe.com/setup/e/acct_1NewHost00000001/VmshelfLink0001"
}`
	errAlreadyRefunded = `{"error": {"code": "charge_already_refunded", "doc_url": "https://stripe.com/docs/error-codes/charge-already-refunded",
  "message": "Charge ch_3VmshelfPaid0001 has already been refunded.", "type": "invalid_request_error"}}`
	errChargeDisputed = `{"error": {"code": "charge_disputed", "doc_url": "https://stripe.com/docs/error-codes/charge-disputed",
  "message": "Charge ch_3VmshelfPaid0001 has been charged back.", "type": "invalid_request_error"}}`
	errNoSuchPaymentIntent = `{"error": {"code": "resource_missing", "message": "No such payment_intent: 'pi_3VmshelfPaid0001'",
  "param": "payment_intent", "type": "invalid_request_error"}}`
)
