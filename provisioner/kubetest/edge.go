package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// The edge: the vmshelf binary itself (cmd/vmshelf, built from this
// repository) serving both planes with the market on, its Stripe the
// stand-in billing/stripetest, its cluster the real API server, reached
// with a kubeconfig as vmshelf's ServiceAccount. The boot tests drive it
// as a buyer and a host do: over HTTP.

var (
	vmshelfBinOnce sync.Once
	vmshelfBin     string
	vmshelfBinErr  error
)

// buildVmshelf builds cmd/vmshelf once per test process, into the
// repository's bin/ (ignored by git).
func buildVmshelf(t TB) string {
	t.Helper()
	vmshelfBinOnce.Do(func() {
		root, err := filepath.Abs("../..")
		if err != nil {
			vmshelfBinErr = err
			return
		}
		vmshelfBin = filepath.Join(root, "bin", "vmshelf-boottest")
		cmd := exec.Command("go", "build", "-o", vmshelfBin, "./cmd/vmshelf")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			vmshelfBinErr = fmt.Errorf("go build ./cmd/vmshelf: %w\n%s", err, out)
		}
	})
	if vmshelfBinErr != nil {
		t.Fatal(vmshelfBinErr)
	}
	return vmshelfBin
}

// edge is a running vmshelf serve.
type edge struct {
	bin               string
	dataDir           string
	dataBase, ctlBase string
	token             string // the dev tenant's (the buyer)
	stripe            *stripetest.Server
	whsec             string
	secrets           []string
	stdout, stderr    *lockedBuffer
	done              chan struct{}
	waitErr           error
}

type lockedBuffer = syncbuf.Buffer

// edgeAccount is the host's Stripe Connect account, active at the stand-in.
const edgeAccount = "acct_bootHost"

// startEdge runs vmshelf serve --dev --vms-enable, built from this tree,
// against the API server of c, with args added (sizes, the catalogue),
// and waits for /healthz.
func startEdge(t TB, c *bootCluster, args ...string) *edge {
	t.Helper()
	return startEdgeWith(t, c, edgeConfig{bin: buildVmshelf(t)}, args...)
}

// edgeConfig is how startEdgeWith runs serve.
type edgeConfig struct {
	bin string // the vmshelf binary
	// checkoutPage: the stand-in Stripe's checkout URLs open its demo
	// payment page (the demo's), not an address no browser opens.
	checkoutPage bool
	// log, if set, takes serve's log in place of the edge's buffer.
	log io.Writer
}

