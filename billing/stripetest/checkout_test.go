package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stripe/stripe-go/v82/webhook"
)

// TestCheckoutPage: with the checkout page on, an open session's url is
// the stand-in's page on loopback; it says no money moves, and its button
// pays the session, posts checkout.session.completed signed with the
// webhook's secret (Stripe's library verifies it), and sends the browser
// back to the session's success_url. Without the page, the url is no
// address a browser opens and the page is not served.
func TestCheckoutPage(t *testing.T) {
	const secret = "whsec_checkout_test"
	var mu sync.Mutex
	var events []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ev, err := webhook.ConstructEventWithOptions(b, r.Header.Get("Stripe-Signature"), secret,
			webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		events = append(events, string(ev.Type)+" "+ev.Data.Object["id"].(string))
		mu.Unlock()
		_, _ = w.Write([]byte(`{"state":"paid"}`))
	}))
	defer hook.Close()
	s, err := New("sk_test_page", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.WebhooksTo(hook.URL, secret)

	open := func() map[string]any {
		form := url.Values{"success_url": {"http://127.0.0.1:1/machines?checkout=success"},
			"cancel_url": {"http://127.0.0.1:1/machines?checkout=cancelled"}, "metadata[order_id]": {"o1"},
			"line_items[0][price_data][currency]": {"eur"}, "line_items[0][price_data][unit_amount]": {"600"},
			"line_items[0][quantity]": {"1"}}
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/checkout/sessions", strings.NewReader(form.Encode()))
		req.Header.Set("Authorization", "Bearer "+s.Key)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return doJSON(t, req)
	}
	off := open()
	if u := off["url"].(string); strings.HasPrefix(u, s.URL) {
		t.Fatalf("without the page, the session's url %q is the stand-in's", u)
	}
	if resp, err := http.Get(s.URL + checkoutPath + off["id"].(string)); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("without the page, GET of its address: %v %v, want 404", resp, err)
	}

	s.ServeCheckoutPage()
	cs := open()
	page := cs["url"].(string)
	if page != s.URL+checkoutPath+cs["id"].(string) {
		t.Fatalf("the session's url %q, want the stand-in's page", page)
	}
	resp, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Demo: no money moves") || !strings.Contains(string(body), "6.00 EUR") {
		t.Fatalf("the page: %d %s", resp.StatusCode, body)
	}
	// The browser follows the button's redirect to the Machines page only
	// where the page's form-action allows it (Chromium blocks it otherwise).
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "form-action 'self' http://127.0.0.1:1") {
		t.Errorf("the page's CSP %q does not let its form return to the Machines page", csp)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.Post(page, "application/x-www-form-urlencoded", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "http://127.0.0.1:1/machines?checkout=success" {
		t.Fatalf("the button: %d to %q, want 303 to the success_url", resp.StatusCode, resp.Header.Get("Location"))
	}
	got, _ := s.Session(cs["id"].(string))
	mu.Lock()
	defer mu.Unlock()
	if got.Status != "complete" || got.PaymentStatus != "paid" || len(events) != 1 || events[0] != "checkout.session.completed "+got.ID {
		t.Fatalf("after the button: session %s/%s, webhook events %q", got.Status, got.PaymentStatus, events)
	}
	// A paid session's page is gone: the button cannot pay twice.
	if resp, err := noRedirect.Post(page, "application/x-www-form-urlencoded", nil); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the button again: %v %v, want 404", resp, err)
	}
}

func doJSON(t *testing.T, req *http.Request) map[string]any {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %v", req.Method, req.URL, resp.StatusCode, err)
	}
	return v
}
