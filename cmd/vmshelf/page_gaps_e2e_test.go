package main

// More scenarios of the Machines page in headless Chromium (see
// page_e2e_test.go for the harness): polling and focus on the page's fake
// clock, the network down past every retry, size refusals in the browser,
// more files than transfer slots, the host's listing form, removing an
// image with its confirmation, and the page by keyboard alone.

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// pageMarket is serve with the machine market on against the fake Stripe,
// a host tenant with an active payout account and the dev tenant as
// buyer; args are more flags of serve.
type pageMarket struct {
	s     *server
	fake  *stripetest.Server
	whsec string
	host  string // the host's token
}

func startPageMarket(t *testing.T, args ...string) *pageMarket {
	t.Helper()
	key, whsec := stripeTestSecrets()
	const account = "acct_pageHost2"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fake.Close() })
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	ctl := freeAddr(t)
	s := startServeAt(t, filepath.Join(t.TempDir(), "data"), freeAddr(t), ctl, append([]string{"--vms-enable", "--stripe-api-base", fake.URL,
		"--checkout-return-url", "http://" + ctl + "/machines"}, args...), env...)
	s.secret(key)
	s.secret(whsec)
	return &pageMarket{s: s, fake: fake, whsec: whsec, host: addHost(t, s, "host", account)}
}

// listing makes a listing of the host through the API.
func (m *pageMarket) listing(t *testing.T, body string) listingAnswer {
	t.Helper()
	code, b := m.s.ctl(t, "/market/vms/listings", m.host, body)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, b)
	}
	var l listingAnswer
	decode(t, b, &l)
	return l
}

