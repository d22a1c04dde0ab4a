package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// The refunds through the binary: a payment that comes for an order
// already cancelled is given back once, whatever happens to serve while it
// asks Stripe, and however many replicas hear of it.

// refundArgs are serve's flags for the refund tests: rounds every 100 ms
// and one Stripe call at most a second, so a killed replica's claim (twice
// that) runs out quickly.
var refundArgs = []string{"--refund-every", "100ms", "--stripe-timeout", "1s"}

// refundOrderStatus is what the tests read of an order in status.
type refundOrderStatus struct {
	OrderID string `json:"order_id"`
	State   string `json:"state"`
	Refund  *struct {
		Cause      string     `json:"cause"`
		Attempts   int        `json:"attempts"`
		RefundedAt *time.Time `json:"refunded_at"`
	} `json:"refund"`
}

func refundStatusOf(t *testing.T, s *server, token, orderID string) refundOrderStatus {
	t.Helper()
	var o refundOrderStatus
	statusOrder(t, s, token, orderID, &o)
	return o
}

// statusOrder reads order orderID as the status of token's tenant shows it
// into v.
func statusOrder(t *testing.T, s *server, token, orderID string, v any) {
	t.Helper()
	code, body := s.ctl(t, "/market/vms/status", token, "")
	if code != http.StatusOK {
		t.Fatalf("status: %d %s", code, body)
	}
	var st struct {
		Orders []json.RawMessage `json:"orders"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	for _, raw := range st.Orders {
		var id struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(raw, &id); err != nil {
			t.Fatalf("status order %s: %v", raw, err)
		}
		if id.OrderID == orderID {
			if err := json.Unmarshal(raw, v); err != nil {
				t.Fatalf("status order %s: %v", raw, err)
			}
			return
		}
	}
	t.Fatalf("status does not list order %s: %s", orderID, body)
}

// listing has host list replicas on s (body: unit_price and capacity).
func (s *server) listing(t *testing.T, host, body string) listingAnswer {
	t.Helper()
	code, answer := s.ctl(t, "/market/vms/listings", host, body)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, answer)
	}
	var l listingAnswer
	decode(t, answer, &l)
	return l
}

// ordered has the dev tenant order quantity replicas of debian-13 named
// name from listing l on s.
func (s *server) ordered(t *testing.T, l listingAnswer, name string, quantity int) orderAnswer {
	t.Helper()
	code, body := s.ctl(t, "/market/vms/orders", s.token,
		`{"listing_id":"`+l.ListingID+`","quantity":`+strconv.Itoa(quantity)+`,"image":"debian-13","name":"`+name+`"}`)
	if code != http.StatusCreated {
		t.Fatalf("order: %d %s", code, body)
	}
	var o orderAnswer
	decode(t, body, &o)
	return o
}

// tenantAddHost adds a tenant that can host machines with the real CLI
// in env (a shared store's URL) and returns its token, noted as a secret
// of every replica.
func tenantAddHost(t *testing.T, env []string, dataDir, name, account string, replicas ...*server) string {
	t.Helper()
	res := runCmd(t, env, binPath, "tenant", "add", name, "--in-mesh", "--sharing", "--hosts-vms", "--appliance", "node1",
		"--stripe-account", account, "--data-dir", dataDir)
	if res.code != 0 {
		t.Fatalf("tenant add %s: exit %d: %s", name, res.code, res.stderr)
	}
	token := strings.TrimSpace(res.stdout)
	for _, s := range replicas {
		s.secret(token)
	}
	return token
}

// cancelledThenPaid places an order on s, lets its checkout expire (the
// signed checkout.session.expired event), then has the buyer pay the
// session at the fake Stripe, and returns the order id and the session.
func cancelledThenPaid(t *testing.T, s *server, fake *stripetest.Server, whsec, host string) (string, string) {
	t.Helper()
	o := s.ordered(t, s.listing(t, host, `{"unit_price":600,"capacity":5}`), "web", 2)
	sessions := fake.Sessions()
	cs := sessions[len(sessions)-1].ID
	payload, sig, err := fake.Event("evt_expired_"+o.OrderID, "checkout.session.expired", cs, whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body := postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "checkout expired", code, body, "cancelled")
	if err := fake.Pay(cs); err != nil { // the buyer paid in the moment before
		t.Fatal(err)
	}
	return o.OrderID, cs
}

// waitRefunded polls (bounded, 30 s) the buyer's status until the order
// is refunded, and returns what status says of it then; the caller checks.
func waitRefunded(t *testing.T, s *server, orderID string) refundOrderStatus {
	t.Helper()
	var st refundOrderStatus
	poll(t, 600, 50*time.Millisecond, "order "+orderID+" refunded", func() bool {
		st = refundStatusOf(t, s, s.token, orderID)
		return st.State == "refunded"
	}, func() string { return mustJSON(st) })
	return st
}

// wantRefundedOnce waits (bounded) until status shows the order refunded,
// then checks that Stripe made exactly one refund of it, that every
// request for it carried the same key, and returns how many there were.
func wantRefundedOnce(t *testing.T, s *server, fake *stripetest.Server, orderID string) int {
	t.Helper()
	st := waitRefunded(t, s, orderID)
	if st.State != "refunded" || st.Refund == nil || st.Refund.Cause != "paidAfterCancel" || st.Refund.RefundedAt == nil {
		t.Fatalf("order %s: %+v; want refunded for paidAfterCancel", orderID, st)
	}
	var made int
	for _, rf := range fake.Refunds() {
		if rf.OrderID == orderID {
			made++
		}
	}
	if made != 1 {
		t.Errorf("Stripe made %d refunds of order %s, want exactly 1", made, orderID)
	}
	key := billing.RefundKey(orderID, "paidAfterCancel", 0)
	var asked int
	for _, r := range fake.Received("/v1/refunds") {
		if r.Form.Get("metadata[order_id]") != orderID {
			continue
		}
		asked++
		if r.Idempotency != key || r.Form.Get("reverse_transfer") != "true" || r.Form.Get("refund_application_fee") != "true" {
			t.Errorf("refund request key %q, form %v; want key %q, reverse_transfer and refund_application_fee true", r.Idempotency, r.Form, key)
		}
	}
	return asked
}

// TestE2ERefundKilledMidway: serve is killed (-9) while Stripe holds the
// answer to a refund it already made; the restarted serve asks again with
// the same key once the dead one's claim ran out, and records Stripe's one
// refund.
func TestE2ERefundKilledMidway(t *testing.T) {
	needTool(t, "curl")
	key, whsec := stripeTestSecrets()
	const account = "acct_e2eRefundHost"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	args := append([]string{"--vms-enable", "--stripe-api-base", fake.URL}, refundArgs...)
	dir := t.TempDir() + "/data"
	s := startServe(t, dir, args, env...)
	s.secret(key)
	s.secret(whsec)
	host := addHost(t, s, "host", account)
	orderID, cs := cancelledThenPaid(t, s, fake, whsec, host)

	release := fake.HoldRefunds()
	defer release()
	payload, sig, err := fake.Event("evt_paid_late", "checkout.session.completed", cs, whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// Posted as Stripe would; serve dies before it answers, so no test
	// helper (nothing may fail the test from this goroutine).
	go func() {
		req, err := http.NewRequest(http.MethodPost, s.ctlBase+"/market/stripe/webhook", bytes.NewReader(payload))
		if err != nil {
			return
		}
		req.Header.Set("Stripe-Signature", sig)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	poll(t, 3000, 10*time.Millisecond, "Stripe to get the refund request", func() bool { return len(fake.Received("/v1/refunds")) > 0 })
	if len(fake.Received("/v1/refunds")) != 1 || len(fake.Refunds()) != 1 {
		t.Fatalf("Stripe got %d refund requests and made %d refunds before the kill, want 1 and 1",
			len(fake.Received("/v1/refunds")), len(fake.Refunds()))
	}
	s.kill()
	release()

	s2 := startServeAt(t, dir, s.dataAddr, s.ctlAddr, args, env...)
	s2.secret(key)
	s2.secret(whsec)
	s2.token = s.token
	if asked := wantRefundedOnce(t, s2, fake, orderID); asked != 2 {
		t.Errorf("Stripe was asked %d times, want 2 (before the kill and once after)", asked)
	}
	// Stripe's webhook delivery is retried (the first was never
	// answered): it refunds nothing more.
	code, body := postWebhook(t, s2, payload, sig)
	wantWebhookResult(t, "the completed event again", code, body, "paidCancelled")
	if n := len(fake.Received("/v1/refunds")); n != 2 {
		t.Errorf("%d refund requests after the event's redelivery, want still 2", n)
	}
	if m := rawMetrics(t, s2); !strings.Contains(m, `vmshelf_refunds_total{cause="paidAfterCancel",outcome="refunded"} 1`) {
		t.Errorf("metrics do not count the refund:\n%s", grepLines(m, "vmshelf_refunds_total"))
	}
}

// TestE2ERefundTwoReplicas: two replicas over one PostgreSQL database
// receive the same late payment at once (Stripe retries a delivery it saw
// no answer to); the refund is decided once and Stripe asked once.
func TestE2ERefundTwoReplicas(t *testing.T) {
	needTool(t, "curl")
	key, whsec := stripeTestSecrets()
	const account = "acct_e2eRefundScale"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	r := newReplicas(t)
	r.env = append(append(r.env, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	r.args = append(append(r.args, "--vms-enable", "--stripe-api-base", fake.URL), refundArgs...)
	a := r.start(t, nil)
	b := r.start(t, a)
	for _, s := range []*server{a, b} {
		s.secret(key)
		s.secret(whsec)
	}
	host := tenantAddHost(t, r.env, a.dataDir, "host", account, a, b)
	var orders []string
	for i := range 3 {
		id, cs := cancelledThenPaid(t, a, fake, whsec, host)
		payload, sig, err := fake.Event("evt_late_"+strconv.Itoa(i), "checkout.session.completed", cs, whsec, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, s := range []*server{a, b} {
			wg.Go(func() {
				code, body := postWebhook(t, s, payload, sig)
				if code != http.StatusOK {
					t.Errorf("replica's webhook: %d %s", code, body)
				}
			})
		}
		wg.Wait()
		orders = append(orders, id)
	}
	for _, id := range orders {
		if asked := wantRefundedOnce(t, b, fake, id); asked != 1 {
			t.Errorf("order %s: Stripe was asked %d times, want once", id, asked)
		}
	}
}

// grepLines is the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestE2ERefundNotProvisioned: an order paid after its host stopped
// hosting machines is named hostGone by serve's provisioner (no machine is
// made), and refunded once --refund-deadline after the payment has passed:
// the provisioner, the store, the refunds and Stripe, all through the
// binary.
func TestE2ERefundNotProvisioned(t *testing.T) {
	const account = "acct_e2eRefundGone"
	m := startKubeMarket(t, account, append([]string{"--refund-deadline", "1s"}, refundArgs...)...)
	s := m.s
	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":5}`)
	o := m.order(t, l.ListingID, "debian-13", "web", 2, "")
	if r := vmshelf(t, "tenant", "set", "host", "--hosts-vms=false", "--data-dir", s.dataDir); r.code != 0 {
		t.Fatalf("tenant set host --hosts-vms=false: exit %d: %s", r.code, r.stderr)
	}
	paid := time.Now()
	m.pay(t, o.OrderID, "evt_e2e_refund_gone")
	st := waitRefunded(t, s, o.OrderID)
	if st.State != "refunded" || st.Refund == nil || st.Refund.Cause != "notProvisioned" || st.Refund.RefundedAt == nil {
		t.Fatalf("order: %+v; want refunded for notProvisioned", st)
	}
	if took := st.Refund.RefundedAt.Sub(paid); took < time.Second {
		t.Errorf("refunded %v after the payment, before the 1 s deadline", took)
	}
	refunds := m.stripe.Refunds()
	if len(refunds) != 1 || refunds[0].OrderID != o.OrderID || refunds[0].Cause != "notProvisioned" || refunds[0].Amount != 1200 {
		t.Errorf("Stripe's refunds %+v, want one of order %s's 1200 for notProvisioned", refunds, o.OrderID)
	}
	if vms := m.kube.objects("VirtualMachine"); len(vms) != 0 {
		t.Errorf("the cluster has %d VMs of an order whose host is gone", len(vms))
	}
	if logs := s.stderr.String(); !strings.Contains(logs, "cause=hostGone") {
		t.Errorf("no log line names the cause hostGone:\n%s", grepLines(logs, o.OrderID))
	}
}

