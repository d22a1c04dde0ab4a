package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v82"
)

// Payments is what the market needs of Stripe. Every error is a gate
// refusal (ErrGate, CreateCheckout only), ErrBadID, ErrBadURL
// (AccountLink only), or a *StripeError of kind ErrUnavailable (retry
// later, never a negative answer), ErrNotFound or ErrRefused.
type Payments interface {
	// CreateCheckout runs Gate and opens the order's Checkout Session as a
	// destination charge. A retry with the same Checkout returns the same
	// session (one idempotency key per order).
	CreateCheckout(ctx context.Context, c Checkout) (Session, error)
	// Session reads a session as Stripe has it now, with its PaymentIntent.
	Session(ctx context.Context, id string) (Session, error)
	// ExpireSession makes sure a session can no longer be paid and returns
	// its final state: "expired" (by this call or before), or "complete"
	// when the buyer paid first; then the reservation must stay.
	ExpireSession(ctx context.Context, id string) (Session, error)
	// TransfersActive reports whether a Connect account can receive
	// destination charges (capabilities.transfers is "active"). On an
	// error the bool means nothing.
	TransfersActive(ctx context.Context, account string) (bool, error)

	// Refund refunds a paid order's PaymentIntent in full, reversing the
	// host's transfer and the platform's fee. A retry with the same order
	// and cause returns the same refund (one idempotency key, RefundKey);
	// a PaymentIntent refunded before is ErrRefused and ErrAlreadyRefunded.
	// Only Status "succeeded" is a finished refund.
	Refund(ctx context.Context, r RefundRequest) (Refund, error)
	// CreateExpressAccount creates a tenant's Connect Express account and
	// returns its id; a retry for the same tenant returns the same account.
	CreateExpressAccount(ctx context.Context, tenantID int64, since time.Time, country string) (string, error)
	// AccountLink is a one-time URL of Stripe's onboarding for account and
	// its expiry.
	AccountLink(ctx context.Context, account, refreshURL, returnURL string) (string, time.Time, error)
	// Account reads what a Connect account can do now.
	Account(ctx context.Context, id string) (AccountState, error)
}

// Session is a Checkout Session as Stripe reports it.
type Session struct {
	ID  string
	URL string // where the buyer pays; empty once the session is not open
	// Status is "open", "complete" or "expired".
	Status string
	// PaymentStatus is "paid", "unpaid" or "no_payment_required".
	PaymentStatus     string
	OrderID           string // metadata[order_id]
	ClientReferenceID string
	Currency          string
	AmountTotal       int64
	// Fee and Destination are the PaymentIntent's application_fee_amount
	// and transfer_data.destination. Stripe makes the PaymentIntent when
	// the buyer pays, so they are zero while a session is open.
	Fee         int64
	Destination string
	// PaymentIntent is the pi_… the buyer paid with, which Refund takes;
	// empty while the session is open (and after it expired unpaid).
	PaymentIntent string
	ExpiresAt     time.Time
}

// The values of Session.Status and Session.PaymentStatus.
const (
	StatusOpen     = "open"
	StatusComplete = "complete"
	StatusExpired  = "expired"

	PaymentPaid              = "paid"
	PaymentUnpaid            = "unpaid"
	PaymentNoPaymentRequired = "no_payment_required"
)

// ErrNotPaid and ErrMismatch are PaidFor's answers.
var (
	ErrNotPaid  = errors.New("the session is not paid")
	ErrMismatch = errors.New("the session is not the charge the order asked for")
)

// PaidFor is the check before an order is marked paid: s must be paid
// (payment_status "paid") and be exactly c's destination charge — order,
// currency, total, the platform's fee and the host's account. It is nil,
// ErrNotPaid or ErrMismatch naming the first field that differs.
func (s Session) PaidFor(c Checkout) error {
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"order id", s.OrderID, c.OrderID},
		{"client reference", s.ClientReferenceID, c.OrderID},
		{"currency", s.Currency, c.Currency},
		{"total", s.AmountTotal, c.Total()},
		{"fee", s.Fee, c.Fee},
		{"destination", s.Destination, c.Destination},
	} {
		if f.got != f.want {
			return fmt.Errorf("billing: session %s: %s %v, want %v: %w", s.ID, f.name, f.got, f.want, ErrMismatch)
		}
	}
	if s.PaymentStatus != PaymentPaid {
		return fmt.Errorf("billing: session %s: payment status %q: %w", s.ID, s.PaymentStatus, ErrNotPaid)
	}
	return nil
}

// StripeConfig is what NewStripe needs.
type StripeConfig struct {
	// SecretKey is the platform's secret (sk_…) or restricted (rk_…) key,
	// from STRIPE_SECRET_KEY or a file. It is sent only in the
	// Authorization header and never appears in an error or a metric.
	SecretKey string
	// APIBase is --stripe-api-base, without /v1; empty means Stripe's.
	APIBase string
	// HTTPClient carries the calls; nil means a client of this package's.
	HTTPClient *http.Client
	// Timeout bounds each call (the caller's ctx may end it sooner); 0
	// means DefaultTimeout.
	Timeout time.Duration
	// Metrics receives vmshelf_stripe_request_duration_seconds; nil
	// registers nothing.
	Metrics prometheus.Registerer
	// Now is the clock the gate measures the expiry from; nil is time.Now.
	Now func() time.Time
}