// TestPagePolling: with an order awaiting payment the page asks for status
// 15 s (of its clock) after the last answer and not before; focus and
// visibilitychange ask at once; with the order ended, a minute passes
// without a request.
func TestPagePolling(t *testing.T) {
	t.Parallel()
	browserDir(t)
	m := startPageMarket(t)
	s := m.s
	l := m.listing(t, `{"unit_price":600,"capacity":2}`)
	code, body := s.ctl(t, "/market/vms/orders", s.token, `{"listing_id":"`+l.ListingID+`","quantity":1,"image":"debian-13","name":"polled"}`)
	if code != http.StatusCreated {
		t.Fatalf("order: %d %s", code, body)
	}
	var o orderAnswer
	decode(t, body, &o)
	sessions := m.fake.Sessions()
	if len(sessions) != 1 || sessions[0].OrderID != o.OrderID {
		t.Fatalf("the fake Stripe has sessions %+v; want one of order %s", sessions, o.OrderID)
	}
	cs := sessions[0].ID

	pr := startPage(t, "poll", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_ORDER": o.OrderID,
	}, map[string]action{
		// Nobody paid: Stripe expires the checkout and says so.
		"expire": func([]byte) any {
			if err := m.fake.Expire(cs); err != nil {
				t.Fatal(err)
			}
			payload, sig, err := m.fake.Event("evt_page_expired", "checkout.session.expired", cs, m.whsec, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if code, body := postWebhook(t, s, payload, sig); code != http.StatusOK {
				t.Fatalf("webhook checkout.session.expired: %d %s", code, body)
			}
			return map[string]string{}
		},
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		BusyState  string  `json:"busyState"`
		By14       int     `json:"by14"`
		Polls      []int64 `json:"polls"`
		OnFocus    int     `json:"onFocus"`
		Visibility string  `json:"visibility"`
		OnVisible  int     `json:"onVisible"`
		EndedState string  `json:"endedState"`
		Idle60     int     `json:"idle60"`
	}
	pr.wait(&rep)
	if rep.BusyState != "awaitingPayment" {
		t.Fatalf("the order's row is %q, want awaitingPayment", rep.BusyState)
	}
	if rep.By14 != 0 {
		t.Errorf("%d status requests within 14 s of the last answer; want none before 15 s", rep.By14)
	}
	if len(rep.Polls) != 1 || rep.Polls[0] < 14900 || rep.Polls[0] > 15100 {
		t.Errorf("status was asked at %v ms after the last answer (page clock); want once, at 15 s", rep.Polls)
	}
	if rep.OnFocus != 1 || rep.Visibility != "visible" || rep.OnVisible != 1 {
		t.Errorf("on focus %d requests, on visibilitychange (%s) %d; want 1 each", rep.OnFocus, rep.Visibility, rep.OnVisible)
	}
	if rep.EndedState == "awaitingPayment" || rep.EndedState == "" {
		t.Fatalf("after the checkout expired the order's row is %q", rep.EndedState)
	}
	if rep.Idle60 != 0 {
		t.Errorf("with the order %s, the page asked for status %d times in 60 s; want none (nothing is on its way)", rep.EndedState, rep.Idle60)
	}
}

// TestPageUploadNetworkDown: the edge stops for good mid-upload; on the
// page's clock every retry delay passes; the row ends refused with reason
// network, in words, with Retry, never stuck uploading. Serve starts again
// on the same data dir and ports; Retry resumes the same session and the
// image is stored with the right SHA-256.
func TestPageUploadNetworkDown(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	data := filepath.Join(work, "data")
	p := startProxy(t, freeAddr(t))
	p.rate.Store(3 << 20)
	disk, b := randomQcow2(t, work, "offline.qcow2", 16)
	size := int64(len(b))
	s := startPageServe(t, data, p, nil)
	cur := s
	pr := startPage(t, "offline", 150*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk,
	}, map[string]action{
		"stop": func([]byte) any {
			p.refuse.Store(true)
			s.terminate(t)
			s.assertNoSecrets()
			return map[string]string{}
		},
		"start": func([]byte) any {
			cur = startServeAt(t, data, s.dataAddr, s.ctlAddr, []string{"--public-url", p.base()})
			p.refuse.Store(false)
			return map[string]string{}
		},
	})
	pr.extra = func() string { return cur.logs() }
	var rep struct {
		commonReport
		Mid         uploadRow  `json:"mid"`
		Jumps       int        `json:"jumps"`
		Stopped     uploadRow  `json:"stopped"`
		RetryButton bool       `json:"retryButton"`
		Done        uploadRow  `json:"done"`
		Listed      pageImages `json:"listed"`
	}
	pr.wait(&rep)
	for _, l := range p.sessionLocations() {
		noteSession(t, cur, l)
	}
	st := rep.Stopped
	if st.State != "refused" || st.Reason != "network" || !rep.RetryButton ||
		!strings.Contains(strings.ToLower(st.Status), "retry") || len(strings.Fields(st.Status)) < 6 {
		t.Errorf("with the edge gone the row is %+v, Retry shown %v; want refused, network, in words saying to retry, and a Retry button", st, rep.RetryButton)
	}
	if rep.Jumps < 3 {
		t.Errorf("the row gave up after %d jumps of the clock; want it to have retried a few times first", rep.Jumps)
	}
	// From the cut on, the row said it was retrying, and ended refused,
	// never resting at uploading.
	evs := rowEvents(rep.Events, filepath.Base(disk))
	retried := slices.ContainsFunc(evs, func(e pageEvent) bool { return e.State == "retrying" && e.Reason == "network" })
	if !retried {
		t.Errorf("the row never said it was retrying for the network: %+v", evs)
	}
	wantDone(t, rep.Done)
	if locs := p.sessionLocations(); len(locs) != 1 {
		t.Errorf("the edges created %d upload sessions, want 1: Retry started over", len(locs))
	}
	imgs := cur.status(t, cur.token).Images
	if len(imgs) != 1 {
		t.Fatalf("status lists %d images, want 1", len(imgs))
	}
	wantImage(t, cur, imgs[0].UploadID, b)
	wantListed(t, rep.Listed, disk, b, imgs[0].UploadID)
	if up := p.up.Load(); up > size+size/4 {
		t.Errorf("%d bytes reached the edge for %d: Retry did not resume", up, size)
	}
}

