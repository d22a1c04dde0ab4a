package main

// End-to-end tests of the VM market: the real binary with its Stripe
// secrets from the environment, a host made with the tenant CLI, a stateful
// fake Stripe (billing/stripetest) or Stripe's own stripe-mock on
// loopback, and webhooks posted with curl.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// noStripeEnv clears the Stripe variables a developer's shell may have
// set; later entries of a child's environment override these.
var noStripeEnv = []string{"STRIPE_SECRET_KEY=", "STRIPE_SECRET_KEY_FILE=", "STRIPE_WEBHOOK_SECRET=", "STRIPE_WEBHOOK_SECRET_FILE="}

// stripeTestSecrets are a fresh key and webhook secret: unique, so that
// finding one in a log line means it leaked.
func stripeTestSecrets() (key, whsec string) {
	return "sk_test_e2e" + rand.Text(), "whsec_e2e" + rand.Text()
}

// secretFile writes v to a 0600 file, as a mounted Secret would hold it.
func secretFile(t *testing.T, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// addHost adds a tenant that can host VMs with the real CLI while serve
// runs and returns its token (noted as a secret).
func addHost(t *testing.T, s *server, name, account string) string {
	t.Helper()
	r := vmshelf(t, "tenant", "add", name, "--in-mesh", "--sharing", "--hosts-vms", "--appliance", "node1",
		"--stripe-account", account, "--data-dir", s.dataDir)
	if r.code != 0 {
		t.Fatalf("tenant add %s: exit %d: %s", name, r.code, r.stderr)
	}
	token := strings.TrimSuffix(r.stdout, "\n")
	if !hex64.MatchString(token) {
		t.Fatalf("tenant add printed %q, want a 64-hex token", r.stdout)
	}
	s.secret(token)
	return token
}

type listingAnswer struct {
	ListingID string    `json:"listing_id"`
	UnitPrice int64     `json:"unit_price"`
	Currency  string    `json:"currency"`
	Capacity  int       `json:"capacity"`
	Reserved  int       `json:"reserved"`
	Running   int       `json:"running"`
	Free      int       `json:"free"`
	Open      bool      `json:"open"`
	CreatedAt time.Time `json:"created_at"`
}

type orderAnswer struct {
	OrderID     string    `json:"order_id"`
	State       string    `json:"state"`
	CheckoutURL string    `json:"checkout_url"`
	ExpiresAt   time.Time `json:"expires_at"`
	Total       int64     `json:"total"`
	Currency    string    `json:"currency"`
}

type marketOrder struct {
	OrderID     string     `json:"order_id"`
	ListingID   string     `json:"listing_id"`
	Host        string     `json:"host"`
	State       string     `json:"state"`
	Quantity    int        `json:"quantity"`
	Image       string     `json:"image"`
	Name        string     `json:"name"`
	Total       int64      `json:"total"`
	Currency    string     `json:"currency"`
	PaidAt      *time.Time `json:"paid_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	CheckoutURL string     `json:"checkout_url"`
	Address     string     `json:"address"`
	Note        string     `json:"note"`
	Replicas    []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"replicas"`
}

// marketStatus is the market's part of POST /market/vms/status.
type marketStatus struct {
	Available bool            `json:"available"`
	Reason    string          `json:"reason"`
	Listings  []listingAnswer `json:"listings"`
	Offers    []struct {
		ListingID string `json:"listing_id"`
		Host      string `json:"host"`
		UnitPrice int64  `json:"unit_price"`
		Free      int    `json:"free"`
	} `json:"offers"`
	Orders []marketOrder `json:"orders"`
}

// answers keeps every body serve sent a test, to check that none carries
// what it must not.
type answers struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (a *answers) add(b []byte) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bodies = append(a.bodies, b)
	return b
}

func (a *answers) containing(v string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var hits []string
	for _, b := range a.bodies {
		if bytes.Contains(b, []byte(v)) {
			hits = append(hits, string(b))
		}
	}
	return hits
}

func marketStatusOf(t *testing.T, s *server, seen *answers, token string) marketStatus {
	t.Helper()
	code, body := s.ctl(t, "/market/vms/status", token, "")
	seen.add(body)
	if code != http.StatusOK {
		t.Fatalf("status: %d %s", code, body)
	}
	if bytes.Contains(body, []byte("user_data")) {
		t.Errorf("status carries user_data: %s", body)
	}
	var st marketStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	return st
}

