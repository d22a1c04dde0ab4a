package billing

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stripe/stripe-go/v82"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

const (
	sessionsPath = "/v1/checkout/sessions"
	sessionPath  = "/v1/checkout/sessions/cs_test_a1VmshelfOrder42"
	expirePath   = sessionPath + "/expire"
	accountPath  = "/v1/accounts/" + testHost
	sessionID    = "cs_test_a1VmshelfOrder42"
)

func TestCreateCheckoutSendsDestinationCharge(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", sessionsPath, http.StatusOK, sessionOpen)
	s, _ := clientOf(t, f)

	got, err := s.CreateCheckout(context.Background(), example())
	if err != nil {
		t.Fatalf("CreateCheckout: %v", err)
	}
	reqs := f.History()
	if len(reqs) != 1 {
		t.Fatalf("Stripe got %d requests, want exactly 1", len(reqs))
	}
	r := reqs[0]
	if r.Method != "POST" || r.Path != sessionsPath {
		t.Fatalf("request %s %s, want POST %s", r.Method, r.Path, sessionsPath)
	}
	c := example()
	want := url.Values{
		"mode":                                            {"payment"},
		"line_items[0][price_data][currency]":             {"eur"},
		"line_items[0][price_data][unit_amount]":          {"600"},
		"line_items[0][price_data][product_data][name]":   {c.Description},
		"line_items[0][quantity]":                         {"3"},
		"payment_intent_data[application_fee_amount]":     {"900"},
		"payment_intent_data[transfer_data][destination]": {testHost},
		"payment_intent_data[metadata][order_id]":         {"ord_42"},
		"adaptive_pricing[enabled]":                       {"false"},
		"client_reference_id":                             {"ord_42"},
		"metadata[order_id]":                              {"ord_42"},
		"success_url":                                     {c.SuccessURL},
		"cancel_url":                                      {c.CancelURL},
		"expires_at":                                      {strconv.FormatInt(testNow.Add(31*time.Minute).Unix(), 10)},
		"expand[0]":                                       {"payment_intent"},
	}
	for k, v := range want {
		if g := r.Form[k]; len(g) != 1 || g[0] != v[0] {
			t.Errorf("form %s = %q, want %q", k, g, v[0])
		}
	}
	for k, v := range r.Form {
		if _, ok := want[k]; !ok {
			t.Errorf("form has unexpected %s = %q", k, v)
		}
	}
	for h, v := range map[string]string{
		"Authorization":   "Bearer " + testKey,
		"Idempotency-Key": "vmshelf-checkout-ord_42",
		"Stripe-Version":  stripe.APIVersion,
		"Content-Type":    "application/x-www-form-urlencoded",
	} {
		if g := r.Header.Get(h); g != v {
			t.Errorf("header %s = %q, want %q", h, g, v)
		}
	}
	wantSession := Session{
		ID: sessionID, URL: "https://checkout.stripe.com/c/pay/cs_test_a1VmshelfOrder42#fidkdWxOYHwnPyd1blpxYHZxWjA0",
		Status: StatusOpen, PaymentStatus: PaymentUnpaid, OrderID: "ord_42", ClientReferenceID: "ord_42",
		Currency: "eur", AmountTotal: 1800, ExpiresAt: time.Unix(1772368260, 0),
	}
	if got != wantSession {
		t.Errorf("session\n got %+v\nwant %+v", got, wantSession)
	}
}

// A retry of an order's checkout is the same request under the same
// idempotency key, which is how Stripe answers it with the first session.
func TestCreateCheckoutRetryIsIdempotent(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", sessionsPath, http.StatusOK, sessionOpen)
	s, _ := clientOf(t, f)
	for range 2 {
		if _, err := s.CreateCheckout(context.Background(), example()); err != nil {
			t.Fatalf("CreateCheckout: %v", err)
		}
	}
	reqs := f.History()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	if a, b := reqs[0].Header.Get("Idempotency-Key"), reqs[1].Header.Get("Idempotency-Key"); a != b || a == "" {
		t.Errorf("idempotency keys %q and %q, want one key", a, b)
	}
	if a, b := reqs[0].Form.Encode(), reqs[1].Form.Encode(); a != b {
		t.Errorf("the retry's form differs:\n%s\n%s", a, b)
	}
}

