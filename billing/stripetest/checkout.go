package stripetest

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// checkoutPath is where an open session's url points once the checkout
// page is on (ServeCheckoutPage): the stand-in's Stripe Checkout.
const checkoutPath = "/demo/checkout/"

// webhookTimeout bounds one post of Complete to the webhook.
const webhookTimeout = 30 * time.Second

// WebhooksTo makes Complete post its events to hook (the edge's POST
// /market/stripe/webhook), signed with secret as Stripe signs them.
func (s *Server) WebhooksTo(hook, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.webhookURL, s.webhookSecret = hook, secret
}

// ServeCheckoutPage makes every open session's url the stand-in's
// checkout page on loopback, in place of an address no browser can open:
// a page that says no money moves, whose button completes the checkout
// (Complete) and returns the buyer to the session's success_url. It is
// the payment step of `make demo`, for a person at a browser.
func (s *Server) ServeCheckoutPage() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkoutPage = true
}

// Complete is what Stripe does when the buyer pays session id: the
// session is paid, and checkout.session.completed about it, signed, is
// posted to the webhook WebhooksTo named. It returns the webhook's
// answer, and an error unless it was 200.
func (s *Server) Complete(ctx context.Context, id string) ([]byte, error) {
	s.mu.Lock()
	hook, secret := s.webhookURL, s.webhookSecret
	s.mu.Unlock()
	if hook == "" {
		return nil, fmt.Errorf("stripetest: no webhook to post to (WebhooksTo)")
	}
	if err := s.Pay(id); err != nil {
		return nil, err
	}
	payload, sig, err := s.Event("evt_"+strings.TrimPrefix(id, "cs_test_"), "checkout.session.completed", id, secret, time.Now())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hook, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stripetest: the webhook of session %s: %w", id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("stripetest: the webhook's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("stripetest: the webhook of session %s answered %s: %s", id, resp.Status, body)
	}
	return body, nil
}

// checkoutPageHTML is the demo payment page: a banner that no money
// moves, what the order costs, and the one button.
var checkoutPageHTML = template.Must(template.New("checkout").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Demo checkout (no money moves)</title>
<style>body{font-family:sans-serif;max-width:40em;margin:2em auto}#demo-banner{background:#fff3c4;border:2px solid #b58900;padding:1em;font-weight:bold}</style>
</head>
<body>
<p id="demo-banner" role="alert">Demo: no money moves</p>
<h1>Checkout of order {{.OrderID}}</h1>
<p id="amount">{{.Amount}} for {{.Quantity}} replica-month(s). This page is a stand-in for Stripe Checkout, on this machine.</p>
<form method="post" action="{{.Action}}">
<button type="submit" id="pay">Complete the demo payment</button>
</form>
<p><a id="back" href="{{.Cancel}}">Back without paying</a></p>
</body></html>
`))

// checkout serves the demo payment page of session id (GET) and its
// button (POST). It is the browser's: it needs no key, and Down does not
// stop it.
func (s *Server) checkout(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, checkoutPath)
	cs, ok := s.Session(id)
	s.mu.Lock()
	on := s.checkoutPage
	s.mu.Unlock()
	success, cancel := "", ""
	if ok {
		success, cancel = cs.Form.Get("success_url"), cs.Form.Get("cancel_url")
	}
	if !on || !ok || cs.Status != "open" || !httpURL(success) || !httpURL(cancel) {
		http.Error(w, "stripetest: no open checkout "+id, http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodGet:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The button's POST answers with a redirect to the Machines page,
		// which form-action must allow too.
		back, _ := url.Parse(success)
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' "+back.Scheme+"://"+back.Host)
		amount := cs.UnitAmount * cs.Quantity
		_ = checkoutPageHTML.Execute(w, map[string]any{"OrderID": cs.OrderID, "Quantity": cs.Quantity,
			"Amount": fmt.Sprintf("%d.%02d %s", amount/100, amount%100, strings.ToUpper(cs.Currency)),
			"Action": checkoutPath + id, "Cancel": cancel})
	case http.MethodPost:
		if _, err := s.Complete(r.Context(), id); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		http.Redirect(w, r, success, http.StatusSeeOther)
	default:
		http.Error(w, "stripetest: GET or POST", http.StatusMethodNotAllowed)
	}
}
