package market

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
)

// host creates a tenant that may host: in the mesh, sharing, hosting,
// with an appliance node and the Stripe account given.
func (e *env) host(name, account string) (imagestore.Tenant, string) {
	e.t.Helper()
	token := imagestore.NewSecret()
	e.remember(token)
	t, err := e.st.CreateTenant(e.t.Context(), imagestore.Tenant{Name: name, InMesh: true, Sharing: true,
		HostsVMs: true, Appliance: "node-" + name, StripeAccount: account}, imagestore.HashSecret(token))
	if err != nil {
		e.t.Fatalf("CreateTenant(%s): %v", name, err)
	}
	return t, token
}

// listing creates a listing through the route and returns its id.
func (e *env) listing(token string, price int64, capacity int) string {
	e.t.Helper()
	r := e.post("/market/vms/listings", token, fmt.Sprintf(`{"unit_price":%d,"capacity":%d}`, price, capacity))
	if r.status != http.StatusCreated {
		e.t.Fatalf("create listing: %d %s", r.status, r.body)
	}
	var l listingInfo
	decode(e.t, r, &l)
	return l.ListingID
}

// order places an order through the route.
func (e *env) order(token, listing string, quantity int, image, name, userData string) response {
	e.t.Helper()
	body := map[string]any{"listing_id": listing, "quantity": quantity, "image": image, "name": name}
	if userData != "" {
		body["user_data"] = userData
	}
	b, _ := json.Marshal(body)
	return e.post("/market/vms/orders", token, string(b))
}

// placed places an order that must succeed and returns its answer.
func (e *env) placed(token, listing string, quantity int) orderAnswer {
	e.t.Helper()
	r := e.order(token, listing, quantity, "debian-13", "web", "")
	if r.status != http.StatusCreated {
		e.t.Fatalf("order: %d %s", r.status, r.body)
	}
	var a orderAnswer
	decode(e.t, r, &a)
	return a
}

// statusOf is the tenant's status answer.
func (e *env) statusOf(token string) statusAnswer {
	e.t.Helper()
	r := e.post("/market/vms/status", token, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("status: %d %s", r.status, r.body)
	}
	var s statusAnswer
	decode(e.t, r, &s)
	return s
}

// storedOrder reads an order from the store.
func (e *env) storedOrder(id string) imagestore.Order {
	e.t.Helper()
	o, err := e.st.Order(e.t.Context(), id)
	if err != nil {
		e.t.Fatalf("Order(%s): %v", id, err)
	}
	return o
}

// storedListing reads a listing with its counts.
func (e *env) storedListing(id string) imagestore.Listing {
	e.t.Helper()
	l, err := e.st.Listing(e.t.Context(), id)
	if err != nil {
		e.t.Fatalf("Listing(%s): %v", id, err)
	}
	return l
}

// sessionOf is the fake Stripe's session of an order.
func (e *env) sessionOf(orderID string) string {
	e.t.Helper()
	id := e.storedOrder(orderID).CheckoutID
	if _, ok := e.stripe.Session(id); !ok {
		e.t.Fatalf("order %s: checkout %q is not a session the fake Stripe opened", orderID, id)
	}
	return id
}