// TestPageSizeRefusals: a file over --upload-max-gib and a disk over
// --max-virtual-gib are refused in the browser, in words naming both
// sizes, before any ticket.
func TestPageSizeRefusals(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, []string{"--upload-max-gib", "0.01", "--max-virtual-gib", "1"})
	big, _ := randomQcow2(t, work, "too-big.qcow2", 12)
	virt := filepath.Join(work, "huge-disk.qcow2")
	if r := runCmd(t, nil, "qemu-img", "create", "-f", "qcow2", virt, "2G"); r.code != 0 {
		t.Fatalf("qemu-img create: %s", r.stderr)
	}
	issued := -1.0
	pr := startPage(t, "sizes", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_BIG": big, "PAGE_VIRT": virt,
	}, map[string]action{
		"tickets": func([]byte) any { issued = s.ticketsIssued(t); return map[string]float64{"issued": issued} },
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		TooLarge uploadRow `json:"tooLarge"`
		Virtual  uploadRow `json:"virtual"`
	}
	pr.wait(&rep)
	if issued != 0 {
		t.Errorf("%v tickets were issued for files the browser can tell are too large, want 0", issued)
	}
	for _, tc := range []struct {
		row    uploadRow
		reason string
		sizes  []string
	}{
		{rep.TooLarge, "tooLarge", []string{"12 MiB", "10 MiB"}},
		{rep.Virtual, "virtualSizeTooLarge", []string{"2.0 GiB", "1.0 GiB"}},
	} {
		ok := tc.row.State == "refused" && tc.row.Reason == tc.reason && tc.row.UploadID == ""
		for _, sz := range tc.sizes {
			ok = ok && strings.Contains(tc.row.Status, sz)
		}
		if !ok {
			t.Errorf("the row is %+v; want refused %s, no upload id, in words naming %q", tc.row, tc.reason, tc.sizes)
		}
	}
	if st := s.status(t, s.token); len(st.Images) != 0 {
		t.Errorf("status lists %d images, want none", len(st.Images))
	}
}

// TestPageMaxTransfers: three files chosen at once with --max-transfers 1:
// never two rows uploading at once, the others waiting, all three done.
func TestPageMaxTransfers(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	p.rate.Store(4 << 20)
	s := startPageServe(t, filepath.Join(work, "data"), p, []string{"--max-transfers", "1"})
	var files []string
	var bs [][]byte
	for _, n := range []string{"alpha.qcow2", "beta.qcow2", "gamma.qcow2"} {
		f, b := randomQcow2(t, work, n, 3)
		files, bs = append(files, f), append(bs, b)
	}
	pr := startPage(t, "transfers", 120*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
		"PAGE_FILE1": files[0], "PAGE_FILE2": files[1], "PAGE_FILE3": files[2],
	}, nil)
	pr.extra = s.logs
	var rep struct {
		commonReport
		Rows   []uploadRow `json:"rows"`
		Listed pageImages  `json:"listed"`
	}
	pr.wait(&rep)
	// Replay the recorded changes: how many rows were transferring after
	// each of the page's tasks (one scan of the recorder: a row ending and
	// the next one starting happen together), and did the others wait.
	now := map[string]string{}
	most, waited := 0, false
	count := func() {
		n, w := 0, 0
		for _, st := range now {
			switch st {
			case "uploading", "retrying":
				n++
			case "waiting":
				w++
			}
		}
		most = max(most, n)
		waited = waited || (n == 1 && w > 0)
	}
	batch := -1
	for _, e := range rep.Events {
		if e.Kind != "row" {
			continue
		}
		if e.Batch != batch {
			count()
			batch = e.Batch
		}
		now[e.File] = e.State
	}
	count()
	if most != 1 || !waited {
		t.Errorf("at most %d rows were uploading at once (others waiting meanwhile: %v); want 1 with the others waiting", most, waited)
	}
	if len(rep.Rows) != 3 {
		t.Fatalf("the report has %d rows, want 3", len(rep.Rows))
	}
	for i, r := range rep.Rows {
		wantDone(t, r)
		wantImage(t, s, r.UploadID, bs[i])
	}
	if len(rep.Listed.List) != 3 {
		t.Errorf("the page lists %d images, want 3", len(rep.Listed.List))
	}
}

