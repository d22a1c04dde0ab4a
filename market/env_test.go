package market

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// The tests run the control plane over the real sqlite store and blobfs in
// a temp dir, behind a real HTTP server, paying through the real
// billing.Stripe against a fake Stripe on loopback (stripetest): what they
// check is what a client sees, what Stripe was asked, and what the store
// ends up holding.

// The fake Stripe's secrets; neither may reach a log line.
const (
	stripeKey     = "sk_test_51MarketTestKey00000000000000000000"
	webhookSecret = "whsec_markettestsecret000000000000"
)

// stripeAccounts are the Connect accounts the fake Stripe knows, by the
// state of their transfers capability.
var stripeAccounts = map[string]string{
	"acct_1HostActive000001": "active",
	"acct_1HostActive000002": "active",
	"acct_1HostInactive0001": "inactive",
}

const publicURL = "http://127.0.0.1:8480"

// clientTimeout bounds every request a test sends: the answers are local
// and small, so this is far beyond what a loaded machine needs.
const clientTimeout = 30 * time.Second

// t0 is the test clock's start; a fixed instant makes expiry checks exact.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock is the market's time, moved by the test.
type clock = fakeclock.Still

// syncBuffer collects log output from concurrent handlers.
type syncBuffer = syncbuf.Buffer

type env struct {
	t       *testing.T
	cfg     Config
	srv     *Server
	ts      *httptest.Server
	st      *sqlite.Store
	blobs   *blobfs.FS
	dbPath  string
	blobDir string
	clock   *clock
	logs    *syncBuffer
	// stripe is the fake Stripe the market's billing.Stripe talks to;
	// reg the registry of both.
	stripe *stripetest.Server
	reg    *prometheus.Registry
	// secrets are every token and ticket the test saw; at the end none of
	// them may appear in the log.
	mu      sync.Mutex
	secrets []string
}