// DefaultTimeout is StripeConfig.Timeout's default: Stripe answers in well
// under a second, and a buyer's order request waits for the checkout.
const DefaultTimeout = 15 * time.Second

// Stripe is Payments over Stripe's API (stripe-go). Safe for concurrent use.
type Stripe struct {
	client  *stripe.Client
	key     string
	timeout time.Duration
	now     func() time.Time
	metrics *metrics
}

var _ Payments = (*Stripe)(nil)

// NewStripe checks cfg and builds the client. It asks Stripe nothing.
func NewStripe(cfg StripeConfig) (*Stripe, error) {
	if err := checkKey(cfg.SecretKey); err != nil {
		return nil, err
	}
	base := cfg.APIBase
	if base == "" {
		base = stripe.APIURL
	}
	if err := checkBase(base); err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("billing: negative Stripe timeout %s", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	hc := cfg.HTTPClient
	if hc == nil {
		// The per-call context bounds each call; the client's timeout is a
		// backstop for a body that never ends.
		hc = &http.Client{Timeout: cfg.Timeout}
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:        stripe.String(strings.TrimSuffix(base, "/")),
		HTTPClient: hc,
		// stripe-go's retries sleep with time.Sleep, deaf to the caller's
		// context, for up to seconds; the callers retry anyway (a buyer's
		// new attempt, the sweeper's next run, Stripe's webhook retries),
		// and an "unavailable" error says so. One attempt per call.
		MaxNetworkRetries: stripe.Int64(0),
		// The errors come back to the caller, which logs them once; the
		// library's own lines would go to stderr past slog.
		LeveledLogger:   &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry: stripe.Bool(false),
	})
	return &Stripe{
		client:  stripe.NewClient(cfg.SecretKey, stripe.WithBackends(backends)),
		key:     cfg.SecretKey,
		timeout: cfg.Timeout,
		now:     cfg.Now,
		metrics: m,
	}, nil
}

// checkKey refuses what cannot be a secret key: empty, with white space
// (a file's newline), or another kind of Stripe secret (whsec_, pk_). Its
// errors never quote the key.
func checkKey(key string) error {
	switch {
	case key == "":
		return errors.New("billing: no Stripe secret key (STRIPE_SECRET_KEY)")
	case strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return errors.New("billing: the Stripe secret key contains white space or control characters")
	case !strings.HasPrefix(key, "sk_") && !strings.HasPrefix(key, "rk_"):
		return errors.New("billing: the Stripe secret key is not a secret or restricted key (sk_… or rk_…)")
	}
	return nil
}

