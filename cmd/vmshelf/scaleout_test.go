package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// Serve over PostgreSQL (VMSHELF_STORE_URL) instead of the embedded
// SQLite file: the records live in the database, nothing in --data-dir
// but the images, and a restart finds everything again.

// TestE2EPostgresStore: tenant, ticket, upload, fetch-url and fetch all go
// through a real PostgreSQL 15; the URL's password reaches no log line.
func TestE2EPostgresStore(t *testing.T) {
	cluster := pgtest.Start(t)
	const password = "pw-9f3c51d2-never-logged"
	// The cluster trusts its socket, so any password is accepted: what
	// matters is that serve never repeats it.
	url := strings.Replace(cluster.NewDatabase(t), "postgres:///", "postgres://postgres:"+password+"@/", 1)
	env := []string{storeURLEnv + "=" + url}
	dir := filepath.Join(t.TempDir(), "data")
	s := startServe(t, dir, nil, env...)
	s.secret(password)
	if _, err := os.Stat(filepath.Join(dir, dbFile)); !os.IsNotExist(err) {
		t.Errorf("serve over PostgreSQL left %s in the data dir (stat: %v)", dbFile, err)
	}

	file, data := makeImage(t, t.TempDir(), "pg.qcow2")
	tk := s.ticket(t, "pg")
	img := s.upload(t, tk, file, data)
	u := s.fetchURL(t, img.UploadID)
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetched %d bytes, sha256 %s; want %d, %s", n, sum, len(data), sha256hex(data))
	}

	// The tenant CLI works on the same database.
	r := runCmd(t, env, binPath, "tenant", "add", "box2", "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("tenant add over PostgreSQL: exit %d: %s", r.code, r.stderr)
	}
	s.secret(strings.TrimSpace(r.stdout))
	r = runCmd(t, env, binPath, "tenant", "list", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "box2") || !strings.Contains(r.stdout, "dev") {
		t.Fatalf("tenant list over PostgreSQL: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}

	// A restart: the image is still recorded, its fetch URL still works.
	s.terminate(t)
	s2 := startServeAt(t, dir, s.dataAddr, s.ctlAddr, nil, env...)
	s2.secret(password)
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("after a restart: fetched %d bytes, sha256 %s; want %d, %s", n, sum, len(data), sha256hex(data))
	}
}

