// Package kubetest runs a real kube-apiserver and its etcd inside the test
// process, so that the provisioner's tests and the deployment kit of
// docs/deploy meet the API server a user's cluster runs: its validation, its
// defaulting and its RBAC authorizer, not a fake clientset's idea of them.
//
// The server is kube-apiserver itself, built from its own options and server
// chain (k8s.io/kubernetes/cmd/kube-apiserver/app) the way its command
// builds it; etcd is go.etcd.io/etcd/server/v3/embed, listening on a unix
// socket, so nothing but the API server's own 127.0.0.1 port is opened. No controller runs: objects
// are stored and served, never acted on (no pods, no garbage collection).
//
// The boot tests' cluster (KubeVirt's CRDs, admitter and virt-controller,
// the test node) and edge (vmshelf serve against it, with the stand-in
// Stripe) are built by this package's non-test files, through TB, so that
// make demo's runner (RunDemo, cmd/demo) starts the very same ones.
package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"
	basecompatibility "k8s.io/component-base/compatibility"
	aggregatorapiserver "k8s.io/kube-aggregator/pkg/apiserver"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// StartTimeout bounds each of etcd's and the API server's start.
const StartTimeout = 90 * time.Second

// stopTimeout bounds the wait for the API server to end after its test.
const stopTimeout = 30 * time.Second

// Server is a running kube-apiserver with its etcd. Both stop when the test
// that started them ends.
type Server struct {
	// Admin is the API server's loopback config: a member of system:masters,
	// allowed everything, including impersonation.
	Admin *rest.Config

	routes *serviceRoutes
}

// Route sends the API server's requests for Service namespace/name's
// port (an aggregated API's, such as virt-api's subresources) to addr on
// loopback, over https: what kube-proxy does for it in a cluster, where
// the Service's cluster IP leads to its pods. Without a route the API
// server resolves a Service as kube-apiserver does (its cluster IP, which
// nothing serves here).
func (s *Server) Route(namespace, name string, port int32, addr string) {
	s.routes.mu.Lock()
	defer s.routes.mu.Unlock()
	s.routes.to[fmt.Sprintf("%s/%s:%d", namespace, name, port)] = addr
}

// serviceRoutes is the aggregator's service resolver: Route's routes,
// else kube-apiserver's own.
type serviceRoutes struct {
	mu       sync.Mutex
	to       map[string]string
	fallback aggregatorapiserver.ServiceResolver
}

func (r *serviceRoutes) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	r.mu.Lock()
	addr, ok := r.to[fmt.Sprintf("%s/%s:%d", namespace, name, port)]
	r.mu.Unlock()
	if ok {
		return &url.URL{Scheme: "https", Host: addr}, nil
	}
	return r.fallback.ResolveEndpoint(namespace, name, port)
}

// Flags are the kube-apiserver flags of every Server: RBAC on as in a real
// cluster (the options' default is AlwaysAllow), and the two flags
// Kubernetes' integration tests use because no controller manager runs.
var Flags = []string{
	"--authorization-mode=Node,RBAC",
	// The Endpoints reconciler would keep failing to publish 127.0.0.1.
	"--endpoint-reconciler-type=none",
	// It waits for token controllers that do not run here; no test makes pods.
	"--disable-admission-plugins=ServiceAccount",
}

// Start runs etcd and a kube-apiserver for t and waits until the API server
// is ready (/readyz, which includes the RBAC bootstrap roles).
//
// The API server is built from kube-apiserver's own options and server
// chain (k8s.io/kubernetes/cmd/kube-apiserver/app), as its command does,
// and not through the test server of cmd/kube-apiserver/app/testing: that
// one brings k8s.io/kubernetes/test/utils/ktesting, whose import registers
// klog's -v on the process's flag set, and kubevirt.io/client-go/log (which
// the provisioner links) registers a -v of its own there too: one binary
// with both panics before any test runs.
func Start(t TB) *Server {
	t.Helper()
	etcdURL := startEtcd(t)
	routes := &serviceRoutes{to: map[string]string{}}
	admin, err := startAPIServer(t, etcdURL, routes)
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	return &Server{Admin: admin, routes: routes}
}