// checkBase refuses an API base stripe-go would misuse: it appends
// /v1/... to it, so it must be scheme and host only.
func checkBase(base string) error {
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("billing: Stripe API base: %w", err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http", u.Host == "":
		return fmt.Errorf("billing: Stripe API base %q is not an absolute http(s) URL", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("billing: Stripe API base %q carries credentials; the key goes in STRIPE_SECRET_KEY", u.Redacted())
	case strings.TrimSuffix(u.Path, "/") != "", u.RawQuery != "", u.Fragment != "":
		return fmt.Errorf("billing: Stripe API base %q must be scheme and host only (no /v1)", u.Redacted())
	}
	return nil
}

// call runs one Stripe call under the timeout and accounts for it.
func (s *Stripe) call(ctx context.Context, op string, do func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	err := do(ctx)
	if err != nil {
		err = classify(ctx, op, err, s.key)
	}
	s.metrics.observe(op, start, err)
	return err
}

// idempotencyKey is the key of an order's checkout: one per order, so
// that no retry opens a second session (Stripe keeps keys for 24 h, the
// longest a session lives).
func idempotencyKey(orderID string) string { return "vmshelf-checkout-" + orderID }

// CreateCheckout implements Payments. It is the only function that creates
// a Checkout Session, and the gate is its first step.
func (s *Stripe) CreateCheckout(ctx context.Context, c Checkout) (Session, error) {
	if err := Gate(c, s.now()); err != nil {
		return Session{}, err
	}
	p := &stripe.CheckoutSessionCreateParams{
		Mode: stripe.String(string(stripe.CheckoutSessionModePayment)),
		LineItems: []*stripe.CheckoutSessionCreateLineItemParams{{
			PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{
				Currency:   stripe.String(c.Currency),
				UnitAmount: stripe.Int64(c.UnitAmount),
				ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{
					Name: stripe.String(c.Description),
				},
			},
			Quantity: stripe.Int64(int64(c.Quantity)),
		}},
		// A destination charge: the buyer pays the platform, Stripe moves
		// everything but the fee to the host's account.
		PaymentIntentData: &stripe.CheckoutSessionCreatePaymentIntentDataParams{
			ApplicationFeeAmount: stripe.Int64(c.Fee),
			TransferData: &stripe.CheckoutSessionCreatePaymentIntentDataTransferDataParams{
				Destination: stripe.String(c.Destination),
			},
			Metadata: map[string]string{"order_id": c.OrderID},
		},
		// Adaptive Pricing would let the buyer pay in another currency,
		// and then total and fee would no longer be the ones the gate
		// checked and the webhook re-checks.
		AdaptivePricing:   &stripe.CheckoutSessionCreateAdaptivePricingParams{Enabled: stripe.Bool(false)},
		ClientReferenceID: stripe.String(c.OrderID),
		Metadata:          map[string]string{"order_id": c.OrderID},
		SuccessURL:        stripe.String(c.SuccessURL),
		CancelURL:         stripe.String(c.CancelURL),
		ExpiresAt:         stripe.Int64(c.ExpiresAt.Unix()),
	}
	p.SetIdempotencyKey(idempotencyKey(c.OrderID))
	p.AddExpand("payment_intent")
	var cs *stripe.CheckoutSession
	err := s.call(ctx, callCreateCheckout, func(ctx context.Context) (err error) {
		cs, err = s.client.V1CheckoutSessions.Create(ctx, p)
		return err
	})
	if err != nil {
		return Session{}, err
	}
	return sessionFrom(cs), nil
}

// Session implements Payments.
func (s *Stripe) Session(ctx context.Context, id string) (Session, error) {
	if !sessionPattern.MatchString(id) {
		return Session{}, fmt.Errorf("billing: session id %q: %w", id, ErrBadID)
	}
	p := &stripe.CheckoutSessionRetrieveParams{}
	p.AddExpand("payment_intent")
	var cs *stripe.CheckoutSession
	err := s.call(ctx, callGetSession, func(ctx context.Context) (err error) {
		cs, err = s.client.V1CheckoutSessions.Retrieve(ctx, id, p)
		return err
	})
	if err != nil {
		return Session{}, err
	}
	return sessionFrom(cs), nil
}

// ExpireSession implements Payments. Stripe refuses to expire a session
// that is not open (400 "Only Checkout Sessions with a status in ["open"]
// can be expired"); then the session is read, and if it has ended, that
// end is the answer.
func (s *Stripe) ExpireSession(ctx context.Context, id string) (Session, error) {
	if !sessionPattern.MatchString(id) {
		return Session{}, fmt.Errorf("billing: session id %q: %w", id, ErrBadID)
	}
	p := &stripe.CheckoutSessionExpireParams{}
	p.AddExpand("payment_intent")
	var cs *stripe.CheckoutSession
	err := s.call(ctx, callExpireSession, func(ctx context.Context) (err error) {
		cs, err = s.client.V1CheckoutSessions.Expire(ctx, id, p)
		return err
	})
	if err == nil {
		return sessionFrom(cs), nil
	}
	var se *StripeError
	if !errors.As(err, &se) || se.Kind != ErrRefused || se.Status != http.StatusBadRequest {
		return Session{}, err
	}
	now, gerr := s.Session(ctx, id)
	if gerr != nil {
		return Session{}, gerr
	}
	if now.Status == StatusOpen {
		return Session{}, err
	}
	return now, nil
}

// TransfersActive implements Payments. Every error answers false with the
// error: the caller must look at the error first.
func (s *Stripe) TransfersActive(ctx context.Context, account string) (bool, error) {
	if !accountPattern.MatchString(account) {
		return false, fmt.Errorf("billing: account: %w", ErrBadID)
	}
	var a *stripe.Account
	err := s.call(ctx, callGetAccount, func(ctx context.Context) (err error) {
		a, err = s.client.V1Accounts.GetByID(ctx, account, nil)
		return err
	})
	if err != nil {
		return false, err
	}
	return a.Capabilities != nil && a.Capabilities.Transfers == stripe.AccountCapabilityStatusActive, nil
}

// sessionFrom keeps what the market needs of Stripe's session.
func sessionFrom(cs *stripe.CheckoutSession) Session {
	s := Session{
		ID:                cs.ID,
		URL:               cs.URL,
		Status:            string(cs.Status),
		PaymentStatus:     string(cs.PaymentStatus),
		OrderID:           cs.Metadata["order_id"],
		ClientReferenceID: cs.ClientReferenceID,
		Currency:          string(cs.Currency),
		AmountTotal:       cs.AmountTotal,
	}
	if cs.ExpiresAt != 0 {
		s.ExpiresAt = time.Unix(cs.ExpiresAt, 0)
	}
	if pi := cs.PaymentIntent; pi != nil {
		// stripe-go decodes an unexpanded PaymentIntent (a bare id) into
		// one with only the ID set: the id is there either way.
		s.PaymentIntent = pi.ID
		s.Fee = pi.ApplicationFeeAmount
		if pi.TransferData != nil && pi.TransferData.Destination != nil {
			s.Destination = pi.TransferData.Destination.ID
		}
	}
	return s
}