// newEnv starts a control plane with a fresh store. mod may change the
// config before New.
func newEnv(t *testing.T, mod ...func(*Config)) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dbPath: filepath.Join(dir, "vmshelf.db"), blobDir: filepath.Join(dir, "vm-images"),
		clock: fakeclock.NewStill(t0), logs: &syncBuffer{}}
	var err error
	if e.st, err = sqlite.Open(t.Context(), e.dbPath); err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = e.st.Close() }) // a test may have closed it already
	if e.blobs, err = blobfs.Open(e.blobDir); err != nil {
		t.Fatalf("blobfs.Open: %v", err)
	}
	if e.stripe, err = stripetest.New(stripeKey, stripeAccounts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stripe.Close() })
	e.remember(stripeKey)
	e.remember(webhookSecret)
	e.reg = prometheus.NewRegistry()
	payments, err := billing.NewStripe(billing.StripeConfig{SecretKey: stripeKey, APIBase: e.stripe.URL,
		Timeout: 10 * time.Second, Metrics: e.reg, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = Config{
		PublicURL:         publicURL + "/", // the trailing slash must be dropped
		TicketTTL:         time.Hour,
		ImagesPerTenant:   3,
		VMsEnabled:        true,
		Headroom:          1 << 20, // independent of the build machine's free disk
		Now:               e.clock.Now,
		Log:               slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Payments:          payments,
		WebhookSecret:     webhookSecret,
		Currency:          "eur",
		CheckoutReturnURL: "https://edge.example/machines",
		VMsDomain:         "vms.example.org",
	}
	for _, m := range mod {
		m(&e.cfg)
	}
	reg := e.reg
	if e.srv, err = New(e.cfg, e.st, e.blobs, reg, reg); err != nil {
		t.Fatalf("New: %v", err)
	}
	e.ts = httptest.NewServer(e.srv.Handler())
	t.Cleanup(e.ts.Close)
	// A hung handler fails the request, and the test names it (send),
	// instead of hanging the package until go test's own timeout.
	e.ts.Client().Timeout = clientTimeout
	t.Cleanup(func() {
		logs := e.logs.String()
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, s := range e.secrets {
			if strings.Contains(logs, s) {
				t.Errorf("a secret appears in the log:\n%s", logs)
			}
		}
	})
	return e
}

func (e *env) remember(secret string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.secrets = append(e.secrets, secret)
}

// tenant creates a tenant and returns it with its bearer token.
func (e *env) tenant(name string, sharing bool) (imagestore.Tenant, string) {
	e.t.Helper()
	token := imagestore.NewSecret()
	e.remember(token)
	t, err := e.st.CreateTenant(e.t.Context(), imagestore.Tenant{Name: name, InMesh: true, Sharing: sharing},
		imagestore.HashSecret(token))
	if err != nil {
		e.t.Fatalf("CreateTenant(%s): %v", name, err)
	}
	return t, token
}

// image stores an image for t the way the data plane does: file committed
// first, record second. Its firmware is unknown (Boot ""), as an image
// stored before the boot check; booting sets EFI and Boot.
func (e *env) image(t imagestore.Tenant, content string) imagestore.Image {
	e.t.Helper()
	return e.booting(t, content, false, "")
}

// booting stores an image whose EFI box and boot check's verdict are efi
// and boot.
func (e *env) booting(t imagestore.Tenant, content string, efi bool, boot string) imagestore.Image {
	e.t.Helper()
	ctx := e.t.Context()
	id := imagestore.NewUploadID()
	w, err := e.blobs.Create(ctx, id)
	if err != nil {
		e.t.Fatalf("blobs.Create: %v", err)
	}
	if _, err := io.WriteString(w, content); err != nil {
		e.t.Fatalf("blob write: %v", err)
	}
	if err := w.Commit(ctx); err != nil {
		e.t.Fatalf("blob commit: %v", err)
	}
	sum := sha256.Sum256([]byte(content))
	img := imagestore.Image{UploadID: id, TenantID: t.ID, Name: "disk " + id[:4], Size: int64(len(content)),
		VirtualSize: 1 << 30, SHA256: hex.EncodeToString(sum[:]), CreatedAt: e.clock.Now(), EFI: efi, Boot: boot}
	if err := e.st.AddImage(ctx, img, 0); err != nil {
		e.t.Fatalf("AddImage: %v", err)
	}
	return img
}

// response is what a client got.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request. token "" sends no Authorization header.
func (e *env) do(method, path, token string, body io.Reader) response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.ts.URL+path, body)
	if err != nil {
		e.t.Fatalf("NewRequest: %v", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return e.send(req)
}

func (e *env) send(req *http.Request) response {
	e.t.Helper()
	return e.sendWith(e.ts.Client(), req)
}

// sendWith sends req through client and reads the whole answer.
func (e *env) sendWith(client *http.Client, req *http.Request) response {
	e.t.Helper()
	res, err := client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("reading answer: %v", err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// post sends a JSON body (a string, as a client would type it).
func (e *env) post(path, token, body string) response {
	e.t.Helper()
	return e.do(http.MethodPost, path, token, strings.NewReader(body))
}

// wantError checks the edge's error shape: status, JSON content type, exactly
// the two fields, the reason, and a non-empty sentence.
func wantError(t *testing.T, r response, status int, reason string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, r.body)
	}
	if len(m) != 2 {
		t.Errorf("error body has fields %v, want exactly error and reason", m)
	}
	var b apierr.Body
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("error body does not have the error fields' types: %v: %s", err, r.body)
	}
	if b.Reason != reason {
		t.Errorf("reason %q, want %q (body %s)", b.Reason, reason, r.body)
	}
	if strings.TrimSpace(b.Error) == "" {
		t.Errorf("empty error sentence: %s", r.body)
	}
}

// decode unmarshals an answer body into v, failing the test otherwise.
func decode(t *testing.T, r response, v any) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("answer is not the JSON expected: %v: %s", err, r.body)
	}
}

// withTimeout bounds a wait on ch; a hung goroutine fails the test instead
// of hanging it.
func withTimeout[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
