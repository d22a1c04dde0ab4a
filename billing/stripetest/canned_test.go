package stripetest

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestCannedAnswerFirst: a route with a canned answer answers it whatever
// the key or Down say, and leaves Down for the next request; History has
// every request as it came, the form of a chunked body included.
func TestCannedAnswerFirst(t *testing.T) {
	s, err := New("sk_test_canned", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Down(1)
	s.Answer(http.MethodPost, "/v1/refunds", http.StatusPaymentRequired, `{"canned":true}`)

	form := url.Values{"payment_intent": {"pi_1"}}
	// A reader of no known length: the client sends it chunked, as
	// stripe-go sends its forms.
	body := struct{ io.Reader }{strings.NewReader(form.Encode())}
	req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/refunds?expand[0]=charge", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer not-the-key")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "k1")
	status, got, requestID := do(t, req)
	if status != http.StatusPaymentRequired || got != `{"canned":true}` || requestID != CannedRequestID {
		t.Fatalf("the canned route answered %d %s (Request-Id %q)", status, got, requestID)
	}

	req, err = http.NewRequest(http.MethodGet, s.URL+"/v1/accounts/acct_1None", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Key)
	if status, got, _ := do(t, req); status != http.StatusServiceUnavailable {
		t.Fatalf("after the canned answer, the next request answered %d %s, want Down's 503", status, got)
	}

	h := s.History()
	if len(h) != 2 || s.Requests() != 2 || len(s.Received("/v1/refunds")) != 1 {
		t.Fatalf("history %+v, %d requests, %d refund posts; want 2, 2, 1", h, s.Requests(), len(s.Received("/v1/refunds")))
	}
	post, get := h[0], h[1]
	if post.Method != http.MethodPost || post.Path != "/v1/refunds" || post.Query.Get("expand[0]") != "charge" ||
		post.Form.Get("payment_intent") != "pi_1" || post.Header.Get("Authorization") != "Bearer not-the-key" ||
		!post.Chunked || post.Idempotency != "k1" {
		t.Errorf("the canned route's request recorded as %+v", post)
	}
	if get.Method != http.MethodGet || get.Path != "/v1/accounts/acct_1None" || get.Chunked {
		t.Errorf("the refused request recorded as %+v", get)
	}
}

// do sends req and returns the answer's status, body and Request-Id.
func do(t *testing.T, req *http.Request) (status int, body, requestID string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	return resp.StatusCode, b.String(), resp.Header.Get("Request-Id")
}