// TestMachineAvailability: a tenant that does not share, an edge without
// --vms-enable and an edge without Stripe keys each refuse the machine
// actions with their reason, decided before the body is read (a body
// that is not even JSON gets the same answer), and status says the same.
func TestMachineAvailability(t *testing.T) {
	routes := []string{"/market/vms/listings", "/market/vms/listings/close", "/market/vms/orders"}
	for _, c := range []struct {
		name    string
		mod     func(*Config)
		sharing bool
		reason  string
		status  int
		// payment-free actions (closing a listing) are not refused for
		// the lack of Stripe keys.
		closeOK bool
	}{
		{"not sharing", nil, false, "notSharing", http.StatusConflict, false},
		{"vms off", func(c *Config) { c.VMsEnabled = false }, true, "notOffered", http.StatusConflict, false},
		{"not sharing wins over vms off", func(c *Config) { c.VMsEnabled = false }, false, "notSharing", http.StatusConflict, false},
		{"no stripe keys", func(c *Config) { c.Payments = nil }, true, "paymentsUnavailable", http.StatusServiceUnavailable, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mods []func(*Config)
			if c.mod != nil {
				mods = append(mods, c.mod)
			}
			e := newEnv(t, mods...)
			tn, token := e.host("box", "acct_1HostActive000001")
			if !c.sharing {
				tn.Sharing = false
				if err := e.st.UpdateTenant(t.Context(), tn); err != nil {
					t.Fatal(err)
				}
			}
			for _, route := range routes {
				r := e.post(route, token, `this is not JSON`)
				if route == "/market/vms/listings/close" && c.closeOK {
					wantError(t, r, http.StatusBadRequest, "badRequest") // past the gate, at the body
					continue
				}
				wantError(t, r, c.status, c.reason)
			}
			st := e.statusOf(token)
			if st.Available || st.Reason != c.reason {
				t.Errorf("status available=%v reason=%q, want false %q", st.Available, st.Reason, c.reason)
			}
			if n := e.stripe.Requests(); n != 0 {
				t.Errorf("Stripe was asked %d times by refused actions", n)
			}
		})
	}
	// /readyz stays 200 (uploads work) and names what the market lacks.
	for _, c := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no stripe key", func(c *Config) { c.Payments = nil }, "paymentsUnavailable"},
		{"no webhook secret", func(c *Config) { c.WebhookSecret = "" }, "webhookNotConfigured"},
		{"all set", func(*Config) {}, ""},
		{"vms off", func(c *Config) { c.VMsEnabled = false; c.Payments = nil }, ""},
	} {
		t.Run("readyz "+c.name, func(t *testing.T) {
			e := newEnv(t, c.mod)
			r := e.do(http.MethodGet, "/readyz", "", nil)
			var got readyAnswer
			decode(t, r, &got)
			if r.status != http.StatusOK || got.Status != "ok" || got.Machines != c.want {
				t.Errorf("/readyz %d %s, want 200 with machines %q", r.status, r.body, c.want)
			}
		})
	}
}