// postWebhook posts a signed event to the webhook with curl, as Stripe
// would: the exact bytes from a file, the signature in its header.
func postWebhook(t *testing.T, s *server, payload []byte, signature string) (int, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "event.json")
	if err := os.WriteFile(p, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	return curl(t, "-H", "Content-Type: application/json", "-H", "Stripe-Signature: "+signature,
		"--data-binary", "@"+p, s.ctlBase+"/market/stripe/webhook")
}

func wantWebhookResult(t *testing.T, what string, code int, body []byte, want string) {
	t.Helper()
	var a struct {
		Received bool   `json:"received"`
		Result   string `json:"result"`
	}
	if code != http.StatusOK {
		t.Fatalf("%s: webhook answered %d %s, want 200", what, code, body)
	}
	decode(t, body, &a)
	if !a.Received || a.Result != want {
		t.Errorf("%s: webhook answered %s, want received, result %q", what, body, want)
	}
}

// readyz is GET /readyz: the status code and the body.
func (s *server) readyz(t *testing.T) (int, []byte) {
	t.Helper()
	code, body := curl(t, s.ctlBase+"/readyz")
	return code, body
}

// stripeCalls is the number of Stripe calls that ended with outcome, by
// vmshelf_stripe_request_duration_seconds.
func stripeCalls(mfs map[string]*dto.MetricFamily, call, outcome string) uint64 {
	for _, m := range mfs["vmshelf_stripe_request_duration_seconds"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["call"] == call && l["outcome"] == outcome {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func rawMetrics(t *testing.T, s *server) string {
	t.Helper()
	code, body := curl(t, s.ctlBase+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	return string(body)
}

// TestE2EMarketFlow: a host made with the CLI lists replicas, the dev box
// orders three with user data, the fake Stripe receives one destination
// charge, the test pays it there and posts Stripe's signed event with
// curl, and the order is paid: status, capacity and metrics say so, a
// replay changes nothing, and no secret or user data leaks anywhere.
func TestE2EMarketFlow(t *testing.T) {
	needTool(t, "curl")
	key, whsec := stripeTestSecrets()
	const account = "acct_e2eHost1"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()

	data := filepath.Join(t.TempDir(), "data")
	returnURL := "https://box.example.org/machines"
	env := append(append([]string{}, noStripeEnv...),
		"STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	start := time.Now()
	s := startServe(t, data, []string{"--vms-enable", "--stripe-api-base", fake.URL,
		"--checkout-return-url", returnURL, "--vms-domain", "vms.example.org"}, env...)
	s.secret(key)
	s.secret(whsec)
	var seen answers

	// No cluster here (no --kubeconfig, not in one): the provisioner
	// says so, the market works.
	if code, body := s.readyz(t); code != http.StatusOK || !strings.Contains(string(body), `"machines":"clusterUnreachable"`) {
		t.Errorf("/readyz with both Stripe secrets and no cluster: %d %s, want 200 with machines clusterUnreachable", code, body)
	}

	host := addHost(t, s, "host", account)

	// The host lists 5 replicas at 6.00 EUR.
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
	seen.add(body)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	if l.ListingID == "" || l.UnitPrice != 600 || l.Currency != "eur" || l.Capacity != 5 || l.Free != 5 || !l.Open {
		t.Fatalf("listing answer %s; want 600 eur, capacity 5, free 5, open", body)
	}

	// The dev box orders 3 with user data (a secret of the buyer's).
	userMark := "e2e-user-data-" + rand.Text()
	userData := "#cloud-config\npassword: " + userMark + "\nchpasswd: {expire: false}\n"
	s.secret(userMark)
	req, err := json.Marshal(map[string]any{"listing_id": l.ListingID, "quantity": 3, "image": "debian-13",
		"name": "web", "user_data": userData})
	if err != nil {
		t.Fatal(err)
	}
	code, body = s.ctl(t, "/market/vms/orders", s.token, string(req))
	seen.add(body)
	if code != http.StatusCreated {
		t.Fatalf("order: %d %s", code, body)
	}
	var o orderAnswer
	decode(t, body, &o)
	if o.OrderID == "" || o.State != "awaitingPayment" || o.Total != 1800 || o.Currency != "eur" || o.CheckoutURL == "" {
		t.Fatalf("order answer %s; want awaitingPayment, total 1800 eur, a checkout_url", body)
	}
	if d := o.ExpiresAt.Sub(start); d < 30*time.Minute || d > 33*time.Minute {
		t.Errorf("the checkout expires %v after the start, want about 31 min", d)
	}

	// Stripe got exactly one Checkout: a destination charge to the host
	// with the platform's half as the fee; and it got no user data.
	sessions := fake.Sessions()
	if len(sessions) != 1 {
		t.Fatalf("the fake Stripe has %d checkout sessions, want 1: %+v", len(sessions), sessions)
	}
	cs := sessions[0]
	if cs.OrderID != o.OrderID || cs.Currency != "eur" || cs.UnitAmount != 600 || cs.Quantity != 3 ||
		cs.UnitAmount*cs.Quantity != 1800 || cs.Fee != 900 || cs.Destination != account {
		t.Errorf("checkout session %+v; want order %s, 3 × 600 eur = 1800, fee 900, destination %s", cs, o.OrderID, account)
	}
	if cs.Idempotency == "" {
		t.Error("the checkout was opened without an Idempotency-Key")
	}
	if want := "https://checkout.stripe.test/c/pay/" + cs.ID; o.CheckoutURL != want {
		t.Errorf("checkout_url %q, want the session's %q", o.CheckoutURL, want)
	}
	for _, k := range []string{"success_url", "cancel_url"} {
		u, err := url.Parse(cs.Form.Get(k))
		if err != nil || u.Scheme+"://"+u.Host+u.Path != returnURL || u.Query().Get("order") != o.OrderID {
			t.Errorf("%s %q; want %s?…order=%s (--checkout-return-url)", k, cs.Form.Get(k), returnURL, o.OrderID)
		}
	}
	for k, vs := range cs.Form {
		for _, v := range vs {
			if strings.Contains(v, userMark) {
				t.Errorf("the user data went to Stripe in %s", k)
			}
		}
	}

	st := marketStatusOf(t, s, &seen, s.token)
	if len(st.Orders) != 1 {
		t.Fatalf("status lists %d orders, want 1: %+v", len(st.Orders), st.Orders)
	}
	so := st.Orders[0]
	if !st.Available || so.OrderID != o.OrderID || so.State != "awaitingPayment" || so.CheckoutURL != o.CheckoutURL ||
		so.Quantity != 3 || so.Host != "host" || so.Image != "debian-13" || so.ExpiresAt != nil || len(so.Replicas) != 0 {
		t.Errorf("status order %+v; want awaitingPayment with the checkout_url, 3 of debian-13 from host, no replicas yet", so)
	}

	// Paid at Stripe; Stripe posts the signed event, here with curl.
	if err := fake.Pay(cs.ID); err != nil {
		t.Fatal(err)
	}
	payload, sig, err := fake.Event("evt_e2e_paid", "checkout.session.completed", cs.ID, whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body = postWebhook(t, s, payload, sig)
	seen.add(body)
	wantWebhookResult(t, "checkout.session.completed", code, body, "paid")

	st = marketStatusOf(t, s, &seen, s.token)
	so = st.Orders[0]
	if so.State != "paid" || so.CheckoutURL != "" || len(so.Replicas) != 3 {
		t.Fatalf("after the webhook the order is %+v; want paid with 3 replicas and no checkout_url", so)
	}
	for i, r := range so.Replicas {
		if r.State != "starting" || !strings.HasPrefix(r.Name, "vm-"+o.OrderID+"-") {
			t.Errorf("replica %d is %+v, want vm-%s-… starting", i, r, o.OrderID)
		}
	}
	if so.PaidAt == nil || so.ExpiresAt == nil || so.PaidAt.Before(start) || !so.ExpiresAt.Equal(so.PaidAt.AddDate(0, 1, 0)) {
		t.Errorf("paid_at %v, expires_at %v; want expires_at a month after paid_at", so.PaidAt, so.ExpiresAt)
	}
	if want := "vm-" + o.OrderID + ".vms.example.org"; so.Address != want {
		t.Errorf("address %q, want %q (--vms-domain)", so.Address, want)
	}
	// The payment kicked the provisioner, which has no cluster: the
	// buyer reads why the order waits.
	poll(t, 400, 25*time.Millisecond, "the paid order's note", func() bool {
		so = marketStatusOf(t, s, &seen, s.token).Orders[0]
		return strings.HasPrefix(so.Note, "the cluster cannot be reached: ")
	}, func() string { return so.Note })
	if so.State != "paid" {
		t.Errorf("the order waiting for the cluster is %s, want paid", so.State)
	}
	if len(st.Offers) != 1 || st.Offers[0].ListingID != l.ListingID || st.Offers[0].Free != 2 {
		t.Errorf("the buyer's offers %+v; want the listing with 2 free", st.Offers)
	}
	hs := marketStatusOf(t, s, &seen, host)
	if len(hs.Listings) != 1 || hs.Listings[0].Free != 2 || hs.Listings[0].Capacity != 5 {
		t.Errorf("the host's listings %+v; want capacity 5, free 2", hs.Listings)
	}

	// Stripe retries: the same event again changes nothing.
	code, body = postWebhook(t, s, payload, sig)
	seen.add(body)
	wantWebhookResult(t, "the replayed event", code, body, "duplicate")
	// A forgery: the same event signed with another secret.
	forged, forgedSig := stripetest.Signed(payload, "whsec_not_ours", time.Now())
	code, body = postWebhook(t, s, forged, forgedSig)
	seen.add(body)
	wantError(t, "an event signed with another secret", code, body, http.StatusBadRequest, "badSignature")
	if st := marketStatusOf(t, s, &seen, s.token); st.Orders[0].State != "paid" || len(st.Orders) != 1 {
		t.Errorf("after a replay and a forgery the orders are %+v, want the one paid", st.Orders)
	}

	mfs := s.scrape(t)
	for _, w := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vmshelf_orders", map[string]string{"state": "paid"}, 1},
		{"vmshelf_orders", map[string]string{"state": "awaitingPayment"}, 0},
		{"vmshelf_orders_placed_total", nil, 1},
		{"vmshelf_webhook_events_total", map[string]string{"type": "checkout.session.completed", "result": "paid"}, 1},
		{"vmshelf_webhook_events_total", map[string]string{"type": "checkout.session.completed", "result": "duplicate"}, 1},
		{"vmshelf_webhook_events_total", map[string]string{"type": "unknown", "result": "refused"}, 1},
	} {
		if v := mustMetric(t, mfs, w.name, w.labels); v != w.want {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, v, w.want)
		}
	}
	// One account check, one checkout, one session read back for the
	// event; the replay asked Stripe nothing.
	for call, want := range map[string]uint64{"get_account": 1, "create_checkout": 1, "get_session": 1} {
		if n := stripeCalls(mfs, call, "ok"); n != want {
			t.Errorf("vmshelf_stripe_request_duration_seconds{call=%q,outcome=\"ok\"} counts %d, want %d", call, n, want)
		}
	}
	if n := fake.Requests(); n != 3 {
		t.Errorf("the fake Stripe got %d requests, want 3 (account, checkout, session)", n)
	}

	raw := rawMetrics(t, s)
	for what, v := range map[string]string{"user data": userMark, "Stripe key": key, "webhook secret": whsec, "host token": host} {
		if strings.Contains(raw, v) {
			t.Errorf("/metrics contains the %s", what)
		}
		if hits := seen.containing(v); len(hits) != 0 {
			t.Errorf("an answer contains the %s: %s", what, hits[0])
		}
	}
	// The logs are checked for the key, the secret, the tokens and the
	// user data when serve stops (s.secret); this is the early look.
	s.assertNoSecrets()
}

// TestE2EMarketCurrency: --currency reaches the listings and Stripe.
func TestE2EMarketCurrency(t *testing.T) {
	key, _ := stripeTestSecrets()
	const account = "acct_e2eHostChf"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL,
		"--currency", "CHF"}, append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key)...)
	s.secret(key)
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":1}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	code, body = s.ctl(t, "/market/vms/orders", s.token, `{"listing_id":"`+l.ListingID+`","quantity":1,"image":"debian-13","name":"one"}`)
	if code != http.StatusCreated {
		t.Fatalf("order: %d %s", code, body)
	}
	var o orderAnswer
	decode(t, body, &o)
	ss := fake.Sessions()
	if l.Currency != "chf" || o.Currency != "chf" || len(ss) != 1 || ss[0].Currency != "chf" || ss[0].Fee != 300 {
		t.Errorf("listing in %q, order in %q, sessions %+v; want chf everywhere (fee 300)", l.Currency, o.Currency, ss)
	}
}

// TestE2EMarketMinimumCharge: with --currency nok (Stripe's minimum
// charge 3.00 NOK) the binary refuses a listing at 2.99 NOK with
// belowMinimumCharge in words, and lists, and sells one machine of, one
// at exactly 3.00 NOK.
func TestE2EMarketMinimumCharge(t *testing.T) {
	key, _ := stripeTestSecrets()
	const account = "acct_e2eHostNok"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL,
		"--currency", "nok"}, append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key)...)
	s.secret(key)
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":299,"capacity":1}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(string(body), `"reason":"belowMinimumCharge"`) ||
		!strings.Contains(string(body), "the smallest charge Stripe accepts in NOK is 3.00 NOK") {
		t.Errorf("listing at 2.99 NOK: %d %s, want 422 belowMinimumCharge naming 3.00 NOK", code, body)
	}
	code, body = s.ctl(t, "/market/vms/listings", host, `{"unit_price":300,"capacity":1}`)
	if code != http.StatusCreated {
		t.Fatalf("listing at 3.00 NOK: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	code, body = s.ctl(t, "/market/vms/orders", s.token, `{"listing_id":"`+l.ListingID+`","quantity":1,"image":"debian-13","name":"one"}`)
	if code != http.StatusCreated {
		t.Fatalf("order of one at 3.00 NOK: %d %s", code, body)
	}
	if ss := fake.Sessions(); len(ss) != 1 || ss[0].Currency != "nok" || ss[0].UnitAmount != 300 {
		t.Errorf("sessions %+v, want one of 300 nok", ss)
	}
	s.assertNoSecrets()
}

// TestE2EMarketWithoutStripeKeys: --vms-enable without the Stripe
// secrets still serves: the market refuses what needs payments with 503
// and says why, uploads work, and serve warns once at start.
func TestE2EMarketWithoutStripeKeys(t *testing.T) {
	needTool(t, "curl")
	t.Run("no key, no webhook secret", func(t *testing.T) {
		s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable"}, noStripeEnv...)
		host := addHost(t, s, "host", "acct_e2eHost2")

		code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
		wantError(t, "listing without a Stripe key", code, body, http.StatusServiceUnavailable, "paymentsUnavailable")
		code, body = s.ctl(t, "/market/vms/orders", s.token, `{"listing_id":"l0123456789abcdef","quantity":1,"image":"debian-13","name":"web"}`)
		wantError(t, "order without a Stripe key", code, body, http.StatusServiceUnavailable, "paymentsUnavailable")
		st := s.status(t, s.token)
		if st.Available || st.Reason != "paymentsUnavailable" {
			t.Errorf("status available %v reason %q, want false paymentsUnavailable", st.Available, st.Reason)
		}
		code, body = s.readyz(t)
		var ready struct {
			Status   string   `json:"status"`
			Machines string   `json:"machines"`
			Reasons  []string `json:"reasons"`
		}
		decode(t, body, &ready)
		if code != http.StatusOK || ready.Status != "ok" || ready.Machines != "paymentsUnavailable" ||
			!slices.Contains(ready.Reasons, "webhookNotConfigured") {
			t.Errorf("/readyz: %d %s, want 200 ok with machines paymentsUnavailable, and webhookNotConfigured among reasons", code, body)
		}
		code, body = postWebhook(t, s, []byte(`{"id":"evt_1","type":"checkout.session.completed"}`), "t=1,v1=00")
		wantError(t, "webhook without a secret", code, body, http.StatusServiceUnavailable, "webhookNotConfigured")

		// Uploads go on: a ticket is issued.
		s.ticket(t, "still uploading")

		var warn []string
		for _, line := range strings.Split(s.logs(), "\n") {
			if strings.Contains(line, "STRIPE_SECRET_KEY") {
				warn = append(warn, line)
			}
		}
		if len(warn) != 1 || !strings.Contains(warn[0], "level=WARN") || !strings.Contains(warn[0], "paymentsUnavailable") {
			t.Errorf("serve's lines naming STRIPE_SECRET_KEY: %q; want one warning that says paymentsUnavailable", warn)
		}
	})

	t.Run("key without webhook secret", func(t *testing.T) {
		key, whsec := stripeTestSecrets()
		const account = "acct_e2eHost3"
		fake, err := stripetest.New(key, map[string]string{account: "active"})
		if err != nil {
			t.Fatal(err)
		}
		defer fake.Close()
		// The key from a file this time (STRIPE_SECRET_KEY_FILE).
		s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL},
			append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY_FILE="+secretFile(t, key))...)
		s.secret(key)
		host := addHost(t, s, "host", account)

		code, body := s.readyz(t)
		if code != http.StatusOK || !strings.Contains(string(body), `"machines":"webhookNotConfigured"`) {
			t.Errorf("/readyz: %d %s, want 200 with machines webhookNotConfigured", code, body)
		}
		if code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`); code != http.StatusCreated {
			t.Errorf("listing with the key from STRIPE_SECRET_KEY_FILE: %d %s, want 201", code, body)
		}
		payload, sig := stripetest.Signed([]byte(`{"id":"evt_1","object":"event","type":"checkout.session.completed","data":{"object":{}}}`), whsec, time.Now())
		code, body = postWebhook(t, s, payload, sig)
		wantError(t, "webhook without a secret", code, body, http.StatusServiceUnavailable, "webhookNotConfigured")

		var named []string
		for _, line := range strings.Split(s.logs(), "\n") {
			if strings.Contains(line, "STRIPE_") {
				named = append(named, line)
			}
		}
		if len(named) != 1 || !strings.Contains(named[0], "level=WARN") || !strings.Contains(named[0], "STRIPE_WEBHOOK_SECRET") {
			t.Errorf("serve's lines naming a Stripe variable: %q; want one warning naming STRIPE_WEBHOOK_SECRET", named)
		}
	})
}

// TestE2EMarketBadConfig: a bad market flag or Stripe secret is a
// one-line error, exit 2, before any port is opened (strace shows no
// bind or listen, see TestE2EBadCommandLines) and before the data dir is
// touched; no error quotes a key.
func TestE2EMarketBadConfig(t *testing.T) {
	needTool(t, "strace")
	key, whsec := stripeTestSecrets()
	keyFile, whsecFile := secretFile(t, key), secretFile(t, whsec)
	publishable := "pk_test_e2e" + rand.Text()
	missing := filepath.Join(t.TempDir(), "no-such-secret")
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		mention string
	}{
		{name: "unknown currency", args: []string{"--currency", "xyz"}, mention: "--currency"},
		{name: "vms-domain not a domain", args: []string{"--vms-domain", "Not A Domain"}, mention: "--vms-domain"},
		{name: "checkout-return-url not http", args: []string{"--checkout-return-url", "mailto:a@example.org"}, mention: "--checkout-return-url"},
		{name: "stripe-api-base with a path", args: []string{"--vms-enable", "--stripe-api-base", "https://api.stripe.com/v1"},
			env: []string{"STRIPE_SECRET_KEY=" + key}, mention: "--stripe-api-base"},
		{name: "key and key file", env: []string{"STRIPE_SECRET_KEY=" + key, "STRIPE_SECRET_KEY_FILE=" + keyFile},
			mention: "STRIPE_SECRET_KEY_FILE"},
		{name: "key file missing", env: []string{"STRIPE_SECRET_KEY_FILE=" + missing}, mention: "STRIPE_SECRET_KEY_FILE"},
		{name: "malformed key", env: []string{"STRIPE_SECRET_KEY=not-a-key"}, mention: "STRIPE_SECRET_KEY"},
		{name: "publishable key from a file", env: []string{"STRIPE_SECRET_KEY_FILE=" + secretFile(t, publishable)},
			mention: "STRIPE_SECRET_KEY"},
		{name: "webhook secret and its file", env: []string{"STRIPE_WEBHOOK_SECRET=" + whsec, "STRIPE_WEBHOOK_SECRET_FILE=" + whsecFile},
			mention: "STRIPE_WEBHOOK_SECRET_FILE"},
		{name: "webhook secret file missing", env: []string{"STRIPE_WEBHOOK_SECRET_FILE=" + missing}, mention: "STRIPE_WEBHOOK_SECRET_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			cmdline := append([]string{"serve", "--dev", "--data-dir", dataDir, "--data-addr", freeAddr(t), "--control-addr", freeAddr(t)}, tc.args...)
			// A serve that wrongly started would run until killed: bound it.
			r, calls := traceSockets(t, 20*time.Second, append(append([]string{}, noStripeEnv...), tc.env...), cmdline...)
			if len(calls) != 0 {
				t.Errorf("bound or listened before refusing:\n%s", strings.Join(calls, "\n"))
			}
			line := refusal(t, r, 2)
			if !strings.Contains(line, tc.mention) {
				t.Errorf("the error %q does not mention %q", line, tc.mention)
			}
			for _, v := range []string{key, whsec, publishable, "not-a-key"} {
				if strings.Contains(r.stdout+r.stderr, v) {
					t.Errorf("the refusal quotes a secret (%.11s…): %s", v, r.stderr)
				}
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the refused start touched the data dir (stat: %v)", err)
			}
		})
	}
}

// readmeBlock is the ```sh block of README.md whose first line is marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	rest := string(b)
	for {
		_, after, ok := strings.Cut(rest, "```sh\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```\n")
		if !ok {
			t.Fatal("README.md has an unclosed ```sh block")
		}
		if first, _, _ := strings.Cut(block, "\n"); first == marker {
			found = append(found, block)
		}
		rest = tail
	}
	if len(found) != 1 {
		t.Fatalf("README.md has %d ```sh blocks starting %q, want 1", len(found), marker)
	}
	return found[0]
}

// shellCommand is one command of a README block: its line continuations
// joined, split into words (the blocks' commands to parse use no quotes).
func shellCommand(t *testing.T, block, contains string) []string {
	t.Helper()
	joined := strings.ReplaceAll(block, "\\\n", " ")
	var hit []string
	for _, line := range strings.Split(joined, "\n") {
		if strings.Contains(line, contains) && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			hit = append(hit, line)
		}
	}
	if len(hit) != 1 {
		t.Fatalf("the README block has %d commands with %q, want 1:\n%s", len(hit), contains, block)
	}
	if strings.ContainsAny(hit[0], `'"$`) {
		t.Fatalf("the README command %q is quoted; the test reads it word by word", hit[0])
	}
	return strings.Fields(hit[0])
}

// flagValue removes --name VALUE from args and returns VALUE.
func flagValue(t *testing.T, args []string, name string) (string, []string) {
	t.Helper()
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], append(append([]string{}, args[:i]...), args[i+2:]...)
		}
	}
	t.Fatalf("%q has no %s VALUE", args, name)
	return "", nil
}