// TestE2ERefundImportFailed: CDI fails the import of the buyer's own
// image after the order went active; the next pass of serve's provisioner
// names importFailed, the order (which never ran) is refunded once the
// deadline has passed, and the pass after halts its machine.
func TestE2ERefundImportFailed(t *testing.T) {
	needTool(t, "qemu-img")
	const account = "acct_e2eRefundImport"
	m := startKubeMarket(t, account, append([]string{"--refund-deadline", "1s"}, refundArgs...)...)
	s, kube := m.s, m.kube
	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":5}`)
	file, data := makeBootableImage(t, t.TempDir(), "own.qcow2")
	img := s.upload(t, s.ticket(t, "own"), file, data)
	a := m.order(t, l.ListingID, img.UploadID, "own", 1, "")
	m.pay(t, a.OrderID, "evt_e2e_import_a")
	vm := "vm-" + a.OrderID + "-0"
	m.waitMachine(t, s.token, a.OrderID, "active", []replicaStatus{{Name: vm, State: "starting"}})

	// CDI gives up on the disk; the pass another payment kicks sees it.
	kube.putDataVolume("", vm+"-disk", "Failed", "")
	b := m.order(t, l.ListingID, "debian-13", "other", 1, "")
	m.pay(t, b.OrderID, "evt_e2e_import_b")
	st := waitRefunded(t, s, a.OrderID)
	if st.State != "refunded" || st.Refund == nil || st.Refund.Cause != "importFailed" {
		t.Fatalf("order: %+v; want refunded for importFailed", st)
	}
	if refunds := m.stripe.Refunds(); len(refunds) != 1 || refunds[0].OrderID != a.OrderID || refunds[0].Cause != "importFailed" {
		t.Errorf("Stripe's refunds %+v, want one, of order %s for importFailed", refunds, a.OrderID)
	}
	if got := refundStatusOf(t, s, s.token, b.OrderID); got.State != "active" || got.Refund != nil {
		t.Errorf("the other order: %+v, want active and no refund", got)
	}

	// The next pass (kicked by a third payment) halts the refunded
	// order's machine: CDI retrying must not start it.
	c := m.order(t, l.ListingID, "debian-13", "third", 1, "")
	m.pay(t, c.OrderID, "evt_e2e_import_c")
	poll(t, 400, 25*time.Millisecond, "the refunded order's VM halted", func() bool {
		for _, o := range kube.objects("VirtualMachine") {
			if kubeStr(kubeMeta(o), "name") == vm {
				spec, _ := o["spec"].(map[string]any)
				return spec["runStrategy"] == "Halted"
			}
		}
		return false
	}, func() string { return mustJSON(kube.objects("VirtualMachine")) })
	if d := kube.deletes(); len(d) != 0 {
		t.Errorf("the cluster was asked to delete %v; a refund deletes nothing", d)
	}
}

