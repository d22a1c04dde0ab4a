// Package stripetest is a stand-in for Stripe's API on loopback, with
// state: it opens Checkout Sessions from the forms billing.Stripe sends,
// lets a test pay or expire them, refunds their PaymentIntents (refusing,
// as Stripe does, a charge its buyer's bank disputes), opens and closes
// disputes, creates and onboards Connect Express accounts, and signs
// webhook events the way Stripe does. It exists for the tests of the
// market and of the whole binary, which need a Stripe that remembers;
// stripe-mock (Stripe's own mock) checks request shapes but keeps no
// state. It records every API request as it came (History), and a test
// may fix a route's answer (Answer, AnswerWith), which then takes the
// place of the stand-in's: billing's own tests check its client against
// those canned answers, Stripe's documented shapes, one route at a time.
//
// It implements only what vmshelf calls: POST /v1/checkout/sessions, GET
// /v1/checkout/sessions/{id}, POST /v1/checkout/sessions/{id}/expire,
// POST /v1/refunds (full refunds only), GET /v1/refunds/{id}, POST
// /v1/accounts (Express), GET /v1/accounts/{id} and POST
// /v1/account_links; and, for the browser, the onboarding page its
// account links point to, /connect/onboard/{account}, and (once
// ServeCheckoutPage is called, for make demo) a checkout page,
// /demo/checkout/{session}, whose button pays and posts the webhook.
package stripetest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"
)

// Session is a Checkout Session the fake opened, as the create request's
// form described it, and what has happened to it since.
type Session struct {
	ID          string
	Form        url.Values // the create request's form, as received
	Idempotency string     // its Idempotency-Key header
	OrderID     string     // metadata[order_id]
	Currency    string
	UnitAmount  int64
	Quantity    int64
	Fee         int64  // payment_intent_data[application_fee_amount]
	Destination string // payment_intent_data[transfer_data][destination]
	ExpiresAt   int64
	// Status is "open", "complete" or "expired"; PaymentStatus "unpaid"
	// or "paid".
	Status, PaymentStatus string
	// PaidAmount, PaidFee and PaidDestination are what the PaymentIntent
	// says once paid: by default the session's own; a test may make them
	// differ (PayWith) to play a tampered or mistaken payment.
	PaidAmount      int64
	PaidFee         int64
	PaidDestination string
	// PaymentIntent is the pi_… of a completed session, which Refund
	// takes; empty before.
	PaymentIntent string
}

// Server is the fake. Its methods are safe for concurrent use.
type Server struct {
	srv *http.Server
	URL string // the API base for billing.StripeConfig.APIBase
	Key string // the secret key it expects as Bearer

	mu       sync.Mutex
	sessions map[string]*Session
	byKey    map[string]string // idempotency key → session id
	order    []string          // session ids in creation order
	down     int               // answer the next this many requests 503
	received []Request         // every API request, oldest first (History)
	canned   map[string]Canned // by "METHOD /path" (AnswerWith)

	accounts     map[string]*Account
	accountOrder []string          // created accounts, oldest first
	accountByKey map[string]string // idempotency key → account id

	refunds     map[string]*Refund
	refundOrder []string
	refundByKey map[string]string // idempotency key → refund id
	// The next refundFail refund requests answer refundFailStatus before
	// doing anything; the next refundLose do the refund and then answer
	// refundLoseStatus, as when Stripe acted and the answer was lost.
	refundFail, refundFailStatus int
	refundLose, refundLoseStatus int
	// refundHold, if set, holds the next refund's answer (HoldRefunds);
	// refundHoldBefore holds the next refund request before it is looked
	// at (HoldRefundRequests).
	refundHold, refundHoldBefore chan struct{}
	// refundStatus and refundFailure are what a new refund comes back as;
	// "" is "succeeded".
	refundStatus, refundFailure string

	disputes map[string]*Dispute // by PaymentIntent

	// Where Complete posts its events (WebhooksTo), and whether open
	// sessions point at the checkout page (ServeCheckoutPage).
	webhookURL, webhookSecret string
	checkoutPage              bool
}

// New starts a fake Stripe on 127.0.0.1 that accepts key. accounts maps
// Connect account ids to their transfers capability ("active",
// "inactive", "pending"); an unknown id answers 404 resource_missing.
// Close stops it.
func New(key string, accounts map[string]string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("stripetest: listen: %w", err)
	}
	s := &Server{URL: "http://" + ln.Addr().String(), Key: key,
		sessions: map[string]*Session{}, byKey: map[string]string{}, canned: map[string]Canned{},
		accounts: map[string]*Account{}, accountByKey: map[string]string{},
		refunds: map[string]*Refund{}, refundByKey: map[string]string{}, disputes: map[string]*Dispute{}}
	for id, state := range accounts {
		// An account given here is onboarded: charges on (as Stripe has
		// them once the details are in), payouts with its capability.
		s.accounts[id] = &Account{ID: id, Transfers: state, ChargesEnabled: true,
			PayoutsEnabled: state == "active", DetailsSubmitted: true}
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }

// Sessions returns copies of the sessions opened so far, oldest first.
func (s *Server) Sessions() []Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Session, 0, len(s.order))
	for _, id := range s.order {
		out = append(out, *s.sessions[id])
	}
	return out
}

// Session returns a copy of one session and whether it exists.
func (s *Server) Session(id string) (Session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.sessions[id]
	if !ok {
		return Session{}, false
	}
	return *cs, true
}

// Down makes the next n API requests answer 503, as Stripe does in an
// outage; a route with a canned answer (AnswerWith) answers that instead
// and leaves n as it is. The onboarding page is not the API and always
// answers.
func (s *Server) Down(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = n
}

// Pay completes session id as paid, with a PaymentIntent that is exactly
// the charge the session asked for.
func (s *Server) Pay(id string) error { return s.PayWith(id, nil) }

// PayWith completes session id as paid after edit changed what the
// payment says (amount, fee, destination), or leaves it unpaid when edit
// sets PaymentStatus "unpaid" (an async payment still pending).
func (s *Server) PayWith(id string, edit func(*Session)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.sessions[id]
	if !ok {
		return fmt.Errorf("stripetest: no session %s", id)
	}
	if cs.Status != "open" {
		return fmt.Errorf("stripetest: session %s is %s, not open", id, cs.Status)
	}
	cs.Status, cs.PaymentStatus = "complete", "paid"
	cs.PaymentIntent = paymentIntentOf(cs)
	cs.PaidAmount, cs.PaidFee, cs.PaidDestination = cs.UnitAmount*cs.Quantity, cs.Fee, cs.Destination
	if edit != nil {
		edit(cs)
	}
	return nil
}

// Expire lets session id run out, as Stripe does at its expires_at.
func (s *Server) Expire(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.sessions[id]
	if !ok || cs.Status != "open" {
		return fmt.Errorf("stripetest: no open session %s", id)
	}
	cs.Status = "expired"
	return nil
}

// Event returns a webhook event of type typ about session id, and its
// Stripe-Signature header signed with secret at signedAt: what Stripe
// would post to the webhook.
func (s *Server) Event(eventID, typ, sessionID, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	s.mu.Lock()
	cs, ok := s.sessions[sessionID]
	var obj map[string]any
	if ok {
		obj = s.sessionJSON(cs, false)
	} else {
		obj = map[string]any{"id": sessionID, "object": "checkout.session", "metadata": map[string]string{}}
	}
	s.mu.Unlock()
	return signedEvent(eventID, typ, obj, secret, signedAt)
}

// signedEvent renders a Stripe event of type typ about obj and signs it as
// Event does.
func signedEvent(eventID, typ string, obj map[string]any, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	payload, err = json.Marshal(map[string]any{
		"id": eventID, "object": "event", "type": typ, "api_version": "2025-08-27.basil",
		"created": signedAt.Unix(), "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": obj},
	})
	if err != nil {
		return nil, "", err
	}
	payload, signature = Signed(payload, secret, signedAt)
	return payload, signature, nil
}