// TestE2EReadmeMarket follows README's "The VM market": the first block
// (stripe-mock and serve) is read and started by the test with the
// block's own flags, on the test's ports; the walk-through block runs
// literally with bash in a directory laid out like the repository's
// (bin/vmshelf, vmshelf-data), against a real stripe-mock.
func TestE2EReadmeMarket(t *testing.T) {
	needTool(t, "bash")
	needTool(t, "curl")
	mockBin := stripetest.MockPath(t)
	startBlock := readmeBlock(t, "# the market: start Stripe's API mock and serve")
	walk := readmeBlock(t, "# the market walk-through")

	// Block 1, checked word by word: the install command, the mock on
	// loopback, serve with the market on and Stripe at the mock.
	if !strings.Contains(startBlock, "\n"+stripetest.MockInstall+"\n") {
		t.Errorf("the README does not install stripe-mock with %q:\n%s", stripetest.MockInstall, startBlock)
	}
	// Where go install put it, as the line before installed it.
	const installed = `"$(go env GOPATH)/bin/stripe-mock"`
	var mockCmd []string
	for _, line := range strings.Split(startBlock, "\n") {
		if rest, ok := strings.CutPrefix(line, installed+" "); ok {
			mockCmd = strings.Fields(rest)
		}
	}
	if len(mockCmd) != 5 || mockCmd[0] != "-http-addr" || mockCmd[2] != "-https-addr" || mockCmd[4] != "&" ||
		!strings.HasPrefix(mockCmd[1], "127.0.0.1:") || !strings.HasPrefix(mockCmd[3], "127.0.0.1:") {
		t.Fatalf("the README starts stripe-mock as %q; want %s -http-addr 127.0.0.1:… -https-addr 127.0.0.1:… &:\n%s", mockCmd, installed, startBlock)
	}
	serveCmd := shellCommand(t, startBlock, "./bin/vmshelf serve")
	var env []string
	for len(serveCmd) > 0 && strings.Contains(serveCmd[0], "=") {
		env, serveCmd = append(env, serveCmd[0]), serveCmd[1:]
	}
	if len(serveCmd) < 2 || serveCmd[0] != "./bin/vmshelf" || serveCmd[1] != "serve" {
		t.Fatalf("the README's serve command is %q", serveCmd)
	}
	args := serveCmd[2:]
	base, args := flagValue(t, args, "--stripe-api-base")
	if base != "http://"+mockCmd[1] {
		t.Errorf("the README's serve asks Stripe at %s, but its stripe-mock listens on %s", base, mockCmd[1])
	}
	dataDir, args := flagValue(t, args, "--data-dir")
	var key string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "STRIPE_SECRET_KEY="); ok {
			key = v
		}
	}
	if dataDir != "vmshelf-data" || len(args) != 2 || args[0] != "--dev" || args[1] != "--vms-enable" ||
		len(env) != 1 || !strings.HasPrefix(key, "sk_test_") {
		t.Fatalf("the README's serve: env %q, flags %q, data dir %q; the test runs exactly STRIPE_SECRET_KEY=sk_test_… serve --dev --data-dir vmshelf-data --vms-enable --stripe-api-base",
			env, args, dataDir)
	}

	// The same serve on the test's ports, at a real stripe-mock; startServe
	// adds --dev and --data-dir itself.
	mock := stripetest.StartMock(t, mockBin)
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binPath, filepath.Join(work, "bin", "vmshelf")); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, filepath.Join(work, dataDir), []string{"--vms-enable", "--stripe-api-base", mock},
		append(append([]string{}, noStripeEnv...), env...)...)
	s.secret(key)

	// Block 2, literally.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", walk)
	cmd.Dir = work
	cmd.Env = cleanEnv(append(append([]string{}, noStripeEnv...), "CONTROL="+s.ctlBase)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README's market walk-through: %v\nstdout:\n%s\nstderr:\n%s\nserve:\n%s", err, stdout.String(), stderr.String(), s.logs())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("the walk-through printed %d lines, want the status and the cancel:\n%s", len(lines), stdout.String())
	}
	// The answers the walk-through keeps in variables went to stderr
	// (tee), the listing's first.
	kept := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var o orderAnswer
	decode(t, []byte(kept[len(kept)-1]), &o)
	if o.OrderID == "" || o.State != "awaitingPayment" || !strings.HasPrefix(o.CheckoutURL, "https://") || o.Total != 1800 || o.Currency != "eur" {
		t.Errorf("the walk-through's order answer %s; want awaitingPayment, an https checkout_url, 1800 eur", kept[len(kept)-1])
	}
	var st marketStatus
	if err := json.Unmarshal([]byte(lines[0]), &st); err != nil {
		t.Fatalf("the walk-through's status %q: %v", lines[0], err)
	}
	if lines[1] != "cancelled "+o.OrderID {
		t.Errorf("the walk-through's cancel printed %q, want cancelled %s", lines[1], o.OrderID)
	}
	after := marketStatusOf(t, s, &answers{}, s.token)
	if len(after.Orders) != 1 || after.Orders[0].State != "cancelled" || len(after.Offers) != 1 || after.Offers[0].Free != 5 {
		t.Errorf("after the walk-through's cancel: orders %+v, offers %+v; want the order cancelled and all 5 replicas free", after.Orders, after.Offers)
	}
	if !st.Available || len(st.Orders) != 1 || st.Orders[0].OrderID != o.OrderID || st.Orders[0].State != "awaitingPayment" ||
		st.Orders[0].CheckoutURL != o.CheckoutURL || st.Orders[0].Quantity != 3 || st.Orders[0].Host != "host" {
		t.Errorf("the walk-through's status %s; want the order awaitingPayment with its checkout_url", lines[0])
	}
	if len(st.Offers) != 1 || st.Offers[0].Free != 2 || st.Offers[0].UnitPrice != 600 {
		t.Errorf("the walk-through's offers %+v; want the host's listing at 600 with 2 free", st.Offers)
	}
}
