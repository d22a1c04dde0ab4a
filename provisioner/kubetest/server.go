// Package kubetest runs a real kube-apiserver and its etcd inside the test
// process, so that the provisioner's tests and the deployment kit of
// docs/deploy meet the API server a user's cluster runs: its validation, its
// defaulting and its RBAC authorizer, not a fake clientset's idea of them.
//
// The server is the one Kubernetes' own integration tests use
// (k8s.io/kubernetes/cmd/kube-apiserver/app/testing); etcd is
// go.etcd.io/etcd/server/v3/embed, listening on a unix socket, so nothing but
// the API server's own 127.0.0.1 port is opened. No controller runs: objects
// are stored and served, never acted on (no pods, no garbage collection).
package kubetest

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/rest"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// The test server's ktesting sets klog's verbosity to 5 when it is
// imported: tens of thousands of lines a start. Back to 0 (warnings and
// errors), before the tests parse their flags, so that `go test ./...
// -args -v=5` still brings the detail back when a failure needs it.
func init() { ktesting.SetDefaultVerbosity(0) }

// StartTimeout bounds each of etcd's and the API server's start.
const StartTimeout = 90 * time.Second

// Server is a running kube-apiserver with its etcd. Both stop when the test
// that started them ends.
type Server struct {
	// Admin is the API server's loopback config: a member of system:masters,
	// allowed everything, including impersonation.
	Admin *rest.Config
}

// Flags are the kube-apiserver flags of every Server: RBAC on as in a real
// cluster (the test server's default is AlwaysAllow), and the two flags
// Kubernetes' integration tests use because no controller manager runs.
var Flags = []string{
	"--authorization-mode=Node,RBAC",
	// The Endpoints reconciler would keep failing to publish 127.0.0.1.
	"--endpoint-reconciler-type=none",
	// It waits for token controllers that do not run here; no test makes pods.
	"--disable-admission-plugins=ServiceAccount",
}

// Start runs etcd and a kube-apiserver for t and waits until the API server
// is healthy (the test server waits for /healthz and the default namespace).
func Start(t testing.TB) *Server {
	t.Helper()
	etcdURL := startEtcd(t)

	storage := storagebackend.NewDefaultConfig(path.Join(strings.ReplaceAll(t.Name(), "/", "_"), "registry"), nil)
	storage.Transport.ServerList = []string{etcdURL}
	ts, err := kubeapiservertesting.StartTestServer(t, kubeapiservertesting.NewDefaultTestServerOptions(), Flags, storage)
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(ts.TearDownFn)
	return &Server{Admin: rest.CopyConfig(ts.ClientConfig)}
}

// startEtcd runs an embedded single-member etcd whose clients come through a
// unix socket, and returns the socket's URL for the API server.
func startEtcd(t testing.TB) string {
	t.Helper()
	// A short directory of its own: a unix socket's path has at most 107 bytes,
	// more than t.TempDir() guarantees for long test names.
	dir, err := os.MkdirTemp("", "kubetest-etcd-")
	if err != nil {
		t.Fatalf("etcd directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "etcd.sock")

	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	// A throwaway member: what is lost in a crash is lost with the test.
	cfg.UnsafeNoFsync = true
	cfg.ListenClientUrls = []url.URL{{Scheme: "unix", Path: sock}}
	// Nothing dials these: the API server uses the socket, and a single member
	// has no peers. Port 0 lets the kernel pick; only loopback is bound.
	cfg.AdvertiseClientUrls = []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd stopped while starting: %v", err)
	case <-time.After(StartTimeout):
		e.Server.Stop()
		t.Fatalf("etcd not ready after %s", StartTimeout)
	}
	return fmt.Sprintf("unix://%s", sock)
}

// AsServiceAccount is Admin impersonating the ServiceAccount namespace/name
// with the groups a real token of it carries, so that requests are
// authorized by RBAC as the ServiceAccount's own would be.
func (s *Server) AsServiceAccount(namespace, name string) *rest.Config {
	c := rest.CopyConfig(s.Admin)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: serviceaccount.MakeUsername(namespace, name),
		Groups:   serviceaccount.MakeGroupNames(namespace),
	}
	return c
}