// The gate runs inside CreateCheckout: whatever it refuses, Stripe never
// hears of.
func TestCreateCheckoutGateFirst(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", sessionsPath, http.StatusOK, sessionOpen)
	s, reg := clientOf(t, f)
	for _, tc := range gateRefusals {
		t.Run(tc.name, func(t *testing.T) {
			c := example()
			tc.edit(&c)
			_, err := s.CreateCheckout(context.Background(), c)
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrGate) {
				t.Fatalf("CreateCheckout = %v; want %v", err, tc.want)
			}
			var se *StripeError
			if errors.As(err, &se) {
				t.Errorf("a gate refusal is a StripeError: %v", err)
			}
		})
	}
	if n := len(f.History()); n != 0 {
		t.Fatalf("Stripe got %d requests for refused checkouts, want 0", n)
	}
	if n := observations(t, reg, callCreateCheckout, ""); n != 0 {
		t.Errorf("%d Stripe calls accounted for refused checkouts, want 0", n)
	}
}

func TestSession(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("GET", sessionPath, http.StatusOK, sessionPaid)
	s, _ := clientOf(t, f)

	got, err := s.Session(context.Background(), sessionID)
	if err != nil {
		t.Fatalf("Session: %v", err)
	}
	want := Session{
		ID: sessionID, Status: StatusComplete, PaymentStatus: PaymentPaid, OrderID: "ord_42",
		ClientReferenceID: "ord_42", Currency: "eur", AmountTotal: 1800, Fee: 900, Destination: testHost,
		PaymentIntent: "pi_3VmshelfPaid0001", ExpiresAt: time.Unix(1772368260, 0),
	}
	if got != want {
		t.Errorf("session\n got %+v\nwant %+v", got, want)
	}
	if err := got.PaidFor(example()); err != nil {
		t.Errorf("the paid session does not settle the example: %v", err)
	}
	reqs := f.History()
	if len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Query.Get("expand[0]") != "payment_intent" {
		t.Fatalf("requests %+v, want one GET with expand[0]=payment_intent", reqs)
	}
}

func TestExpireSession(t *testing.T) {
	for _, tc := range []struct {
		name         string
		expire, get  stripetest.Canned // get: the re-read after a refused expire
		wantStatus   string
		wantErr      error
		wantRequests []string
	}{
		{
			name:         "open session expires",
			expire:       stripetest.Canned{Status: 200, Body: sessionExpired},
			wantStatus:   StatusExpired,
			wantRequests: []string{"POST " + expirePath},
		},
		{
			name:         "the buyer paid first",
			expire:       stripetest.Canned{Status: 400, Body: errNotExpirable},
			get:          stripetest.Canned{Status: 200, Body: sessionPaid},
			wantStatus:   StatusComplete,
			wantRequests: []string{"POST " + expirePath, "GET " + sessionPath},
		},
		{
			name:         "expired before",
			expire:       stripetest.Canned{Status: 400, Body: errNotExpirable},
			get:          stripetest.Canned{Status: 200, Body: sessionExpired},
			wantStatus:   StatusExpired,
			wantRequests: []string{"POST " + expirePath, "GET " + sessionPath},
		},
		{
			name:         "refused but still open",
			expire:       stripetest.Canned{Status: 400, Body: errNotExpirable},
			get:          stripetest.Canned{Status: 200, Body: sessionOpen},
			wantErr:      ErrRefused,
			wantRequests: []string{"POST " + expirePath, "GET " + sessionPath},
		},
		{
			name:         "refused and the re-read fails",
			expire:       stripetest.Canned{Status: 400, Body: errNotExpirable},
			get:          stripetest.Canned{Status: 500, Body: errAPI},
			wantErr:      ErrUnavailable,
			wantRequests: []string{"POST " + expirePath, "GET " + sessionPath},
		},
		{
			name:         "no such session",
			expire:       stripetest.Canned{Status: 404, Body: errNoSuchSession},
			wantErr:      ErrNotFound,
			wantRequests: []string{"POST " + expirePath},
		},
		{
			name:         "Stripe down",
			expire:       stripetest.Canned{Status: 500, Body: errAPI},
			wantErr:      ErrUnavailable,
			wantRequests: []string{"POST " + expirePath},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.AnswerWith("POST", expirePath, tc.expire)
			if tc.get.Status != 0 {
				f.AnswerWith("GET", sessionPath, tc.get)
			}
			s, _ := clientOf(t, f)
			got, err := s.ExpireSession(context.Background(), sessionID)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ExpireSession = %+v, %v; want %v", got, err, tc.wantErr)
				}
				if got != (Session{}) {
					t.Errorf("an error came with a session: %+v", got)
				}
			} else if err != nil || got.Status != tc.wantStatus || got.ID != sessionID {
				t.Fatalf("ExpireSession = %+v, %v; want status %s", got, err, tc.wantStatus)
			}
			var reqs []string
			for _, r := range f.History() {
				reqs = append(reqs, r.Method+" "+r.Path)
				if r.Method == "POST" && r.Form.Get("expand[0]") != "payment_intent" {
					t.Errorf("expire without expand[0]=payment_intent: %v", r.Form)
				}
			}
			if strings.Join(reqs, ", ") != strings.Join(tc.wantRequests, ", ") {
				t.Errorf("requests %q, want %q", reqs, tc.wantRequests)
			}
		})
	}
}