// TestPageListing: the host lists 3 replicas at "7.50" on the page; status
// says 750 × 3, the buyer sees the offer; Close on the page takes it out
// of the offers.
func TestPageListing(t *testing.T) {
	t.Parallel()
	browserDir(t)
	m := startPageMarket(t)
	s := m.s
	offered := func(id string) bool {
		return slices.ContainsFunc(marketStatusOf(t, s, &answers{}, s.token).Offers, func(o struct {
			ListingID string `json:"listing_id"`
			Host      string `json:"host"`
			UnitPrice int64  `json:"unit_price"`
			Free      int    `json:"free"`
		}) bool {
			return o.ListingID == id
		})
	}
	var atEdge listingAnswer
	var offeredAfterClose, offeredBefore bool
	var hostAfter []listingAnswer
	pr := startPage(t, "listing", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": m.host,
	}, map[string]action{
		"listed": func(body []byte) any {
			var req struct {
				ListingID string `json:"listing_id"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			for _, l := range marketStatusOf(t, s, &answers{}, m.host).Listings {
				if l.ListingID == req.ListingID {
					atEdge = l
				}
			}
			offeredBefore = offered(req.ListingID)
			return map[string]bool{"found": atEdge.ListingID != ""}
		},
		"closed": func(body []byte) any {
			var req struct {
				ListingID string `json:"listing_id"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			offeredAfterClose = offered(req.ListingID)
			hostAfter = marketStatusOf(t, s, &answers{}, m.host).Listings
			return map[string]bool{"offered": offeredAfterClose}
		},
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		FormVisible bool `json:"formVisible"`
		Fee         struct {
			Text, Receive        string
			Visible, DescribedBy bool
		} `json:"fee"`
		Listed []struct {
			ID          string `json:"id"`
			Open        string `json:"open"`
			Text        string `json:"text"`
			CloseButton bool   `json:"closeButton"`
		} `json:"listed"`
		Result string `json:"result"`
		After  *struct {
			Open        string `json:"open"`
			CloseButton bool   `json:"closeButton"`
		} `json:"after"`
		LayoutListed pageLayout `json:"layoutListed"`
	}
	pr.wait(&rep)
	rep.LayoutListed.above(t, "a host with an open listing", "listings", "images")
	rep.LayoutListed.above(t, "a host with an open listing", "listings", "order")
	if !rep.FormVisible {
		t.Error("#listing-form is hidden for a host with a payout account")
	}
	// 7.50 a replica-month: the platform's fee is half, the host gets 3.75.
	if f := rep.Fee; !f.Visible || !f.DescribedBy || f.Receive != "375" || !strings.Contains(f.Text, "Half of each sale goes to the platform") ||
		!regexp.MustCompile(`you receive \D*3\.75\D* per replica-month`).MatchString(f.Text) {
		t.Errorf("under the price 7.50 the listing form says %+v; want that half goes to the platform and the host receives 3.75 per replica-month", f)
	}
	if atEdge.UnitPrice != 750 || atEdge.Capacity != 3 || !atEdge.Open {
		t.Errorf("status has the listing %+v; want unit_price 750, capacity 3, open", atEdge)
	}
	if l := rep.Listed; len(l) != 1 || l[0].ID != atEdge.ListingID || !strings.Contains(l[0].Text, "7.50") || !l[0].CloseButton {
		t.Errorf("#listing-list shows %+v; want listing %s at 7.50 with a Close button", l, atEdge.ListingID)
	}
	if !offeredBefore {
		t.Error("the open listing is not among the buyer's offers")
	}
	if offeredAfterClose {
		t.Error("after Close on the page the listing is still offered")
	}
	for _, l := range hostAfter {
		if l.ListingID == atEdge.ListingID && l.Open {
			t.Errorf("after Close the host's status has the listing open: %+v", l)
		}
	}
	if rep.After != nil && (rep.After.Open != "false" || rep.After.CloseButton) {
		t.Errorf("after Close the page shows the listing %+v; want it closed, without Close", rep.After)
	}
}

// TestPageRemoveImage: the first press of Remove removes nothing and asks
// ("Remove for good", Keep); Keep puts Remove back; Remove then "Remove for
// good" removes the image from status and its file from the data dir.
func TestPageRemoveImage(t *testing.T) {
	t.Parallel()
	browserDir(t)
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, nil)
	disk, b := makeImage(t, work, "doomed.qcow2")
	img := s.upload(t, s.ticket(t, "doomed"), disk, b)
	stored := filepath.Join(s.dataDir, "vm-images", img.UploadID+".qcow2")
	present := func() map[string]bool {
		listed := slices.ContainsFunc(s.status(t, s.token).Images, func(i imageAnswer) bool { return i.UploadID == img.UploadID })
		_, err := os.Stat(stored)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return map[string]bool{"listed": listed, "file": err == nil}
	}
	if p := present(); !p["listed"] || !p["file"] {
		t.Fatalf("before the page: %v; want the image listed and its file at %s", p, stored)
	}
	pr := startPage(t, "remove", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
	}, map[string]action{"present": func([]byte) any { return present() }})
	pr.extra = s.logs
	type button struct {
		Class    string `json:"class"`
		Text     string `json:"text"`
		Disabled bool   `json:"disabled"`
	}
	var rep struct {
		commonReport
		Asked        []button        `json:"asked"`
		AskedMessage string          `json:"askedMessage"`
		AfterFirst   map[string]bool `json:"afterFirst"`
		Kept         []button        `json:"kept"`
		KeptFocus    string          `json:"keptFocus"`
		AfterKeep    map[string]bool `json:"afterKeep"`
		After        pageImages      `json:"after"`
		Message      string          `json:"message"`
	}
	pr.wait(&rep)
	has := func(bs []button, class, text string) bool {
		return slices.ContainsFunc(bs, func(x button) bool { return x.Class == class && x.Text == text })
	}
	if !rep.AfterFirst["listed"] || !rep.AfterFirst["file"] {
		t.Errorf("after the first press of Remove the edge has %v; want the image kept until confirmed", rep.AfterFirst)
	}
	if !has(rep.Asked, "image-remove", "Remove for good") || !has(rep.Asked, "image-keep", "Keep") || rep.AskedMessage == "" {
		t.Errorf("after the first press the buttons are %+v (message %q); want Remove for good and Keep, and a word why", rep.Asked, rep.AskedMessage)
	}
	if !has(rep.Kept, "image-remove", "Remove") || has(rep.Kept, "image-keep", "Keep") || rep.KeptFocus != "image-remove" {
		t.Errorf("after Keep the buttons are %+v, focus on %q; want Remove alone, focused", rep.Kept, rep.KeptFocus)
	}
	if !rep.AfterKeep["listed"] || !rep.AfterKeep["file"] {
		t.Errorf("after Keep the edge has %v; want the image", rep.AfterKeep)
	}
	if p := present(); p["listed"] || p["file"] {
		t.Errorf("after Remove for good the edge has %v; want the image gone from status and disk", p)
	}
	if len(rep.After.List) != 0 {
		t.Errorf("after Remove for good the page lists %+v", rep.After.List)
	}
}