// TestCreateListing: every refusal of a listing and its reason, and a
// listing that is created shows in its host's status with all replicas
// free.
func TestCreateListing(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	for _, c := range []struct {
		name, body string
		status     int
		reason     string
	}{
		{"price under Stripe's minimum", `{"unit_price":49,"capacity":1}`, 422, "belowMinimumCharge"},
		{"price 0", `{"unit_price":0,"capacity":1}`, 400, "badRequest"},
		{"price over the ceiling", `{"unit_price":1000001,"capacity":1}`, 400, "badRequest"},
		{"no capacity", `{"unit_price":600,"capacity":0}`, 400, "badRequest"},
		{"capacity over 50", `{"unit_price":600,"capacity":51}`, 400, "badRequest"},
		{"price as text", `{"unit_price":"600","capacity":1}`, 400, "badRequest"},
		{"unknown field", `{"unit_price":600,"capacity":1,"fee":0}`, 400, "badRequest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.post("/market/vms/listings", host, c.body), c.status, c.reason)
		})
	}
	for _, c := range []struct {
		name   string
		edit   func(*imagestore.Tenant)
		reason string
	}{
		{"not in the mesh", func(t *imagestore.Tenant) { t.InMesh = false }, "notHosting"},
		{"not hosting", func(t *imagestore.Tenant) { t.HostsVMs = false }, "notHosting"},
		{"no appliance node", func(t *imagestore.Tenant) { t.Appliance = "" }, "notHosting"},
		{"no Stripe account", func(t *imagestore.Tenant) { t.StripeAccount = "" }, "noPayoutAccount"},
		{"transfers not active", func(t *imagestore.Tenant) { t.StripeAccount = "acct_1HostInactive0001" }, "noPayoutAccount"},
		{"account unknown to Stripe", func(t *imagestore.Tenant) { t.StripeAccount = "acct_1NoSuchAccount0001" }, "noPayoutAccount"},
		{"not an account id", func(t *imagestore.Tenant) { t.StripeAccount = "paypal:me" }, "noPayoutAccount"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tn, token := e.host("h-"+strings.ReplaceAll(c.name, " ", "-"), "acct_1HostActive000002")
			c.edit(&tn)
			if err := e.st.UpdateTenant(t.Context(), tn); err != nil {
				t.Fatal(err)
			}
			wantError(t, e.post("/market/vms/listings", token, `{"unit_price":600,"capacity":2}`), http.StatusConflict, c.reason)
			if ls, _ := e.st.Listings(t.Context(), tn.ID); len(ls) != 0 {
				t.Errorf("a refused listing was stored: %+v", ls)
			}
		})
	}
	t.Run("Stripe does not answer", func(t *testing.T) {
		tn, token := e.host("h-down", "acct_1HostActive000002")
		e.stripe.Down(1)
		r := e.post("/market/vms/listings", token, `{"unit_price":600,"capacity":2}`)
		wantError(t, r, http.StatusServiceUnavailable, "paymentsUnavailable")
		if r.header.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		if ls, _ := e.st.Listings(t.Context(), tn.ID); len(ls) != 0 {
			t.Errorf("could not ask Stripe, yet a listing was stored: %+v", ls)
		}
	})
	t.Run("created", func(t *testing.T) {
		id := e.listing(host, 600, 5)
		st := e.statusOf(host)
		if len(st.Listings) != 1 || st.Listings[0].ListingID != id || st.Listings[0].Free != 5 ||
			st.Listings[0].UnitPrice != 600 || st.Listings[0].Currency != "eur" || !st.Listings[0].Open {
			t.Errorf("host's listings %+v, want %s with 5 free at 600 eur", st.Listings, id)
		}
		if !dnsLabel.MatchString(id) {
			t.Errorf("listing id %q is not a DNS label", id)
		}
	})
	t.Run("at most 10 open", func(t *testing.T) {
		_, token := e.host("h-many", "acct_1HostActive000002")
		for range maxOpenListings {
			e.listing(token, 100, 1)
		}
		wantError(t, e.post("/market/vms/listings", token, `{"unit_price":100,"capacity":1}`), http.StatusConflict, "tooManyListings")
	})
}

// TestCloseListing: only the owner closes; a closed listing takes no
// order and is no offer any more; orders placed before go on.
func TestCloseListing(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "acct_1HostActive000002")
	id := e.listing(host, 600, 5)
	o := e.placed(buyer, id, 2)
	if st := e.statusOf(buyer); len(st.Offers) != 1 || st.Offers[0].ListingID != id || st.Offers[0].Host != "host" || st.Offers[0].Free != 3 {
		t.Fatalf("buyer's offers %+v, want %s by host with 3 free", st.Offers, id)
	}
	wantError(t, e.post("/market/vms/listings/close", buyer, `{"listing_id":"`+id+`"}`), http.StatusNotFound, "listingUnknown")
	wantError(t, e.post("/market/vms/listings/close", host, `{"listing_id":"lnosuchlisting00"}`), http.StatusNotFound, "listingUnknown")
	for range 2 { // closing twice is fine
		r := e.post("/market/vms/listings/close", host, `{"listing_id":"`+id+`"}`)
		var l listingInfo
		decode(t, r, &l)
		if r.status != http.StatusOK || l.Open || l.Free != 0 || l.Reserved != 2 {
			t.Fatalf("close: %d %s, want 200, closed, 0 free, 2 still reserved", r.status, r.body)
		}
	}
	if st := e.statusOf(buyer); len(st.Offers) != 0 {
		t.Errorf("a closed listing is still offered: %+v", st.Offers)
	}
	wantError(t, e.order(buyer, id, 1, "debian-13", "web", ""), http.StatusConflict, "noCapacity")
	if got := e.storedOrder(o.OrderID).State; got != imagestore.OrderAwaitingPayment {
		t.Errorf("the order placed before the close is %s, want it to go on", got)
	}
}