func TestTransfersActive(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       bool
	}{
		{"active", accountActive, true},
		{"pending", accountPending, false},
		{"no capabilities", accountNoCapabilities, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.Answer("GET", accountPath, http.StatusOK, tc.body)
			s, _ := clientOf(t, f)
			got, err := s.TransfersActive(context.Background(), testHost)
			if err != nil || got != tc.want {
				t.Fatalf("TransfersActive = %v, %v; want %v, nil", got, err, tc.want)
			}
			if reqs := f.History(); len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != accountPath {
				t.Errorf("requests %+v, want GET %s", reqs, accountPath)
			}
		})
	}
}

// ops are the calls, each with the routes it uses and a run that
// reports its error (and, for TransfersActive, that an error is never a
// "yes").
var ops = []struct {
	name   string
	routes []string
	run    func(t *testing.T, s *Stripe, ctx context.Context) error
}{
	{"CreateCheckout", []string{"POST " + sessionsPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		got, err := s.CreateCheckout(ctx, example())
		if err != nil && got != (Session{}) {
			t.Errorf("an error came with a session: %+v", got)
		}
		return err
	}},
	{"Session", []string{"GET " + sessionPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		_, err := s.Session(ctx, sessionID)
		return err
	}},
	{"ExpireSession", []string{"POST " + expirePath, "GET " + sessionPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		_, err := s.ExpireSession(ctx, sessionID)
		return err
	}},
	{"TransfersActive", []string{"GET " + accountPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		ok, err := s.TransfersActive(ctx, testHost)
		if err != nil && ok {
			t.Errorf("TransfersActive = true with error %v", err)
		}
		return err
	}},
	{"Refund", []string{"POST " + refundsPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		got, err := s.Refund(ctx, exampleRefund())
		if err != nil && got != (Refund{}) {
			t.Errorf("an error came with a refund: %+v", got)
		}
		return err
	}},
	{"CreateExpressAccount", []string{"POST " + accountsPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		id, err := s.CreateExpressAccount(ctx, 7, tenantSince, "DE")
		if err != nil && id != "" {
			t.Errorf("an error came with an account %q", id)
		}
		return err
	}},
	{"AccountLink", []string{"POST " + linksPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		link, _, err := s.AccountLink(ctx, newHost, "https://edge.example/r", "https://edge.example/b")
		if err != nil && link != "" {
			t.Errorf("an error came with a link %q", link)
		}
		return err
	}},
	{"Account", []string{"GET " + accountPath}, func(t *testing.T, s *Stripe, ctx context.Context) error {
		a, err := s.Account(ctx, testHost)
		if err != nil && a != (AccountState{}) {
			t.Errorf("an error came with an account state %+v", a)
		}
		return err
	}},
}

var kinds = []error{ErrUnavailable, ErrNotFound, ErrRefused}

// checkKind asserts that err is a *StripeError of exactly kind want and
// that its text has no key.
func checkKind(t *testing.T, err, want error) *StripeError {
	t.Helper()
	var se *StripeError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is no *StripeError", err, err)
	}
	for _, k := range kinds {
		if errors.Is(err, k) != (k == want) {
			t.Errorf("errors.Is(%v, %v) = %v", err, k, errors.Is(err, k))
		}
	}
	if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "sk_test_") {
		t.Errorf("the error text carries the key: %v", err)
	}
	return se
}