// TestPageRefunds: the buyer's Machines page, in Chromium, shows a late
// payment refunded, a refund Stripe failed, a disputed charge the bank
// decided for the buyer, and a refund held because the charge is disputed
// in words, each made through the binary.
func TestPageRefunds(t *testing.T) {
	t.Parallel()
	browserDir(t)
	key, whsec := stripeTestSecrets()
	const account = "acct_e2eRefundPage"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	s := startServe(t, t.TempDir()+"/data", append([]string{"--vms-enable", "--stripe-api-base", fake.URL}, refundArgs...), env...)
	s.secret(key)
	s.secret(whsec)
	host := addHost(t, s, "host", account)

	late := func(eventID string) string {
		id, cs := cancelledThenPaid(t, s, fake, whsec, host)
		payload, sig, err := fake.Event(eventID, "checkout.session.completed", cs, whsec, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		code, body := postWebhook(t, s, payload, sig)
		wantWebhookResult(t, "late payment", code, body, "paidCancelled")
		return id
	}
	refunded := late("evt_page_late_1")
	fake.RefundAs(billing.RefundFailed, "insufficient_funds")
	failed := late("evt_page_late_2")

	// A paid order whose charge the buyer's bank disputes.
	o := s.ordered(t, s.listing(t, host, `{"unit_price":700,"capacity":2}`), "disputed", 1)
	sessions := fake.Sessions()
	cs := sessions[len(sessions)-1]
	if err := fake.Pay(cs.ID); err != nil {
		t.Fatal(err)
	}
	payload, sig, err := fake.Event("evt_page_paid", "checkout.session.completed", cs.ID, whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body := postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "payment", code, body, "paid")
	paid, _ := fake.Session(cs.ID)
	payload, sig, err = fake.DisputeEvent("evt_page_dispute", paid.PaymentIntent, "fraudulent", whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body = postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "dispute", code, body, "disputed")
	payload, sig, err = fake.DisputeClosedEvent("evt_page_dispute_lost", paid.PaymentIntent, "lost", whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body = postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "dispute lost", code, body, "disputeClosed")

	// A late payment whose charge the bank disputes before its refund:
	// Stripe refuses the refund (charge_disputed), and it is held.
	fake.RefundAs("", "")
	heldID, heldCS := cancelledThenPaid(t, s, fake, whsec, host)
	heldSession, _ := fake.Session(heldCS)
	if _, _, err := fake.DisputeEvent("evt_page_dispute_held", heldSession.PaymentIntent, "fraudulent", whsec, time.Now()); err != nil {
		t.Fatal(err)
	}
	payload, sig, err = fake.Event("evt_page_late_3", "checkout.session.completed", heldCS, whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body = postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "late payment of a disputed charge", code, body, "paidCancelled")

	closed := disputeStatusOf(t, s, o.OrderID).DisputeClosedAt
	if closed == nil {
		t.Fatal("status shows no decision of the dispute lost")
	}
	decided := closed.UTC().Format("2006-01-02 15:04") + " UTC"

	pr := startPage(t, "refunds", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
		"PAGE_ORDERS": strings.Join([]string{refunded, failed, o.OrderID, heldID}, ","),
	}, nil)
	pr.extra = s.logs
	type shown struct {
		State     string `json:"state"`
		StateText string `json:"stateText"`
		Refund    string `json:"refund"`
		Cause     string `json:"cause"`
		Disputed  string `json:"disputed"`
		Dispute   string `json:"dispute"`
		Held      string `json:"held"`
	}
	var rep struct {
		commonReport
		Orders map[string]shown `json:"orders"`
	}
	pr.wait(&rep)
	for _, c := range []struct {
		id   string
		want shown
	}{
		{refunded, shown{State: "refunded", StateText: "Refunded", Refund: "Refund: paid after the order was cancelled.", Cause: "paidAfterCancel"}},
		{failed, shown{State: "refundFailed", StateText: "Refund failed; retrying", Refund: "Refund: paid after the order was cancelled.", Cause: "paidAfterCancel"}},
		{o.OrderID, shown{State: "paid", StateText: "paid, starting", Dispute: "lost",
			Disputed: "Payment disputed by the buyer's bank: the bank gave the payment back to the buyer · decided " + decided}},
		{heldID, shown{State: "refunding", StateText: "Refund held: payment disputed", Refund: "Refund: paid after the order was cancelled.",
			Cause: "paidAfterCancel", Dispute: "open", Disputed: "Payment disputed by the buyer's bank",
			Held: "The refund is held: the payment is disputed, so the buyer's bank, not this edge, decides whether it goes back."}},
	} {
		if got := rep.Orders[c.id]; got != c.want {
			t.Errorf("order %s on the page: %+v, want %+v", c.id, got, c.want)
		}
	}
}