// TestOrderCheckout: the documented example, 6.00 EUR × 3, opens one Checkout
// Session that is a destination charge of 1800 with a fee of exactly
// 900 to the host's account, named by the order; the capacity is
// reserved while it is open.
func TestOrderCheckout(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "acct_1HostActive000002")
	id := e.listing(host, 600, 5)
	a := e.placed(buyer, id, 3)
	if !dnsLabel.MatchString(a.OrderID) || a.State != imagestore.OrderAwaitingPayment || a.Total != 1800 || a.Currency != "eur" {
		t.Errorf("order answer %+v, want a DNS-label id, awaitingPayment, 1800 eur", a)
	}
	sessions := e.stripe.Sessions()
	if len(sessions) != 1 {
		t.Fatalf("%d Checkout Sessions opened, want 1", len(sessions))
	}
	cs := sessions[0]
	f := cs.Form
	for k, want := range map[string]string{
		"mode":                                            "payment",
		"line_items[0][price_data][currency]":             "eur",
		"line_items[0][price_data][unit_amount]":          "600",
		"line_items[0][quantity]":                         "3",
		"payment_intent_data[application_fee_amount]":     "900",
		"payment_intent_data[transfer_data][destination]": "acct_1HostActive000001",
		"client_reference_id":                             a.OrderID,
		"metadata[order_id]":                              a.OrderID,
		"expires_at":                                      strconv.FormatInt(t0.Add(DefaultCheckoutTTL).Unix(), 10),
	} {
		if got := f.Get(k); got != want {
			t.Errorf("checkout form %s = %q, want %q", k, got, want)
		}
	}
	if cs.Idempotency != "vmshelf-checkout-"+a.OrderID {
		t.Errorf("Idempotency-Key %q, want one per order (%q)", cs.Idempotency, "vmshelf-checkout-"+a.OrderID)
	}
	for _, k := range []string{"success_url", "cancel_url"} {
		if u := f.Get(k); !strings.HasPrefix(u, "https://edge.example/machines?") || !strings.Contains(u, "order="+a.OrderID) {
			t.Errorf("%s %q does not lead back to the order on the return page", k, u)
		}
	}
	if a.CheckoutURL == "" || a.CheckoutURL != "https://checkout.stripe.test/c/pay/"+cs.ID {
		t.Errorf("checkout_url %q, want the session's URL", a.CheckoutURL)
	}
	if l := e.storedListing(id); l.Reserved != 3 || l.Free() != 2 {
		t.Errorf("listing after the order: reserved %d, free %d; want 3 and 2", l.Reserved, l.Free())
	}
	// An odd total: the platform's half is rounded down, the host gets
	// the cent (6.01 EUR: 300 and 301).
	odd := e.placed(buyer, e.listing(host, 601, 1), 1)
	if s, _ := e.stripe.Session(e.sessionOf(odd.OrderID)); s.Fee != 300 || s.UnitAmount*s.Quantity != 601 {
		t.Errorf("6.01 EUR checkout: fee %d of %d, want 300 of 601", s.Fee, s.UnitAmount*s.Quantity)
	}
	st := e.statusOf(buyer)
	if len(st.Orders) != 2 {
		t.Fatalf("buyer has %d orders, want 2", len(st.Orders))
	}
	// Both were placed at the test clock's one instant: pick the 6.00 × 3.
	if st.Orders[0].OrderID != a.OrderID {
		st.Orders[0], st.Orders[1] = st.Orders[1], st.Orders[0]
	}
	st.Orders = st.Orders[:1]
	if len(st.Orders) != 1 || st.Orders[0].OrderID != a.OrderID || st.Orders[0].CheckoutURL != a.CheckoutURL ||
		st.Orders[0].State != imagestore.OrderAwaitingPayment || st.Orders[0].Host != "host" || len(st.Orders[0].Replicas) != 0 ||
		st.Orders[0].Address != "vm-"+a.OrderID+".vms.example.org" || st.Orders[0].ExpiresAt != nil {
		t.Errorf("buyer's orders %+v", st.Orders)
	}
}