// apiServerOptions are kube-apiserver's options for one test's server:
// Flags, a loopback listener of its own, a self-signed certificate and a
// signing key in a temporary directory, and etcd at etcdURL.
func apiServerOptions(t TB, etcdURL string) (*options.ServerRunOptions, error) {
	dir := t.TempDir()

	// A registry of versions and feature gates of its own, as kube-apiserver
	// has one per process: a test may start several servers.
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	effectiveVersion := compatibility.DefaultBuildEffectiveVersion()
	effectiveVersion.SetEmulationVersion(featureGate.EmulationVersion())
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return nil, err
	}

	s := options.NewServerRunOptions()
	s.GenericServerRunOptions.ComponentGlobalsRegistry = registry
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(Flags); err != nil {
		return nil, err
	}
	if err := registry.Set(); err != nil {
		return nil, err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	s.SecureServing.ExternalAddress = net.IPv4(127, 0, 0, 1)
	// A self-signed serving certificate is made here.
	s.SecureServing.ServerCert.CertDirectory = dir
	// The Service IP range is configuration only: no address of it is used.
	s.ServiceClusterIPRanges = "10.0.0.0/16"

	storage := storagebackend.NewDefaultConfig(path.Join(strings.ReplaceAll(t.Name(), "/", "_"), "registry"), nil)
	storage.Transport.ServerList = []string{etcdURL}
	s.Etcd.StorageConfig = *storage

	// ServiceAccount tokens need a signing key; a fresh one per server.
	keyFile, err := writeSigningKey(dir)
	if err != nil {
		return nil, err
	}
	s.ServiceAccountSigningKeyFile = keyFile
	s.Authentication.ServiceAccounts.KeyFiles = []string{keyFile}
	s.Authentication.ServiceAccounts.Issuers = []string{"https://kubetest.invalid"}
	return s, nil
}

func startAPIServer(t TB, etcdURL string, routes *serviceRoutes) (*rest.Config, error) {
	s, err := apiServerOptions(t, etcdURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	completed, err := s.Complete(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("options: %w", err)
	}
	if errs := completed.Validate(); len(errs) > 0 {
		cancel()
		return nil, fmt.Errorf("options: %w", utilerrors.NewAggregate(errs))
	}
	config, err := app.NewConfig(completed)
	if err != nil {
		cancel()
		return nil, err
	}
	// The aggregator proxies an APIService to its Service through this
	// resolver (its availability checks too); the server's own is kept
	// for every Service no test routes.
	routes.fallback = config.Aggregator.ExtraConfig.ServiceResolver
	config.Aggregator.ExtraConfig.ServiceResolver = routes
	cc, err := config.Complete()
	if err != nil {
		cancel()
		return nil, err
	}
	server, err := app.CreateServerChain(cc)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("server chain: %w", err)
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		cancel()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- prepared.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("kube-apiserver stopped: %v", err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("kube-apiserver still running %s after its test", stopTimeout)
		}
	})

	admin := rest.CopyConfig(server.GenericAPIServer.LoopbackClientConfig)
	admin.QPS, admin.Burst = 1000, 10000
	if err := waitReady(ctx, admin, done); err != nil {
		return nil, err
	}
	return admin, nil
}

// waitReady asks /readyz until it answers 200, the server stops, or
// StartTimeout passes. The API server has no other signal a client can
// wait on.
func waitReady(ctx context.Context, c *rest.Config, done <-chan error) error {
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	var last error
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("stopped while starting: %w", err)
		default:
		}
		status := 0
		last = client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status).Error()
		return status == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("not ready after %s: %w (last answer: %v)", StartTimeout, err, last)
	}
	return nil
}

func writeSigningKey(dir string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	pem, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(f, pem, 0o600); err != nil {
		return "", err
	}
	return f, nil
}

// startEtcd runs an embedded single-member etcd whose clients come through a
// unix socket, and returns the socket's URL for the API server.
func startEtcd(t TB) string {
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

// AsServiceAccount is Admin, as a pod's in-cluster config would be, impersonating the ServiceAccount namespace/name
// with the groups a real token of it carries, so that requests are
// authorized by RBAC as the ServiceAccount's own would be.
func (s *Server) AsServiceAccount(namespace, name string) *rest.Config {
	c := rest.CopyConfig(s.Admin)
	// As an in-cluster config: no content type of its own. The loopback
	// config asks for protobuf, which Kubernetes' own kinds speak and
	// custom resources (KubeVirt's, CDI's) do not.
	c.ContentType, c.AcceptContentTypes = "", ""
	c.Impersonate = rest.ImpersonationConfig{
		UserName: serviceaccount.MakeUsername(namespace, name),
		Groups:   serviceaccount.MakeGroupNames(namespace),
	}
	return c
}