// Signed signs any payload with secret at signedAt, as Stripe signs its
// webhook posts, and returns it with its Stripe-Signature header.
func Signed(payload []byte, secret string, signedAt time.Time) ([]byte, string) {
	sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret, Timestamp: signedAt})
	return sp.Payload, sp.Header
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, onboardPath) {
		s.onboard(w, r) // the browser's page, not the API
		return
	}
	if strings.HasPrefix(r.URL.Path, checkoutPath) {
		s.checkout(w, r) // the browser's too
		return
	}
	// The form is parsed first so that every request is recorded as it
	// came, also the ones a canned answer or Down answers.
	formErr := r.ParseForm()
	s.mu.Lock()
	s.record(r)
	canned, isCanned := s.cannedFor(r)
	down := !isCanned && formErr == nil && s.down > 0
	if down {
		s.down--
	}
	s.mu.Unlock()
	switch {
	case formErr != nil:
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "", formErr.Error())
		return
	case isCanned:
		serveCanned(w, r, canned)
		return
	case down:
		stripeError(w, http.StatusServiceUnavailable, "api_error", "", "Stripe is down (stripetest)")
		return
	case r.Header.Get("Authorization") != "Bearer "+s.Key:
		stripeError(w, http.StatusUnauthorized, "invalid_request_error", "", "Invalid API Key provided")
		return
	}
	path := r.URL.Path
	switch {
	case r.Method == http.MethodPost && path == "/v1/checkout/sessions":
		s.create(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/checkout/sessions/"):
		s.get(w, strings.TrimPrefix(path, "/v1/checkout/sessions/"), expands(r.Form))
	case r.Method == http.MethodPost && strings.HasPrefix(path, "/v1/checkout/sessions/") && strings.HasSuffix(path, "/expire"):
		s.expire(w, r, strings.TrimSuffix(strings.TrimPrefix(path, "/v1/checkout/sessions/"), "/expire"), expands(r.Form))
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/accounts/"):
		s.account(w, strings.TrimPrefix(path, "/v1/accounts/"))
	case r.Method == http.MethodPost && path == "/v1/accounts":
		s.createAccount(w, r)
	case r.Method == http.MethodPost && path == "/v1/account_links":
		s.createAccountLink(w, r)
	case r.Method == http.MethodPost && path == "/v1/refunds":
		s.createRefund(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/refunds/"):
		s.getRefund(w, strings.TrimPrefix(path, "/v1/refunds/"))
	default:
		stripeError(w, http.StatusNotFound, "invalid_request_error", "", "Unrecognized request URL ("+r.Method+": "+path+")")
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	num := func(k string) int64 { n, _ := strconv.ParseInt(f.Get(k), 10, 64); return n }
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.byKey[key]; ok && key != "" {
		writeJSON(w, s.sessionJSON(s.sessions[id], false)) // a retry: the same session
		return
	}
	id := fmt.Sprintf("cs_test_stripetest%04d", len(s.order)+1)
	cs := &Session{ID: id, Form: f, Idempotency: key, OrderID: f.Get("metadata[order_id]"),
		Currency: f.Get("line_items[0][price_data][currency]"), UnitAmount: num("line_items[0][price_data][unit_amount]"),
		Quantity: num("line_items[0][quantity]"), Fee: num("payment_intent_data[application_fee_amount]"),
		Destination: f.Get("payment_intent_data[transfer_data][destination]"), ExpiresAt: num("expires_at"),
		Status: "open", PaymentStatus: "unpaid"}
	s.sessions[id] = cs
	s.order = append(s.order, id)
	if key != "" {
		s.byKey[key] = id
	}
	writeJSON(w, s.sessionJSON(cs, false))
}

func (s *Server) get(w http.ResponseWriter, id string, expand []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.sessions[id]
	if !ok {
		stripeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such checkout.session: '"+id+"'")
		return
	}
	writeJSON(w, s.sessionJSON(cs, contains(expand, "payment_intent")))
}

func (s *Server) expire(w http.ResponseWriter, r *http.Request, id string, expand []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.sessions[id]
	switch {
	case !ok:
		stripeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such checkout.session: '"+id+"'")
		return
	case cs.Status != "open":
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "",
			`Only Checkout Sessions with a status in ["open"] can be expired.`)
		return
	}
	cs.Status = "expired"
	writeJSON(w, s.sessionJSON(cs, contains(expand, "payment_intent")))
}

// sessionJSON renders cs as Stripe's Checkout Session object, with its
// PaymentIntent expanded or as an id (null until paid).
func (s *Server) sessionJSON(cs *Session, expandPI bool) map[string]any {
	obj := map[string]any{
		"id": cs.ID, "object": "checkout.session", "mode": "payment", "livemode": false,
		"amount_total": cs.UnitAmount * cs.Quantity, "amount_subtotal": cs.UnitAmount * cs.Quantity,
		"currency": cs.Currency, "client_reference_id": cs.Form.Get("client_reference_id"),
		"metadata": map[string]string{"order_id": cs.OrderID}, "expires_at": cs.ExpiresAt,
		"status": cs.Status, "payment_status": cs.PaymentStatus,
		"success_url": cs.Form.Get("success_url"), "cancel_url": cs.Form.Get("cancel_url"),
		"payment_intent": nil, "url": nil,
	}
	if cs.Status == "open" {
		obj["url"] = "https://checkout.stripe.test/c/pay/" + cs.ID
		if s.checkoutPage {
			obj["url"] = s.URL + checkoutPath + cs.ID
		}
	}
	// Stripe makes the PaymentIntent when the buyer pays: a completed
	// session has one, also while an async payment is still processing.
	if cs.Status == "complete" {
		pi := paymentIntentOf(cs)
		status := "succeeded"
		if cs.PaymentStatus != "paid" {
			status = "processing"
		}
		if expandPI {
			obj["amount_total"] = cs.PaidAmount
			obj["payment_intent"] = map[string]any{
				"id": pi, "object": "payment_intent", "amount": cs.PaidAmount, "currency": cs.Currency,
				"status": status, "application_fee_amount": cs.PaidFee,
				"metadata":      map[string]string{"order_id": cs.OrderID},
				"transfer_data": map[string]any{"destination": cs.PaidDestination},
			}
		} else {
			obj["payment_intent"] = pi
		}
	}
	return obj
}

// paymentIntentOf and chargeOf are the ids of a completed session's
// PaymentIntent and its charge.
func paymentIntentOf(cs *Session) string {
	return "pi_stripetest_" + strings.TrimPrefix(cs.ID, "cs_test_")
}
func chargeOf(cs *Session) string { return "ch_stripetest_" + strings.TrimPrefix(cs.ID, "cs_test_") }

// expands lists the expand[] / expand[0] parameters of a request.
func expands(f url.Values) []string {
	var out []string
	for k, vs := range f {
		if k == "expand" || strings.HasPrefix(k, "expand[") {
			out = append(out, vs...)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_stripetest")
	_ = json.NewEncoder(w).Encode(v)
}

func stripeError(w http.ResponseWriter, status int, typ, code, msg string) {
	stripeParamError(w, status, typ, code, "", msg)
}

// stripeParamError is stripeError naming the parameter Stripe refused.
func stripeParamError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	e := map[string]string{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	if param != "" {
		e["param"] = param
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
}