// TestOrderRefusals: every refusal of an order and its reason; none
// reaches Stripe or leaves a reservation.
func TestOrderRefusals(t *testing.T) {
	e := newEnv(t)
	hostT, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "acct_1HostActive000002")
	other, _ := e.host("other", "")
	id := e.listing(host, 600, 4)
	own := e.image(buyerT, "buyer's disk").UploadID
	foreign := e.image(other, "other's disk").UploadID
	noLoader := e.booting(buyerT, "a bare file system", false, "none").UploadID
	uefiOnly := e.booting(buyerT, "a GPT disk with an ESP", false, "uefi").UploadID
	biosOnly := e.booting(buyerT, "an MBR disk", true, "bios").UploadID
	_ = hostT
	big := "#cloud-config\n" + strings.Repeat("a", maxUserData)
	for _, c := range []struct {
		name                         string
		token, listing, image, label string
		quantity                     int
		userData                     string
		status                       int
		reason                       string
	}{
		{"quantity 0", buyer, id, "debian-13", "web", 0, "", 400, "badRequest"},
		{"quantity 11", buyer, id, "debian-13", "web", 11, "", 400, "badRequest"},
		{"name not a DNS label", buyer, id, "debian-13", "Web_1", 1, "", 400, "badRequest"},
		{"name too long", buyer, id, "debian-13", strings.Repeat("a", 64), 1, "", 400, "badRequest"},
		{"user data not cloud-init", buyer, id, "debian-13", "web", 1, "echo hi", 400, "badRequest"},
		{"user data over 16 KiB", buyer, id, "debian-13", "web", 1, big, 400, "badRequest"},
		{"unknown image", buyer, id, "windows-11", "web", 1, "", 404, "imageUnknown"},
		{"another box's image", buyer, id, foreign, "web", 1, "", 404, "imageUnknown"},
		{"unknown listing", buyer, "lnosuchlisting00", "debian-13", "web", 1, "", 404, "listingUnknown"},
		{"own listing", host, id, "debian-13", "web", 1, "", 409, "ownListing"},
		{"more than free", buyer, id, "debian-13", "web", 5, "", 409, "noCapacity"},
		{"an ISO without the console", buyer, id, "nixos-26-05", "web", 1, "", 409, "needsConsole"},
		{"an ISO without the console, with user data", buyer, id, "slackware-15", "web", 1, "#cloud-config\n", 409, "needsConsole"},
		{"an image with no boot loader", buyer, id, noLoader, "web", 1, "", 422, "noBootLoader"},
		{"a UEFI-only image without the EFI box", buyer, id, uefiOnly, "web", 1, "", 422, "wrongFirmware"},
		{"a BIOS-only image with the EFI box", buyer, id, biosOnly, "web", 1, "", 422, "wrongFirmware"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.order(c.token, c.listing, c.quantity, c.image, c.label, c.userData), c.status, c.reason)
		})
	}
	if n := e.stripe.Requests(); n != 1 { // the listing's account check only
		t.Errorf("Stripe was asked %d times, want 1 (the listing's account check)", n)
	}
	if l := e.storedListing(id); l.Reserved != 0 {
		t.Errorf("refused orders reserved %d replicas", l.Reserved)
	}
	t.Run("own image and a script", func(t *testing.T) {
		r := e.order(buyer, id, 1, own, "mine", "#!/bin/sh\necho hello\n")
		if r.status != http.StatusCreated {
			t.Fatalf("order of the buyer's own image: %d %s", r.status, r.body)
		}
		var a orderAnswer
		decode(t, r, &a)
		if o := e.storedOrder(a.OrderID); o.ImageKind != imagestore.ImageUpload || o.Image != own {
			t.Errorf("stored order image %s %s, want upload %s", o.ImageKind, o.Image, own)
		}
	})
	t.Run("at most 3 unpaid", func(t *testing.T) {
		for range maxUnpaidOrders - 1 { // one is already open from the subtest above
			e.placed(buyer, id, 1)
		}
		wantError(t, e.order(buyer, id, 1, "debian-13", "web", ""), http.StatusConflict, "tooManyUnpaidOrders")
	})
	t.Run("host stopped hosting", func(t *testing.T) {
		_, h2 := e.host("host2", "acct_1HostActive000001")
		id2 := e.listing(h2, 600, 4)
		h2t, _ := e.st.Tenant(t.Context(), "host2")
		h2t.HostsVMs = false
		if err := e.st.UpdateTenant(t.Context(), h2t); err != nil {
			t.Fatal(err)
		}
		_, b2 := e.host("buyer2", "")
		wantError(t, e.order(b2, id2, 1, "debian-13", "web", ""), http.StatusConflict, "notHosting")
		if st := e.statusOf(b2); len(st.Offers) != 1 || st.Offers[0].Host != "host" {
			t.Errorf("offers %+v: a host that stopped hosting is still offered", st.Offers)
		}
	})
}