// TestPageKeyboard: Tab reaches the token field of a fresh page, Enter
// signs in, Tab reaches the upload controls, Refresh and Forget token,
// and Enter on Forget token clears sessionStorage and hides the forms.
func TestPageKeyboard(t *testing.T) {
	t.Parallel()
	browserDir(t)
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, nil)
	pr := startPage(t, "keyboard", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
	}, nil)
	pr.extra = s.logs
	var rep struct {
		commonReport
		ToToken          []string          `json:"toToken"`
		SignedIn         []string          `json:"signedIn"`
		AfterSignIn      string            `json:"afterSignIn"`
		Order            []string          `json:"order"`
		Forgotten        map[string]string `json:"forgotten"`
		Visible          map[string]bool   `json:"visible"`
		FocusAfterForget string            `json:"focusAfterForget"`
		Message          string            `json:"message"`
	}
	pr.wait(&rep)
	if len(rep.ToToken) > 3 {
		t.Errorf("%d presses of Tab to reach the token field (%q); want at most 3", len(rep.ToToken), rep.ToToken)
	}
	if !slices.Contains(rep.SignedIn, "vmshelf.token") {
		t.Errorf("after Enter sessionStorage has %q; want vmshelf.token", rep.SignedIn)
	}
	for _, id := range []string{"#upload-file", "#upload-efi", "#upload-start", "#refresh", "#token-forget"} {
		if !slices.Contains(rep.Order, id) {
			t.Errorf("Tab never reached %s; it went %q", id, rep.Order)
		}
	}
	if i, j := slices.Index(rep.Order, "#upload-file"), slices.Index(rep.Order, "#upload-start"); i < 0 || j < i {
		t.Errorf("Tab reaches the file input at %d and Upload at %d; want the file first", i, j)
	}
	if _, ok := rep.Forgotten["vmshelf.token"]; ok || len(rep.Forgotten) != 0 {
		t.Errorf("after Forget token sessionStorage still has keys %d", len(rep.Forgotten))
	}
	if !rep.Visible["token"] || rep.Visible["app"] || rep.Visible["upload-file"] || rep.Visible["order-form"] || rep.Visible["token-forget"] {
		t.Errorf("after Forget token the page shows %v; want the token field only", rep.Visible)
	}
	if !strings.Contains(rep.Message, "forgotten") {
		t.Errorf("after Forget token, and a status answer that came back after it, the message is %q; want the token forgotten", rep.Message)
	}
	if rep.FocusAfterForget != "#token" {
		t.Errorf("after Forget token the focus is on %q, want #token", rep.FocusAfterForget)
	}
}