// startEdgeWith is startEdge with the binary and the stand-in's checkout
// page of cfg.
func startEdgeWith(t TB, c *bootCluster, cfg edgeConfig, args ...string) *edge {
	t.Helper()
	e := &edge{bin: cfg.bin, dataDir: filepath.Join(t.TempDir(), "data"), stdout: &lockedBuffer{}, stderr: &lockedBuffer{},
		done: make(chan struct{})}
	key, whsec := "sk_test_boot"+rand.Text(), "whsec_boot"+rand.Text()
	e.whsec = whsec
	var err error
	if e.stripe, err = stripetest.New(key, map[string]string{edgeAccount: "active"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stripe.Close() })
	kubeconfig, token := provisionerKubeconfig(t, c.js.srv)
	e.secrets = append(e.secrets, key, whsec, token)
	whFile := filepath.Join(t.TempDir(), "whsec")
	if err := os.WriteFile(whFile, []byte(whsec+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataAddr, ctlAddr := freeLoopback(t), freeLoopback(t)
	e.dataBase, e.ctlBase = "http://"+dataAddr, "http://"+ctlAddr
	e.stripe.WebhooksTo(e.ctlBase+"/market/stripe/webhook", whsec)
	if cfg.checkoutPage {
		e.stripe.ServeCheckoutPage()
	}
	full := append([]string{"serve", "--dev", "--data-dir", e.dataDir, "--data-addr", dataAddr, "--control-addr", ctlAddr,
		"--vms-enable", "--kubeconfig", kubeconfig, "--stripe-api-base", e.stripe.URL,
		"--vm-storage-class", vmStorageClass, "--headroom-mib", "16"}, args...)
	cmd := exec.Command(e.bin, full...)
	cmd.Env = append(os.Environ(), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET_FILE="+whFile, "no_proxy=*", "NO_PROXY=*")
	cmd.Stdout, cmd.Stderr = e.stdout, e.stderr
	if cfg.log != nil {
		cmd.Stdout, cmd.Stderr = cfg.log, cfg.log
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.waitErr = cmd.Wait(); close(e.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-e.done
		}
		if t.Failed() {
			t.Logf("serve's log:\n%s", tailOf(e.stderr.String(), 20000))
		}
	})
	for i := 0; ; i++ {
		select {
		case <-e.done:
			t.Fatalf("serve exited while starting (%v):\n%s", e.waitErr, e.stderr)
		default:
		}
		if resp, err := http.Get(e.ctlBase + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if i == 400 {
			t.Fatalf("serve not healthy after 20 s:\n%s", e.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(e.dataDir, "dev-token"))
	if err != nil {
		t.Fatal(err)
	}
	e.token = strings.TrimSpace(string(tok))
	e.secrets = append(e.secrets, e.token)
	return e
}

// provisionerKubeconfig writes a kubeconfig that reaches the API server as
// vmshelf's ServiceAccount (impersonated by the server's loopback
// identity, with a ServiceAccount's groups), so that the kit's RBAC is
// what authorizes serve's provisioner; it returns the file and the token
// in it (a secret serve must never log).
func provisionerKubeconfig(t TB, srv *Server) (string, string) {
	t.Helper()
	admin := srv.Admin
	if len(admin.TLSClientConfig.CAData) == 0 || admin.BearerToken == "" {
		t.Fatal("the API server's loopback config has no CA or no token")
	}
	groups := ""
	for _, g := range serviceaccount.MakeGroupNames(vmshelfNamespace) {
		groups += "\n    - " + g
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
    tls-server-name: %s
users:
- name: vmshelf
  user:
    token: %s
    as: %s
    as-groups:%s
contexts:
- name: kubetest
  context:
    cluster: kubetest
    user: vmshelf
current-context: kubetest
`, admin.Host, base64.StdEncoding.EncodeToString(admin.TLSClientConfig.CAData), admin.TLSClientConfig.ServerName, admin.BearerToken,
		serviceaccount.MakeUsername(vmshelfNamespace, vmshelfSA), groups)
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, admin.BearerToken
}

// freeLoopback is a 127.0.0.1 address nothing listens on now.
func freeLoopback(t TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// call POSTs body (JSON; "" for none) to the control plane's path as
// token, and returns the status and the answer.
func (e *edge) call(t TB, path, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.ctlBase+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// must is call that wants status want, and decodes the answer into v.
func (e *edge) must(t TB, path, token, body string, want int, v any) {
	t.Helper()
	code, b := e.call(t, path, token, body)
	if code != want {
		t.Fatalf("POST %s: %d %s, want %d", path, code, b, want)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("POST %s: %s: %v", path, b, err)
		}
	}
}

// vmshelf runs a command of the binary on the edge's store.
func (e *edge) vmshelf(t TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(e.bin, append(args, "--data-dir", e.dataDir)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vmshelf %v: %v\n%s", args, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// addHost adds the hosting box (its appliance the test node's label, its
// payout account the stand-in's active one) and returns its token.
func (e *edge) addHost(t TB) string {
	t.Helper()
	tok := e.vmshelf(t, "tenant", "add", "box1", "--in-mesh", "--sharing", "--hosts-vms", "--appliance", testAppliance,
		"--stripe-account", edgeAccount)
	e.secrets = append(e.secrets, tok)
	return tok
}

// uploaded is an image as the data plane answers it.
type uploaded struct {
	UploadID    string `json:"upload_id"`
	EFI         bool   `json:"efi"`
	Size        int64  `json:"size"`
	VirtualSize int64  `json:"virtual_size"`
	SHA256      string `json:"sha256"`
	// Boot: the firmware the edge found could start the disk.
	Boot string `json:"boot"`
}

// ticket asks for an upload ticket of the buyer.
func (e *edge) ticket(t TB, name string, efi bool) string {
	t.Helper()
	var tk struct {
		UploadURL string `json:"upload_url"`
	}
	e.must(t, "/market/vm-images/ticket", e.token, fmt.Sprintf(`{"name":%q,"efi":%v}`, name, efi), http.StatusCreated, &tk)
	return tk.UploadURL
}

// putImage uploads file with one PUT, as curl -T does.
func (e *edge) putImage(t TB, name string, efi bool, file string) uploaded {
	t.Helper()
	u := e.ticket(t, name, efi)
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPut, u, f)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = fi.Size()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT %s: %d %s", name, resp.StatusCode, b)
	}
	var img uploaded
	if err := json.Unmarshal(b, &img); err != nil {
		t.Fatal(err)
	}
	return img
}

// tusImage uploads file resumably (tus 1.0.0: creation, then the bytes in
// two PATCHes, the second from the offset HEAD reports), as the page's
// tus-js-client does.
func (e *edge) tusImage(t TB, name string, efi bool, file string) uploaded {
	t.Helper()
	u := e.ticket(t, name, efi)
	data, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	fi, err := data.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	do := func(method, url string, body io.Reader, n int64, hdr map[string]string) *http.Response {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = n
		req.Header.Set("Tus-Resumable", "1.0.0")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		return resp
	}
	resp := do(http.MethodPost, u, nil, 0, map[string]string{"Upload-Length": strconv.FormatInt(size, 10)})
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusCreated || loc == "" {
		t.Fatalf("tus creation of %s: %d, Location %q", name, resp.StatusCode, loc)
	}
	if !strings.HasPrefix(loc, "http") {
		loc = e.dataBase + loc
	}
	half := size / 2
	patch := func(off, n int64) *http.Response {
		return do(http.MethodPatch, loc, io.NewSectionReader(data, off, n), n, map[string]string{
			"Upload-Offset": strconv.FormatInt(off, 10), "Content-Type": "application/offset+octet-stream"})
	}
	resp = patch(0, half)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("tus PATCH 1 of %s: %d", name, resp.StatusCode)
	}
	head := do(http.MethodHead, loc, nil, 0, nil)
	head.Body.Close()
	off, err := strconv.ParseInt(head.Header.Get("Upload-Offset"), 10, 64)
	if err != nil || off != half {
		t.Fatalf("tus HEAD of %s: Upload-Offset %q, want %d", name, head.Header.Get("Upload-Offset"), half)
	}
	resp = patch(off, size-off)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("tus PATCH 2 of %s: %d %s", name, resp.StatusCode, b)
	}
	// The image is the buyer's now: read it back from the status.
	for _, img := range e.images(t) {
		if img.Name == name {
			return img.uploaded
		}
	}
	t.Fatalf("after the tus upload the buyer has no image %q", name)
	return uploaded{}
}

type namedImage struct {
	uploaded
	Name string `json:"name"`
}

// images are the buyer's images, from the status.
func (e *edge) images(t TB) []namedImage {
	t.Helper()
	var st struct {
		Images []namedImage `json:"images"`
	}
	e.must(t, "/market/vms/status", e.token, "", http.StatusOK, &st)
	return st.Images
}

// listing opens the host's offer and returns its id.
func (e *edge) listing(t TB, host string, capacity int) string {
	t.Helper()
	var l struct {
		ListingID string `json:"listing_id"`
	}
	e.must(t, "/market/vms/listings", host, fmt.Sprintf(`{"unit_price":600,"capacity":%d}`, capacity), http.StatusCreated, &l)
	return l.ListingID
}

// order places the buyer's order of one replica of image, with userData,
// and returns its id.
func (e *edge) order(t TB, listing, image, name, userData string) string {
	t.Helper()
	req := map[string]any{"listing_id": listing, "quantity": 1, "image": image, "name": name}
	if userData != "" {
		req["user_data"] = userData
	}
	b, _ := json.Marshal(req)
	var o struct {
		OrderID string `json:"order_id"`
	}
	e.must(t, "/market/vms/orders", e.token, string(b), http.StatusCreated, &o)
	return o.OrderID
}

// orderRefused places the buyer's order of one replica of image and
// wants it refused with status and reason; it returns the answer's words.
func (e *edge) orderRefused(t TB, listing, image, name string, status int, reason string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"listing_id": listing, "quantity": 1, "image": image, "name": name})
	code, ans := e.call(t, "/market/vms/orders", e.token, string(b))
	var refusal struct{ Error, Reason string }
	if err := json.Unmarshal(ans, &refusal); err != nil || code != status || refusal.Reason != reason {
		t.Fatalf("order of %s: %d %s, want %d %s", image, code, ans, status, reason)
	}
	return refusal.Error
}

// pay plays the buyer at the stand-in's checkout, which posts Stripe's
// signed webhook; serve must answer "paid".
func (e *edge) pay(t TB, orderID string) {
	t.Helper()
	var session string
	for _, cs := range e.stripe.Sessions() {
		if cs.OrderID == orderID {
			session = cs.ID
		}
	}
	if session == "" {
		t.Fatalf("the stand-in Stripe has no checkout session for order %s", orderID)
	}
	b, err := e.stripe.Complete(context.Background(), session)
	if err != nil || !strings.Contains(string(b), `"paid"`) {
		t.Fatalf("the webhook of order %s: %v %s, want paid", orderID, err, b)
	}
}

// machine is an order as the buyer's status shows it.
type machine struct {
	OrderID  string `json:"order_id"`
	State    string `json:"state"`
	Note     string `json:"note"`
	Replicas []struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Detail   string `json:"detail"`
		Progress string `json:"progress"`
	} `json:"replicas"`
}

// machineOf is order id as the buyer's status shows it now.
func (e *edge) machineOf(t TB, id string) machine {
	t.Helper()
	var st struct {
		Orders []machine `json:"orders"`
	}
	e.must(t, "/market/vms/status", e.token, "", http.StatusOK, &st)
	for _, o := range st.Orders {
		if o.OrderID == id {
			return o
		}
	}
	t.Fatalf("the buyer's status has no order %s", id)
	return machine{}
}

// waitMachine polls the buyer's status (bounded by ctx, every second:
// the page polls every 15 s) until ok says yes of order id, and returns
// what it saw each time the replica's state changed.
func (e *edge) waitMachine(t TB, ctx context.Context, id, what string, ok func(machine) bool) (machine, []string) {
	t.Helper()
	var seen []string
	var m machine
	for {
		m = e.machineOf(t, id)
		s := m.State
		if len(m.Replicas) > 0 {
			r := m.Replicas[0]
			s += "/" + r.State + " " + r.Detail
		}
		if len(seen) == 0 || seen[len(seen)-1] != s {
			seen = append(seen, s)
		}
		if ok(m) {
			return m, seen
		}
		select {
		case <-ctx.Done():
			t.Fatalf("order %s never %s; the page showed %v", id, what, seen)
		case <-time.After(time.Second):
		}
	}
}

// assertNoSecrets: no secret of the test reached serve's output.
func (e *edge) assertNoSecrets(t TB) {
	t.Helper()
	out := e.stdout.String() + e.stderr.String()
	for _, s := range e.secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("a secret (%d bytes) is in serve's output", len(s))
		}
	}
}

// metric is the value of a counter or gauge without labels on serve's
// /metrics (-1 if it is not there).
func (e *edge) metric(t TB, name string) float64 {
	t.Helper()
	resp, err := http.Get(e.ctlBase + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