// TestOrderStartableImages: an image whose disk starts with the firmware
// its EFI box chose is ordered; so is one stored before the boot check
// (its firmware unknown).
func TestOrderStartableImages(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "acct_1HostActive000002")
	id := e.listing(host, 600, 5)
	for _, c := range []struct {
		efi  bool
		boot string
	}{{false, "bios"}, {true, "uefi"}, {true, "bios+uefi"}} {
		img := e.booting(buyerT, "disk "+c.boot, c.efi, c.boot)
		if r := e.order(buyer, id, 1, img.UploadID, "web", ""); r.status != http.StatusCreated {
			t.Errorf("order of an image with efi %v and boot %q: %d %s", c.efi, c.boot, r.status, r.body)
		}
	}
	_, buyer2 := e.host("buyer2", "")
	b2, err := e.st.Tenant(t.Context(), "buyer2")
	if err != nil {
		t.Fatal(err)
	}
	for _, efi := range []bool{false, true} {
		img := e.booting(b2, fmt.Sprint("older disk ", efi), efi, "")
		if r := e.order(buyer2, id, 1, img.UploadID, "web", ""); r.status != http.StatusCreated {
			t.Errorf("order of an image stored before the boot check (efi %v): %d %s", efi, r.status, r.body)
		}
	}
}

// TestOrderCheckoutFails: when Stripe does not answer, the order is
// cancelled at once and its capacity is back; the buyer may retry.
func TestOrderCheckoutFails(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "")
	id := e.listing(host, 600, 2)
	e.stripe.Down(1)
	r := e.order(buyer, id, 2, "debian-13", "web", "")
	wantError(t, r, http.StatusServiceUnavailable, "paymentsUnavailable")
	if r.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	orders, err := e.st.Orders(t.Context(), buyerT.ID)
	if err != nil || len(orders) != 1 || orders[0].State != imagestore.OrderCancelled || orders[0].Reason != "checkoutFailed" {
		t.Fatalf("orders after a failed checkout: %+v, %v; want one cancelled (checkoutFailed)", orders, err)
	}
	if l := e.storedListing(id); l.Free() != 2 {
		t.Errorf("free %d after the failed checkout, want 2", l.Free())
	}
	e.placed(buyer, id, 2) // and the retry gets it
}

// feeBug hands the payment gate a checkout whose fee is one cent off, as
// a bug in the market would: the gate must refuse it before Stripe.
type feeBug struct{ billing.Payments }

func (p feeBug) CreateCheckout(ctx context.Context, c billing.Checkout) (billing.Session, error) {
	c.Fee++
	return p.Payments.CreateCheckout(ctx, c)
}

