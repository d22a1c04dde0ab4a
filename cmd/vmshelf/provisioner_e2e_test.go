package main

import (
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// kubeconfigFile writes a kubeconfig whose one cluster is at server,
// trusting the certificate ca (PEM), and whose user's token is
// kubeFakeToken.
func kubeconfigFile(t *testing.T, server string, ca []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: edge
  cluster:
    server: ` + server + `
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString(ca) + `
users:
- name: vmshelf
  user:
    token: ` + kubeFakeToken + `
contexts:
- name: edge
  context:
    cluster: edge
    user: vmshelf
current-context: edge
`
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestE2EKubeconfigRefused: with --vms-enable, a --kubeconfig that cannot
// be read or parsed is a one-line usage error (exit 2) before any port is
// bound or the data dir is touched.
func TestE2EKubeconfigRefused(t *testing.T) {
	needTool(t, "strace")
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("clusters: [this is: not: a kubeconfig\n\t{"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path string }{
		{"missing file", filepath.Join(dir, "no-such-kubeconfig")},
		{"not a kubeconfig", garbage},
		{"empty file", empty},
		{"a directory", dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			cmdline := []string{"serve", "--dev", "--data-dir", dataDir, "--data-addr", freeAddr(t), "--control-addr", freeAddr(t),
				"--vms-enable", "--kubeconfig", tc.path}
			r, calls := traceSockets(t, 20*time.Second, noStripeEnv, cmdline...)
			if len(calls) != 0 {
				t.Errorf("bound or listened before refusing:\n%s", strings.Join(calls, "\n"))
			}
			if line := refusal(t, r, 2); !strings.Contains(line, "--kubeconfig") {
				t.Errorf("the error %q does not mention --kubeconfig", line)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the refused start touched the data dir (stat: %v)", err)
			}
		})
	}
}

// fakeAPIServer answers GET /version like a Kubernetes API server (over
// TLS: client-go sends credentials only so) and everything else 404,
// recording what it was asked.
type fakeAPIServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string
	agents   []string
	auth     []string
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		f.agents = append(f.agents, r.UserAgent())
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet && r.URL.Path == "/version" {
			_, _ = w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.3","platform":"linux/amd64"}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	t.Cleanup(f.Close)
	return f
}

// ca is the server's certificate, PEM-encoded.
func (f *fakeAPIServer) ca() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
}

func (f *fakeAPIServer) asked(req string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.requests {
		if r == req {
			return true
		}
	}
	return false
}

// TestE2EProvisionerReachesCluster: serve --vms-enable --kubeconfig asks
// the API server the kubeconfig names (with its credentials, as
// vmshelf-provisioner) at start, and /readyz then names no machines
// reason; an API server that does not answer is clusterUnreachable, and
// serve runs all the same.
func TestE2EProvisionerReachesCluster(t *testing.T) {
	needTool(t, "curl")
	key, whsec := stripeTestSecrets()
	fake, err := stripetest.New(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key, "STRIPE_WEBHOOK_SECRET="+whsec)

	t.Run("answering", func(t *testing.T) {
		api := newFakeAPIServer(t)
		s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL,
			"--kubeconfig", kubeconfigFile(t, api.URL, api.ca())}, env...)
		s.secret(key)
		s.secret(whsec)
		s.secret(kubeFakeToken)
		var body []byte
		poll(t, 400, 25*time.Millisecond, "/readyz without a machines reason", func() bool {
			var code int
			code, body = s.readyz(t)
			return code == http.StatusOK && !strings.Contains(string(body), "machines")
		}, func() string { return string(body) })
		if !api.asked("GET /version") {
			t.Errorf("the API server was asked %v, want GET /version", api.requests)
		}
		api.mu.Lock()
		for i := range api.requests {
			if !strings.HasPrefix(api.agents[i], "vmshelf-provisioner") || api.auth[i] != "Bearer "+kubeFakeToken {
				t.Errorf("request %s came as %q with %q", api.requests[i], api.agents[i], api.auth[i])
			}
		}
		api.mu.Unlock()
		s.assertNoSecrets()
	})
	t.Run("not answering", func(t *testing.T) {
		api := newFakeAPIServer(t)
		addr, ca := api.URL, api.ca()
		api.Close() // nothing listens there now
		s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL,
			"--kubeconfig", kubeconfigFile(t, addr, ca)}, env...)
		s.secret(key)
		s.secret(whsec)
		s.secret(kubeFakeToken)
		code, body := s.readyz(t)
		if code != http.StatusOK || !strings.Contains(string(body), `"machines":"clusterUnreachable"`) {
			t.Errorf("/readyz %d %s, want 200 with machines clusterUnreachable", code, body)
		}
		s.assertNoSecrets()
	})
}