// statusQueue is what status says holds places of the quota besides
// images: unfinished uploads and unused tickets.
type statusQueue struct {
	Sessions []json.RawMessage `json:"sessions"`
	Tickets  []struct {
		UploadID  string    `json:"upload_id"`
		Name      string    `json:"name"`
		EFI       bool      `json:"efi"`
		ExpiresAt time.Time `json:"expires_at"`
	} `json:"tickets"`
}

func queueOf(t *testing.T, s *server) statusQueue {
	t.Helper()
	code, body := s.ctl(t, "/market/vms/status", s.token, "")
	if code != http.StatusOK {
		t.Fatalf("status: %d %s", code, body)
	}
	var q statusQueue
	if err := json.Unmarshal(body, &q); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	return q
}

// TestPageDismiss: a row the edge refused mid-upload (507 noSpace, which
// Retry may get past) keeps its session; Dismiss, reached by Tab and
// pressed with Enter, removes the row, this browser's localStorage entry
// of the session and the session on the edge, and a reload brings nothing
// of it back.
func TestPageDismiss(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, nil)
	file, _ := randomQcow2(t, work, "full-disk.qcow2", 2)
	pr := startPage(t, "dismiss", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": file,
	}, map[string]action{
		"sessions": func([]byte) any { return map[string]int{"sessions": len(queueOf(t, s).Sessions)} },
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		Refused         uploadRow      `json:"refused"`
		Buttons         []string       `json:"buttons"`
		StoreBefore     pageStorage    `json:"storeBefore"`
		EdgeBefore      map[string]int `json:"edgeBefore"`
		Tabs            int            `json:"tabs"`
		StoreAfter      pageStorage    `json:"storeAfter"`
		EdgeAfter       map[string]int `json:"edgeAfter"`
		RowsAfterReload int            `json:"rowsAfterReload"`
	}
	pr.wait(&rep)
	tusKeys := func(st pageStorage) []string {
		var keys []string
		for k := range st.Local {
			if strings.HasPrefix(k, "tus::") {
				keys = append(keys, k)
			}
		}
		return keys
	}
	if rep.Refused.Reason != "noSpace" || rep.Refused.UploadID == "" || !slices.Contains(rep.Buttons, "upload-dismiss") || !slices.Contains(rep.Buttons, "upload-retry") {
		t.Fatalf("the refused row is %+v with buttons %q; want noSpace, its upload id, Retry and Dismiss", rep.Refused, rep.Buttons)
	}
	if len(tusKeys(rep.StoreBefore)) != 1 || rep.EdgeBefore["sessions"] != 1 {
		t.Fatalf("before Dismiss localStorage has %q and the edge %v sessions; want the one session in both", tusKeys(rep.StoreBefore), rep.EdgeBefore)
	}
	if k := tusKeys(rep.StoreAfter); len(k) != 0 {
		t.Errorf("after Dismiss localStorage still has %q", k)
	}
	if rep.EdgeAfter["sessions"] != 0 {
		t.Errorf("after Dismiss the edge holds %v sessions; want the dismissed one ended", rep.EdgeAfter)
	}
	if rep.RowsAfterReload != 0 {
		t.Errorf("after Dismiss and a reload the page shows %d upload rows", rep.RowsAfterReload)
	}
}