// TestGateRefusesWrongFee: a checkout with any fee but half the total is
// refused by the gate: no request reaches Stripe, the order is cancelled.
func TestGateRefusesWrongFee(t *testing.T) {
	var e *env
	e = newEnv(t, func(c *Config) { c.Payments = feeBug{c.Payments} })
	_, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "")
	id := e.listing(host, 600, 5)
	before := e.stripe.Requests()
	wantError(t, e.order(buyer, id, 3, "debian-13", "web", ""), http.StatusInternalServerError, "internal")
	if n := e.stripe.Requests() - before; n != 0 {
		t.Errorf("%d requests reached Stripe for a checkout with the wrong fee, want 0", n)
	}
	if orders, _ := e.st.Orders(t.Context(), buyerT.ID); len(orders) != 1 || orders[0].State != imagestore.OrderCancelled {
		t.Errorf("orders %+v, want the one cancelled", orders)
	}
	if !strings.Contains(e.logs.String(), "the fee is not exactly half the total") {
		t.Errorf("the gate's refusal is not in the log:\n%s", e.logs.String())
	}
}

// TestConcurrentOrdersNeverOversell: 50 buyers order 1..3 replicas of a
// listing of 7 at once; the replicas sold never exceed 7, every buyer that
// did not get them was told noCapacity, and one checkout was opened per
// successful order.
func TestConcurrentOrdersNeverOversell(t *testing.T) {
	const buyers, capacity = 50, 7
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	id := e.listing(host, 600, capacity)
	tokens := make([]string, buyers)
	for i := range tokens {
		_, tokens[i] = e.host(fmt.Sprintf("buyer%02d", i), "")
	}
	type result struct {
		quantity int
		r        response
	}
	results := make([]result, buyers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			q := 1 + i%3
			results[i] = result{q, e.order(tokens[i], id, q, "debian-13", "web", "")}
		}()
	}
	close(start)
	wg.Wait()
	sold, won := 0, 0
	for i, res := range results {
		switch res.r.status {
		case http.StatusCreated:
			sold += res.quantity
			won++
		case http.StatusConflict:
			wantError(t, res.r, http.StatusConflict, "noCapacity")
		default:
			t.Errorf("buyer %d: %d %s", i, res.r.status, res.r.body)
		}
	}
	l := e.storedListing(id)
	t.Logf("%d of %d buyers got %d replicas of %d", won, buyers, sold, capacity)
	if sold > capacity || l.Reserved != sold || l.Free() != capacity-sold {
		t.Errorf("sold %d of %d; listing reserved %d, free %d", sold, capacity, l.Reserved, l.Free())
	}
	if sold < capacity-2 { // the last 1..2 may be left when the remaining asks were bigger
		t.Errorf("only %d of %d sold: orders were refused that fit", sold, capacity)
	}
	if n := len(e.stripe.Sessions()); n != won {
		t.Errorf("%d checkouts opened for %d orders", n, won)
	}
}

// TestUserDataNeverShown: the user data is stored for the provisioner and
// appears in no answer, log line or metric.
func TestUserDataNeverShown(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "")
	id := e.listing(host, 600, 5)
	const marker = "user-data-marker-4f1d"
	ud := "#cloud-config\npassword: " + marker + "\n"
	r := e.order(buyer, id, 1, "debian-13", "web", ud)
	if r.status != http.StatusCreated {
		t.Fatalf("order: %d %s", r.status, r.body)
	}
	var a orderAnswer
	decode(t, r, &a)
	got, err := e.st.OrderUserData(t.Context(), a.OrderID)
	if err != nil || got != ud {
		t.Fatalf("stored user data %q, %v; want it as sent", got, err)
	}
	if err := e.stripe.Pay(e.sessionOf(a.OrderID)); err != nil {
		t.Fatal(err)
	}
	wh := e.event("evt_ud", eventCompleted, e.sessionOf(a.OrderID), e.clock.Now())
	seen := []string{string(r.body), string(e.post("/market/vms/status", buyer, "").body),
		string(e.post("/market/vms/status", host, "").body), string(wh.body), e.scrape(), e.logs.String()}
	for _, cs := range e.stripe.Sessions() {
		seen = append(seen, cs.Form.Encode())
	}
	for i, s := range seen {
		if strings.Contains(s, marker) {
			t.Errorf("the user data shows in place %d:\n%s", i, s)
		}
	}
}