// TestE2EPostgresGoesAway: a database that stops while serve runs makes
// /readyz say so and every request that needs it fail as the store's
// failure (never as an unknown token or ticket), and nothing is lost:
// once it is back, the same token, ticket and image work again.
func TestE2EPostgresGoesAway(t *testing.T) {
	cluster := pgtest.Start(t)
	env := []string{storeURLEnv + "=" + cluster.NewDatabase(t)}
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil, env...)
	file, data := makeImage(t, t.TempDir(), "away.qcow2")
	img := s.upload(t, s.ticket(t, "before"), file, data)
	u := s.fetchURL(t, img.UploadID)
	tk := s.ticket(t, "after")

	cluster.Down(t)
	if code, body := s.readyz(t); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the database down: %d %s, want 503", code, body)
	}
	code, body := s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"down"}`)
	if code < 500 {
		t.Errorf("ticket with the database down: %d %s, want a 5xx (the store failed, the token is not unknown)", code, body)
	}
	// The fetch token may still be in the 1 s cache; after that the
	// store is asked, and cannot answer.
	if resp, err := http.Get(u); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode < 500 {
			t.Errorf("fetch with the database down: %d, want 200 (cached) or a 5xx, never 4xx", resp.StatusCode)
		}
	}
	if code, _ := curl(t, "-T", file, tk.UploadURL); code < 500 {
		t.Errorf("upload with the database down: %d, want a 5xx (the ticket is not unknown)", code)
	}

	cluster.Up(t)
	for range 200 { // the pool reconnects on the next request
		if code, _ := s.readyz(t); code == http.StatusOK {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := s.readyz(t); code != http.StatusOK {
		t.Fatalf("/readyz after the database came back: %d %s", code, body)
	}
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Errorf("fetch after the database came back: %d bytes, sha256 %s", n, sum)
	}
	s.upload(t, tk, file, data) // the ticket was not used up by the failed try
}

// TestE2EPostgresUnreachable: a store URL that cannot be reached stops
// serve at start with a clear line that never holds the password.
func TestE2EPostgresUnreachable(t *testing.T) {
	const password = "pw-0b7e-never-printed"
	url := "postgres://postgres:" + password + "@/vmshelf?host=" + t.TempDir() + "&connect_timeout=5"
	dir := filepath.Join(t.TempDir(), "data")
	r := runWithin(t, 30*time.Second, []string{storeURLEnv + "=" + url}, binPath,
		"serve", "--data-dir", dir, "--data-addr", freeAddr(t), "--control-addr", freeAddr(t))
	if r.code != 1 {
		t.Fatalf("serve with an unreachable store: exit %d, want 1; stderr:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Errorf("serve printed the store URL's password:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, storeURLEnv) {
		t.Errorf("the refusal does not name %s:\n%s", storeURLEnv, r.stderr)
	}
	r = runWithin(t, 30*time.Second, []string{storeURLEnv + "=postgres://u:" + password + "@[::1"}, binPath,
		"tenant", "list", "--data-dir", dir)
	if r.code == 0 || strings.Contains(r.stdout+r.stderr, password) || !strings.Contains(r.stderr, storeURLEnv) {
		t.Errorf("tenant list with a malformed store URL: exit %d, output:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// replicas are serve processes over one PostgreSQL database and one S3
// bucket, as a Deployment behind a load balancer runs them.
type replicas struct {
	env  []string // the store URL and the bucket's endpoint and keys
	args []string // --blobs and --blob-capacity-gib
	url  string   // the database
}

func newReplicas(t *testing.T) *replicas {
	t.Helper()
	cluster := pgtest.Start(t)
	bucket := s3test.StartServer(t)
	r := &replicas{url: cluster.NewDatabase(t)}
	r.env = []string{
		storeURLEnv + "=" + r.url,
		"AWS_ENDPOINT_URL=" + bucket.Config.Endpoint,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + string(bucket.Config.AccessKeyID),
		"AWS_SECRET_ACCESS_KEY=" + string(bucket.Config.SecretAccessKey),
	}
	r.args = []string{"--blobs", "s3://" + bucket.Config.Bucket + "/edge", "--blob-capacity-gib", "4"}
	return r
}

// start starts one more replica with a data dir of its own. The first
// one creates the dev tenant; the others get its token file, so that
// --dev keeps the token instead of rotating it.
func (r *replicas) start(t *testing.T, first *server) *server {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if first != nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, devToken), []byte(first.token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startServe(t, dir, r.args, r.env...)
	s.secret(strings.TrimPrefix(r.env[4], "AWS_SECRET_ACCESS_KEY="))
	return s
}

// on rewrites a URL that replica from handed out so that it goes to
// replica to, as a load balancer may send it.
func on(u string, from, to *server) string {
	return strings.Replace(u, from.dataBase, to.dataBase, 1)
}

// TestE2ETwoReplicas: a ticket issued by A is uploaded through B and
// fetched, whole and in ranges, from A and from B; one ticket raced on
// both is accepted once.
func TestE2ETwoReplicas(t *testing.T) {
	r := newReplicas(t)
	a := r.start(t, nil)
	b := r.start(t, a)
	if a.token != b.token {
		t.Fatalf("the replicas disagree on the dev token")
	}
	file, data := makeImage(t, t.TempDir(), "two.qcow2")

	tk := a.ticket(t, "two")
	viaB := tk
	viaB.UploadURL = on(tk.UploadURL, a, b)
	img := b.upload(t, viaB, file, data)

	u := a.fetchURL(t, img.UploadID)
	for _, s := range []*server{a, b} {
		fu := on(u, a, s)
		if n, sum := fetchAll(t, fu, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
			t.Fatalf("whole fetch from %s: %d bytes, sha256 %s; want %d, %s", s.dataAddr, n, sum, len(data), sha256hex(data))
		}
		for _, rg := range [][2]int{{0, 511}, {4096, 70000}, {len(data) - 100, len(data) - 1}} {
			got := fetchRange(t, fu, rg[0], rg[1])
			if !bytes.Equal(got, data[rg[0]:rg[1]+1]) {
				t.Errorf("range %d-%d from %s: %d bytes that differ from the file", rg[0], rg[1], s.dataAddr, len(got))
			}
		}
	}

	// The same validators from both: an ETag from one replica is good
	// for a conditional request to the other (CDI's importer may meet
	// either).
	etags := map[string]bool{}
	for _, s := range []*server{a, b} {
		resp, err := httpClient.Head(on(u, a, s))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		etags[resp.Header.Get("ETag")] = true
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Length") != strconv.Itoa(len(data)) {
			t.Errorf("HEAD on %s: %d, Content-Length %q", s.dataAddr, resp.StatusCode, resp.Header.Get("Content-Length"))
		}
	}
	if len(etags) != 1 || etags[""] {
		t.Fatalf("the replicas answer the ETags %v for one image, want one", etags)
	}
	var etag string
	for e := range etags {
		etag = e
	}
	req, err := http.NewRequest(http.MethodGet, on(u, a, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("If-None-Match", etag)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotModified {
		t.Errorf("GET on B with A's ETag in If-None-Match: %d, want 304", resp.StatusCode)
	}

	// One ticket, the same image sent to both at once: one 201.
	race := a.ticket(t, "race")
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for i, s := range []*server{a, b} {
		wg.Go(func() {
			codes[i], _ = curlStatus(t, "-T", file, on(race.UploadURL, a, s))
		})
	}
	wg.Wait()
	slices.Sort(codes)
	if codes[0] != http.StatusCreated || codes[1] != http.StatusGone {
		t.Errorf("one ticket raced on two replicas: %v, want one 201 and one 410", codes)
	}
}

// fetchRange GETs bytes first..last of u.
func fetchRange(t *testing.T, u string, first, last int) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", first, last))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %d-%d: %v", first, last, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("GET %d-%d: %d, %v", first, last, resp.StatusCode, err)
	}
	return body
}

// curlStatus runs curl and returns its status without failing on one:
// from a goroutine, so it reports trouble with t.Error.
func curlStatus(t *testing.T, args ...string) (int, string) {
	out := filepath.Join(t.TempDir(), "body")
	cmd := exec.Command("curl", append([]string{"-sS", "--max-time", "30", "-o", out, "-w", "%{http_code}"}, args...)...)
	cmd.Env = cleanEnv()
	b, err := cmd.Output()
	if err != nil {
		t.Errorf("curl %q: %v", args, err)
		return 0, ""
	}
	code, _ := strconv.Atoi(string(b))
	body, _ := os.ReadFile(out)
	return code, string(body)
}

// tusDo sends one tus request and returns its answer, the body read.
func tusDo(t *testing.T, method, url string, body io.Reader, length int64, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Tus-Resumable", "1.0.0")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// tusCreate opens a resumable upload of length bytes with the ticket and
// returns the session's URL.
func tusCreate(t *testing.T, s *server, tk ticketAnswer, length int) string {
	t.Helper()
	resp := tusDo(t, http.MethodPost, tk.UploadURL, nil, 0, "Upload-Length", strconv.Itoa(length))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("tus create: %d", resp.StatusCode)
	}
	sess := resp.Header.Get("Location")
	s.secret(sess[strings.LastIndexByte(sess, '/')+1:])
	return sess
}

// tusOffset is HEAD's Upload-Offset.
func tusOffset(t *testing.T, sess string) int {
	t.Helper()
	r := tusDo(t, http.MethodHead, sess, nil, 0)
	off, err := strconv.Atoi(r.Header.Get("Upload-Offset"))
	if r.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("HEAD %s: %d, Upload-Offset %q", sess, r.StatusCode, r.Header.Get("Upload-Offset"))
	}
	return off
}

// tusPatch sends data as the bytes at off.
func tusPatch(t *testing.T, sess string, off int, data []byte) *http.Response {
	t.Helper()
	return tusDo(t, http.MethodPatch, sess, bytes.NewReader(data), int64(len(data)),
		"Content-Type", "application/offset+octet-stream", "Upload-Offset", strconv.Itoa(off))
}

// TestE2ETusAcrossReplicas: a resumable upload created on A continues on
// B with the right SHA-256; then one whose replica is killed (-9) in the
// middle of a PATCH is finished on the other, which takes it over once
// the dead replica's lease has lapsed, having lost at most the part in
// flight.
func TestE2ETusAcrossReplicas(t *testing.T) {
	r := newReplicas(t)
	a := r.start(t, nil)
	b := r.start(t, a)

	t.Run("continued on another replica", func(t *testing.T) {
		_, img := makeImageData(t, t.TempDir(), "half.qcow2", 12)
		tk := a.ticket(t, "half")
		sess := tusCreate(t, a, tk, len(img))
		half := len(img) / 2
		if resp := tusPatch(t, sess, 0, img[:half]); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("first PATCH on A: %d", resp.StatusCode)
		}
		onB := on(sess, a, b)
		if off := tusOffset(t, onB); off != half {
			t.Fatalf("HEAD on B: offset %d, want %d", off, half)
		}
		if resp := tusPatch(t, onB, half, img[half:]); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("second PATCH on B: %d; B said:\n%s", resp.StatusCode, b.logs())
		}
		checkImage(t, a, b, tk.UploadID, img)
	})

	t.Run("replica killed mid-PATCH", func(t *testing.T) {
		// 20 MiB of data: the PATCH on A is stopped after 20 MiB, past
		// two part ends (8 MiB parts), so its progress is durable at
		// 16 MiB when it dies.
		_, img := makeImageData(t, t.TempDir(), "killed.qcow2", 40)
		tk := a.ticket(t, "killed")
		sess := tusCreate(t, a, tk, len(img))
		pr, pw := io.Pipe()
		go func() {
			req, _ := http.NewRequest(http.MethodPatch, sess, pr)
			req.ContentLength = int64(len(img))
			req.Header.Set("Tus-Resumable", "1.0.0")
			req.Header.Set("Content-Type", "application/offset+octet-stream")
			req.Header.Set("Upload-Offset", "0")
			if resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 60 * time.Second}).Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		defer pw.Close()
		const sent = 20 << 20
		if _, err := pw.Write(img[:sent]); err != nil {
			t.Fatal(err)
		}
		onB := on(sess, a, b)
		durable := 0
		for range 400 { // the checkpoint at 16 MiB, seen from B
			if durable = tusOffset(t, onB); durable >= 16<<20 {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		if durable != 16<<20 {
			t.Fatalf("offset seen from B while A holds 20 MiB: %d, want 16 MiB (the last part end)", durable)
		}
		// While A writes, B refuses to: one writer per upload.
		if resp := tusPatch(t, onB, durable, img[durable:]); resp.StatusCode != http.StatusLocked || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("PATCH on B while A writes: %d (Retry-After %q), want 423 with Retry-After",
				resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if resp := tusDo(t, http.MethodDelete, onB, nil, 0); resp.StatusCode != http.StatusLocked {
			t.Fatalf("DELETE on B while A writes: %d, want 423", resp.StatusCode)
		}
		a.kill()

		// B refuses (423, Retry-After) while A's lease runs, then takes
		// the upload over.
		var resp *http.Response
		for range 60 {
			off := tusOffset(t, onB)
			resp = tusPatch(t, onB, off, img[off:])
			if resp.StatusCode != http.StatusLocked {
				break
			}
			if resp.Header.Get("Retry-After") == "" {
				t.Fatal("423 without Retry-After")
			}
			time.Sleep(250 * time.Millisecond)
		}
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("PATCH on B after A was killed: %d", resp.StatusCode)
		}
		checkImage(t, b, b, tk.UploadID, img)
	})
}

// checkImage fetches image uploadID with a URL minter mints, through via,
// and compares it with img.
func checkImage(t *testing.T, minter, via *server, uploadID string, img []byte) {
	t.Helper()
	u := on(minter.fetchURL(t, uploadID), minter, via)
	if n, sum := fetchAll(t, u, 30*time.Second); n != int64(len(img)) || sum != sha256hex(img) {
		t.Fatalf("fetched %d bytes, sha256 %s; want %d, %s", n, sum, len(img), sha256hex(img))
	}
}

// TestE2EQuotaAcrossReplicas: ticket requests for one box sent to both
// replicas at once never take it past its image quota, and reach it.
func TestE2EQuotaAcrossReplicas(t *testing.T) {
	const quota, requests = 3, 16
	r := newReplicas(t)
	r.args = append(r.args, "--images-per-tenant", strconv.Itoa(quota), "--ticket-burst", "100")
	a := r.start(t, nil)
	b := r.start(t, a)
	codes := postTogether(t, []*server{a, b}, nil, "/market/vm-images/ticket", `{"name":"q"}`, requests)
	issued, refused := 0, 0
	for _, c := range codes {
		switch c {
		case http.StatusCreated:
			issued++
		case http.StatusConflict:
			refused++
		default:
			t.Errorf("ticket: %d, want 201 or 409 imageQuota", c)
		}
	}
	if issued != quota || refused != requests-quota {
		t.Errorf("%d tickets issued, %d refused by the quota of %d; want %d and %d", issued, refused, quota, quota, requests-quota)
	}
}

// TestE2ECapacityAcrossReplicas: orders for one listing sent to both
// replicas at once never book it past its capacity, and fill it.
func TestE2ECapacityAcrossReplicas(t *testing.T) {
	const capacity, orders = 5, 14
	key, whsec := stripeTestSecrets()
	const account = "acct_e2eScaleHost"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	r := newReplicas(t)
	r.env = append(append(r.env, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec))
	r.args = append(r.args, "--vms-enable", "--stripe-api-base", fake.URL)
	a := r.start(t, nil)
	b := r.start(t, a)
	for _, s := range []*server{a, b} {
		s.secret(key)
		s.secret(whsec)
	}
	host := tenantAddHost(t, r.env, a.dataDir, "host", account, a, b)
	code, body := a.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":`+strconv.Itoa(capacity)+`}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)

	// Seven buyers, two orders each: a buyer may have at most 3 orders
	// awaiting payment, a limit of its own this test is not about.
	var buyers []string
	for i := range 7 {
		res := runCmd(t, r.env, binPath, "tenant", "add", fmt.Sprintf("buyer%d", i), "--in-mesh", "--sharing", "--data-dir", a.dataDir)
		if res.code != 0 {
			t.Fatalf("tenant add buyer%d: exit %d: %s", i, res.code, res.stderr)
		}
		buyer := strings.TrimSpace(res.stdout)
		a.secret(buyer)
		b.secret(buyer)
		buyers = append(buyers, buyer)
	}
	order := `{"listing_id":"` + l.ListingID + `","quantity":1,"image":"debian-13","name":"web"}`
	codes := postTogether(t, []*server{a, b}, buyers, "/market/vms/orders", order, orders)
	booked, refused := 0, 0
	for _, c := range codes {
		switch c {
		case http.StatusCreated:
			booked++
		case http.StatusConflict:
			refused++
		default:
			t.Errorf("order: %d, want 201 or 409 noCapacity", c)
		}
	}
	if booked != capacity || refused != orders-capacity {
		t.Errorf("%d orders placed, %d refused on a listing of %d; want %d and %d", booked, refused, capacity, capacity, orders-capacity)
	}
	if n := len(fake.Sessions()); n != booked {
		t.Errorf("Stripe has %d checkouts for %d orders placed", n, booked)
	}
}

// TestE2EOneLeader: of two replicas the provisioner and the sweepers run
// on exactly one; killed (-9), it is replaced by the other within the
// leader lease's bound (TTL + TTL/3 = 20 s).
func TestE2EOneLeader(t *testing.T) {
	r := newReplicas(t)
	r.args = append(r.args, "--vms-enable")
	a := r.start(t, nil)
	b := r.start(t, a)
	gauge := func(s *server, name string) float64 {
		t.Helper()
		mf := s.scrape(t)[name]
		if mf == nil || len(mf.Metric) != 1 {
			t.Fatalf("%s: no single %s", s.ctlAddr, name)
		}
		if g := mf.Metric[0].GetGauge(); g != nil {
			return g.GetValue()
		}
		return mf.Metric[0].GetCounter().GetValue()
	}
	// A started first and leads at once; B asks every 5 s and is refused.
	if la, lb := gauge(a, "vmshelf_leader"), gauge(b, "vmshelf_leader"); la != 1 || lb != 0 {
		t.Fatalf("vmshelf_leader: A %v, B %v; want 1 and 0", la, lb)
	}
	if ra, rb := gauge(a, "vmshelf_reconcile_runs_total"), gauge(b, "vmshelf_reconcile_runs_total"); ra < 1 || rb != 0 {
		t.Fatalf("reconcile passes: A %v, B %v; want some on A and none on B", ra, rb)
	}
	a.kill()
	killed := time.Now()
	for gauge(b, "vmshelf_leader") != 1 {
		if time.Since(killed) > 25*time.Second {
			t.Fatalf("B does not lead %v after the leader was killed (bound 20 s)", time.Since(killed))
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(killed)
	for gauge(b, "vmshelf_reconcile_runs_total") < 1 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("B leads but ran no reconcile pass")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("B took over %v after A was killed", took.Round(100*time.Millisecond))
}

// postTogether sends n POSTs of body to path at once, in turn to each of
// the servers and as each of tokens (the dev tenant's if none), and
// returns the statuses. Tickets in the answers are noted as secrets.
func postTogether(t *testing.T, servers []*server, tokens []string, path, body string, n int) []int {
	t.Helper()
	codes := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		s := servers[i%len(servers)]
		token := s.token
		if len(tokens) > 0 {
			token = tokens[i%len(tokens)]
		}
		wg.Go(func() {
			<-start
			req, err := http.NewRequest(http.MethodPost, s.ctlBase+path, strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			var tk ticketAnswer
			_ = json.NewDecoder(resp.Body).Decode(&tk)
			resp.Body.Close()
			if tk.Ticket != "" {
				s.secret(tk.Ticket)
			}
			codes[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	return codes
}