func TestStripeAnswersSorted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   stripetest.Canned
		want     error
		wantCode string
	}{
		{"404 resource_missing is absence", stripetest.Canned{Status: 404, Body: errNoSuchSession}, ErrNotFound, "resource_missing"},
		{"404 of an unknown route is no absence", stripetest.Canned{Status: 404, Body: `{"error":{"message":"Unrecognized request URL (GET: /v1/nope).","type":"invalid_request_error"}}`}, ErrRefused, ""},
		{"404 page of a proxy is no answer", stripetest.Canned{Status: 404, Body: "<html><body>404 Not Found</body></html>"}, ErrUnavailable, ""},
		{"400 invalid destination", stripetest.Canned{Status: 400, Body: errNoSuchDestination}, ErrRefused, "resource_missing"},
		{"401 bad key, quoted", stripetest.Canned{Status: 401, Body: errBadKey}, ErrRefused, ""},
		{"403 no access to the account", stripetest.Canned{Status: 403, Body: errNoAcct}, ErrRefused, "account_invalid"},
		{"400 that says retry", stripetest.Canned{Status: 400, Body: errLock, Header: map[string]string{"Stripe-Should-Retry": "true"}}, ErrUnavailable, "lock_timeout"},
		{"409 lock timeout", stripetest.Canned{Status: 409, Body: errLock}, ErrUnavailable, "lock_timeout"},
		{"429 rate limit", stripetest.Canned{Status: 429, Body: errRate}, ErrUnavailable, "rate_limit"},
		{"500 api_error", stripetest.Canned{Status: 500, Body: errAPI}, ErrUnavailable, ""},
		{"503 page of a proxy", stripetest.Canned{Status: 503, Body: "<html>Service Unavailable</html>"}, ErrUnavailable, ""},
		{"200 that is not JSON", stripetest.Canned{Status: 200, Body: "<html>captive portal</html>"}, ErrUnavailable, ""},
	} {
		for _, op := range ops {
			t.Run(tc.name+"/"+op.name, func(t *testing.T) {
				f := newFake(t, nil)
				for _, r := range op.routes {
					m, p, _ := strings.Cut(r, " ")
					f.AnswerWith(m, p, tc.answer)
				}
				s, _ := clientOf(t, f)
				err := op.run(t, s, context.Background())
				se := checkKind(t, err, tc.want)
				if se.Code != tc.wantCode {
					t.Errorf("code %q, want %q", se.Code, tc.wantCode)
				}
				if strings.HasPrefix(tc.answer.Body, "{") && (se.Status != tc.answer.Status || se.RequestID != "req_fake1") {
					t.Errorf("status %d request %q, want %d req_fake1", se.Status, se.RequestID, tc.answer.Status)
				}
			})
		}
	}
}

func TestStripeNotAsked(t *testing.T) {
	// A closed listener: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	for _, tc := range []struct {
		name  string
		base  string // "" is the fake, which then never answers
		ctx   context.Context
		cause error
	}{
		{"connection refused", closed, context.Background(), nil},
		{"no answer before the timeout", "", context.Background(), context.DeadlineExceeded},
		{"the caller gave up", "", cancelled, context.Canceled},
	} {
		for _, op := range ops {
			t.Run(tc.name+"/"+op.name, func(t *testing.T) {
				f := newFake(t, nil)
				block := make(chan struct{})
				t.Cleanup(func() { close(block) })
				for _, r := range op.routes {
					m, p, _ := strings.Cut(r, " ")
					f.AnswerWith(m, p, stripetest.Canned{Hold: block})
				}
				s, _ := clientOf(t, f, func(c *StripeConfig) {
					c.Timeout = 200 * time.Millisecond
					if tc.base != "" {
						c.APIBase, c.HTTPClient = tc.base, nil
					}
				})
				err := op.run(t, s, tc.ctx)
				se := checkKind(t, err, ErrUnavailable)
				if se.Status != 0 {
					t.Errorf("status %d without an answer", se.Status)
				}
				if tc.cause != nil && !errors.Is(err, tc.cause) {
					t.Errorf("error %v is not %v", err, tc.cause)
				}
			})
		}
	}
}

func TestBadIDsNotAsked(t *testing.T) {
	f := newFake(t, nil)
	s, _ := clientOf(t, f)
	ctx := context.Background()
	for _, id := range []string{"", "cs_", "../accounts/acct_1", "cs_test_1/expire", "pi_123"} {
		if _, err := s.Session(ctx, id); !errors.Is(err, ErrBadID) {
			t.Errorf("Session(%q) = %v, want ErrBadID", id, err)
		}
		if _, err := s.ExpireSession(ctx, id); !errors.Is(err, ErrBadID) {
			t.Errorf("ExpireSession(%q) = %v, want ErrBadID", id, err)
		}
	}
	for _, acct := range []string{"", "acct_", "acct_1/../../v1/balance", "cus_1"} {
		if ok, err := s.TransfersActive(ctx, acct); ok || !errors.Is(err, ErrBadID) {
			t.Errorf("TransfersActive(%q) = %v, %v; want false, ErrBadID", acct, ok, err)
		}
	}
	if n := len(f.History()); n != 0 {
		t.Errorf("Stripe got %d requests for malformed ids", n)
	}
}

func TestNewStripeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  StripeConfig
	}{
		{"no key", StripeConfig{}},
		{"key with a newline", StripeConfig{SecretKey: testKey + "\n"}},
		{"publishable key", StripeConfig{SecretKey: "pk_test_51VmshelfPublishable"}},
		{"webhook secret", StripeConfig{SecretKey: "whsec_VmshelfWebhook"}},
		{"base with /v1", StripeConfig{SecretKey: testKey, APIBase: "https://api.stripe.com/v1"}},
		{"base with credentials", StripeConfig{SecretKey: testKey, APIBase: "https://user:" + testKey + "@api.stripe.com"}},
		{"base not absolute", StripeConfig{SecretKey: testKey, APIBase: "api.stripe.com"}},
		{"base of another scheme", StripeConfig{SecretKey: testKey, APIBase: "ftp://api.stripe.com"}},
		{"negative timeout", StripeConfig{SecretKey: testKey, Timeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewStripe(tc.cfg)
			if err == nil {
				t.Fatalf("NewStripe = %v, want an error", s)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "Vmshelf") {
				t.Errorf("the error quotes the secret: %v", err)
			}
		})
	}
	// One client per registry: a second registration is an error, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := NewStripe(StripeConfig{SecretKey: testKey, Metrics: reg}); err != nil {
		t.Fatalf("first NewStripe: %v", err)
	}
	if _, err := NewStripe(StripeConfig{SecretKey: testKey, Metrics: reg}); err == nil {
		t.Errorf("a second client on one registry was accepted")
	}
}

func TestMetrics(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", sessionsPath, http.StatusOK, sessionOpen)
	f.Answer("GET", sessionPath, http.StatusNotFound, errNoSuchSession)
	f.Answer("GET", accountPath, http.StatusInternalServerError, errAPI)
	// The refund is refused as by a Stripe that has no such route (the
	// stand-in would answer it from its state).
	f.Answer("POST", refundsPath, http.StatusNotFound, errUnknownRoute)
	s, reg := clientOf(t, f)
	ctx := context.Background()
	_, _ = s.CreateCheckout(ctx, example())
	_, _ = s.Session(ctx, sessionID)
	_, _ = s.TransfersActive(ctx, testHost)
	_, _ = s.TransfersActive(ctx, testHost)
	_, _ = s.Refund(ctx, exampleRefund()) // Stripe's 404 of an unknown URL
	_, _ = s.Refund(ctx, RefundRequest{}) // malformed: no call, no observation
	bad := example()
	bad.Fee = 899
	_, _ = s.CreateCheckout(ctx, bad) // the gate: no call, no observation

	for _, tc := range []struct {
		call, outcome string
		want          uint64
	}{
		{callCreateCheckout, "ok", 1},
		{callCreateCheckout, "refused", 0},
		{callGetSession, "not_found", 1},
		{callGetAccount, "unavailable", 2},
		{callGetAccount, "ok", 0},
		{callExpireSession, "ok", 0},
		{callCreateRefund, "refused", 1},
		{callCreateRefund, "", 1},
	} {
		if got := observations(t, reg, tc.call, tc.outcome); got != tc.want {
			t.Errorf("%s/%s: %d observations, want %d", tc.call, tc.outcome, got, tc.want)
		}
	}
	if n := series(t, reg); n != len(allCalls)*len(allOutcomes) {
		t.Errorf("%d series, want every call × outcome (%d)", n, len(allCalls)*len(allOutcomes))
	}
}

// observations counts the histogram's observations of call with outcome
// ("" is every outcome).
func observations(t *testing.T, reg *prometheus.Registry, call, outcome string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range histogram(t, reg) {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["call"] == call && (outcome == "" || labels["outcome"] == outcome) {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

func series(t *testing.T, reg *prometheus.Registry) int { return len(histogram(t, reg)) }

func histogram(t *testing.T, reg *prometheus.Registry) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "vmshelf_stripe_request_duration_seconds" {
			return mf.GetMetric()
		}
	}
	t.Fatalf("no vmshelf_stripe_request_duration_seconds among %d families", len(mfs))
	return nil
}
