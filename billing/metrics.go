package billing

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The calls and outcomes of vmshelf_stripe_request_duration_seconds.
const (
	callCreateCheckout    = "create_checkout"
	callGetSession        = "get_session"
	callExpireSession     = "expire_session"
	callGetAccount        = "get_account" // TransfersActive and Account
	callCreateRefund      = "create_refund"
	callCreateAccount     = "create_account"
	callCreateAccountLink = "create_account_link"
)

var (
	allCalls = []string{callCreateCheckout, callGetSession, callExpireSession, callGetAccount,
		callCreateRefund, callCreateAccount, callCreateAccountLink}
	allOutcomes = []string{"ok", "refused", "not_found", "unavailable"}
)

// metrics is what an operator sees of the talk with Stripe: how long each
// call took and how it ended. Gate refusals ask nothing and are not here.
type metrics struct {
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "vmshelf_stripe_request_duration_seconds",
		Help: "Duration of calls to Stripe's API by call and outcome (ok, refused, not_found, unavailable).",
		// Stripe answers in a few hundred milliseconds; the top buckets
		// show the calls that ran into the timeout.
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"call", "outcome"})}
	// Every series exists from the start, so that a rate of failures is
	// zero rather than absent before the first one.
	for _, c := range allCalls {
		for _, o := range allOutcomes {
			m.duration.WithLabelValues(c, o)
		}
	}
	if reg != nil {
		if err := reg.Register(m.duration); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("billing: metrics already registered (one Stripe client per registry): %w", err)
			}
			return nil, fmt.Errorf("billing: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(call string, start time.Time, err error) {
	m.duration.WithLabelValues(call, outcome(err)).Observe(time.Since(start).Seconds())
}
