package market

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestWebhookConcurrentDeliveries: Stripe may deliver one event several
// times at once (retries overlapping a slow answer). The order is paid
// once, and so is everything that reports it: exactly one delivery
// counts result "paid" and logs "order paid", tells the provisioner once;
// the others count as a duplicate or as already paid, and every
// delivery is answered 200.
func TestWebhookConcurrentDeliveries(t *testing.T) {
	const deliveries = 10
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	payload, sig, err := e.stripe.Event("evt_concurrent", eventCompleted, cs, webhookSecret, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan string, deliveries)
	var start, done sync.WaitGroup
	start.Add(1)
	for range deliveries {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+"/market/stripe/webhook", strings.NewReader(string(payload)))
			if err != nil {
				results <- "request: " + err.Error()
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Stripe-Signature", sig)
			res, err := e.ts.Client().Do(req)
			if err != nil {
				results <- "post: " + err.Error()
				return
			}
			defer res.Body.Close()
			var a webhookAnswer
			if res.StatusCode != http.StatusOK {
				results <- fmt.Sprintf("status %d", res.StatusCode)
				return
			}
			if err := decodeReader(res, &a); err != nil {
				results <- "answer: " + err.Error()
				return
			}
			results <- a.Result
		}()
	}
	start.Done()
	done.Wait()
	close(results)
	counts := map[string]int{}
	for r := range results {
		counts[r]++
	}
	if counts[resultPaid] != 1 || counts[resultPaid]+counts[resultDuplicate]+counts[resultAlreadyPaid] != deliveries {
		t.Errorf("answers of %d concurrent deliveries: %v; want exactly one paid, the rest duplicate or alreadyPaid", deliveries, counts)
	}
	text := e.scrape()
	wantLines(t, text, `vmshelf_webhook_events_total{result="paid",type="checkout.session.completed"} 1`)
	if n := strings.Count(e.logs.String(), `msg="order paid"`); n != 1 {
		t.Errorf("%d \"order paid\" log lines, want 1:\n%s", n, e.logs.String())
	}
	if m.paid.Load() != 1 {
		t.Errorf("the provisioner was told %d times, want once", m.paid.Load())
	}
	if o := e.storedOrder(id); o.State != "paid" {
		t.Errorf("order is %s, want paid", o.State)
	}
}

// decodeReader decodes a JSON answer from a response's body.
func decodeReader(res *http.Response, v any) error {
	return json.NewDecoder(res.Body).Decode(v)
}