// TestPageTickets: an image and an unused ticket fill a quota of 2. The
// page counts the ticket, closes the file input with a sentence naming
// both ways out, lists the ticket with its name and its expiry in UTC
// (in a browser far from UTC); Cancel, reached by Tab, cancels it at the
// edge (an upload with it is refused) and opens the file input again.
func TestPageTickets(t *testing.T) {
	t.Parallel()
	browserDir(t)
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, []string{"--images-per-tenant", "2"})
	disk, b := makeImage(t, work, "kept.qcow2")
	s.upload(t, s.ticket(t, "kept"), disk, b)
	tk := s.ticket(t, "later")
	var left statusQueue
	pr := startPage(t, "tickets", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_TICKET": tk.UploadID,
	}, map[string]action{
		"tickets": func([]byte) any {
			left = queueOf(t, s)
			return map[string]int{"tickets": len(left.Tickets)}
		},
	})
	pr.extra = s.logs
	type form struct {
		InputDisabled bool   `json:"inputDisabled"`
		Sentence      string `json:"sentence"`
	}
	var rep struct {
		commonReport
		Before struct {
			Images pageImages `json:"images"`
			Form   form       `json:"form"`
			Ticket struct {
				Text    string `json:"text"`
				Expires string `json:"expires"`
			} `json:"ticket"`
		} `json:"before"`
		Tabs  int `json:"tabs"`
		After struct {
			Images  pageImages `json:"images"`
			Form    form       `json:"form"`
			Message string     `json:"message"`
		} `json:"after"`
	}
	pr.wait(&rep)
	bf := rep.Before
	// qemu-img's empty disk: the edge read no boot loader in it, and the
	// page says so on the image before anybody orders a machine of it.
	if l := bf.Images.List; len(l) != 1 || !strings.Contains(l[0].Boot, "no boot loader") {
		t.Errorf("the image list is %+v; want the empty disk with a notice that it has no boot loader", l)
	}
	if q := bf.Images.Quota; q == nil || q.Used != "2" || q.Limit != "2" || !strings.Contains(q.Text, "ticket") {
		t.Errorf("#image-quota is %+v; want 2 of 2, counting the unused ticket", bf.Images.Quota)
	}
	if !bf.Form.InputDisabled || !strings.Contains(bf.Form.Sentence, "cancel an unused ticket") || !strings.Contains(bf.Form.Sentence, "remove an image") {
		t.Errorf("at 2 of 2 (an image and a ticket) the upload form is %+v; want the input disabled and a sentence: remove an image or cancel an unused ticket", bf.Form)
	}
	if want := pageUTC(tk.ExpiresAt); bf.Ticket.Expires != want || !strings.Contains(bf.Ticket.Text, "later") {
		t.Errorf("the ticket's row reads %+v; want its name (later) and its expiry %q", bf.Ticket, want)
	}
	if rep.Tabs == 0 || len(left.Tickets) != 0 {
		t.Errorf("after Enter on Cancel (reached with %d Tabs) status has tickets %+v; want none", rep.Tabs, left.Tickets)
	}
	if q := rep.After.Images.Quota; rep.After.Form.InputDisabled || q == nil || q.Used != "1" || rep.After.Message == "" {
		t.Errorf("after the cancel the form is %+v, the quota %+v, the message %q; want the input open, 1 of 2, a word", rep.After.Form, q, rep.After.Message)
	}
	code, body := curl(t, "-T", disk, tk.UploadURL)
	wantError(t, "an upload with the cancelled ticket", code, body, http.StatusGone, "ticketUsed")
}