// TestRemoveImageInUse: an image an order still needs is not removed
// (409 imageInUse, file kept); once the order is cancelled, it is.
func TestRemoveImageInUse(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	buyerT, buyer := e.host("buyer", "")
	id := e.listing(host, 600, 2)
	img := e.image(buyerT, "buyer's disk")
	r := e.order(buyer, id, 1, img.UploadID, "mine", "")
	if r.status != http.StatusCreated {
		t.Fatalf("order: %d %s", r.status, r.body)
	}
	var a orderAnswer
	decode(t, r, &a)
	wantError(t, e.post("/market/vm-images/remove", buyer, `{"upload_id":"`+img.UploadID+`"}`), http.StatusConflict, "imageInUse")
	if _, err := e.blobs.Open(t.Context(), img.UploadID); err != nil {
		t.Fatalf("the image file of an order in use is gone: %v", err)
	}
	if err := e.st.CancelOrder(t.Context(), a.OrderID, "test", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if r := e.post("/market/vm-images/remove", buyer, `{"upload_id":"`+img.UploadID+`"}`); r.status != http.StatusOK {
		t.Errorf("remove after the order ended: %d %s", r.status, r.body)
	}
}

// TestOrderInstallationISO: where the edge has the console, the catalogue's
// ISOs are offered and can be ordered, but never with user_data, which an
// installer would not run; without it they are listed as not offered
// (TestOrderRefusals has the needsConsole refusal).
func TestOrderInstallationISO(t *testing.T) {
	without := newEnv(t)
	r := without.do(http.MethodGet, "/market/vm-images", "", nil)
	if r.status != http.StatusOK || bytes.Contains(r.body, []byte(`"source":"iso"`)) ||
		!bytes.Contains(r.body, []byte(`{"name":"NixOS 26.05","reason":"`+catalogue.ReasonNeedsConsole+`"}`)) {
		t.Errorf("without the console the catalogue answers %d %s; want NixOS not offered for the console", r.status, r.body)
	}

	e := newEnv(t, func(c *Config) { c.ConsoleAvailable = true })
	r = e.do(http.MethodGet, "/market/vm-images", "", nil)
	if want := catalogue.Builtin().WithConsole(); r.status != http.StatusOK || !bytes.Equal(r.body, want.JSON()) ||
		!bytes.Contains(r.body, []byte(`"id":"nixos-26-05"`)) {
		t.Errorf("with the console the catalogue answers %d %s; want the ISOs offered", r.status, r.body)
	}
	_, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "acct_1HostActive000002")
	id := e.listing(host, 600, 4)
	for _, ud := range []string{"#cloud-config\n", "#!/bin/sh\necho hi\n"} {
		wantError(t, e.order(buyer, id, 1, "nixos-26-05", "web", ud), http.StatusUnprocessableEntity, "userDataNotForInstaller")
	}
	if l := e.storedListing(id); l.Reserved != 0 {
		t.Errorf("refused orders reserved %d replicas", l.Reserved)
	}
	r = e.order(buyer, id, 2, "nixos-26-05", "nix", "")
	if r.status != http.StatusCreated {
		t.Fatalf("ISO order without user data: %d %s", r.status, r.body)
	}
	var a orderAnswer
	decode(t, r, &a)
	if o := e.storedOrder(a.OrderID); o.ImageKind != imagestore.ImageCatalogue || o.Image != "nixos-26-05" {
		t.Errorf("stored order image %s %s, want catalogue nixos-26-05", o.ImageKind, o.Image)
	}
	// A cloud image keeps taking user data with the console on.
	if r := e.order(buyer, id, 1, "debian-13", "web", "#cloud-config\n"); r.status != http.StatusCreated {
		t.Errorf("cloud order with user data: %d %s", r.status, r.body)
	}
}
