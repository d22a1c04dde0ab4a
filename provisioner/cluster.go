package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiclient "kubevirt.io/client-go/containerizeddataimporter"
	kubevirtclient "kubevirt.io/client-go/kubevirt"
	kvcorev1 "kubevirt.io/client-go/kubevirt/typed/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Cluster is what the provisioner needs of Kubernetes: get and create of
// the few kinds it uses, one patch, and nothing that deletes. A buyer's
// disk lives in a PVC that only its DataVolume names; a method that could
// delete either is a method that one bug away deletes somebody's data, so
// there is none, and the RBAC vmshelf ships grants no delete either.
//
// Every write is sent with strict field validation (strict): a field the
// API server's schema does not know is an error, never silently dropped,
// so an object is made as built or not at all.
//
// Errors are the API's own (k8s.io/apimachinery/pkg/api/errors tells
// NotFound and AlreadyExists apart); a Get that could not ask is an error,
// never a NotFound.
type Cluster interface {
	// Ping asks the API server for its version: it answers.
	Ping(ctx context.Context) error
	GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error)
	CreateNamespace(ctx context.Context, ns *corev1.Namespace) error
	GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error)
	CreateSecret(ctx context.Context, s *corev1.Secret) error
	GetService(ctx context.Context, ns, name string) (*corev1.Service, error)
	CreateService(ctx context.Context, s *corev1.Service) error
	GetIngress(ctx context.Context, ns, name string) (*networkingv1.Ingress, error)
	CreateIngress(ctx context.Context, ing *networkingv1.Ingress) error
	GetVM(ctx context.Context, ns, name string) (*kubevirtv1.VirtualMachine, error)
	CreateVM(ctx context.Context, vm *kubevirtv1.VirtualMachine) error
	// SetRunStrategy changes spec.runStrategy of a VirtualMachine with a
	// merge patch, and nothing else of it.
	SetRunStrategy(ctx context.Context, ns, name string, s kubevirtv1.VirtualMachineRunStrategy) error
	GetDataVolume(ctx context.Context, ns, name string) (*cdiv1.DataVolume, error)
	// CreateDataVolume makes a replica's disk, before its VM.
	CreateDataVolume(ctx context.Context, dv *cdiv1.DataVolume) error
	// Console connects to KubeVirt's vnc or console subresource of the
	// VirtualMachineInstance vmi in ns: the raw bytes of its screen (RFB)
	// or its serial line.
	Console(ctx context.Context, ns, vmi string, kind imagestore.ConsoleKind) (net.Conn, error)
	// Power sends a start, stop or restart to KubeVirt's subresource of
	// that name of the VirtualMachine name in ns, as virtctl does:
	// KubeVirt's virt-api changes the VM's run strategy or asks its
	// controller for the change, and answers 409 when the VM is not in a
	// state that takes the action.
	Power(ctx context.Context, ns, name string, a imagestore.PowerAction) error
}

// cluster is Cluster over the generated clientsets of Kubernetes, KubeVirt
// and CDI (real ones, or their fakes in tests).
type cluster struct {
	k   kubernetes.Interface
	kv  kubevirtclient.Interface
	cdi cdiclient.Interface
	// rc is the REST config the console's WebSocket dials with; nil over
	// fake clientsets, which have no console.
	rc *rest.Config
}

// NewCluster is the Cluster over the three clientsets.
func NewCluster(k kubernetes.Interface, kv kubevirtclient.Interface, cdi cdiclient.Interface) Cluster {
	return &cluster{k: k, kv: kv, cdi: cdi}
}

// strict is the field validation of every write: the API server refuses
// an unknown or duplicate field instead of dropping it (its default, Warn,
// only warns). A KubeVirt VirtualMachine schema that lacks a field the
// provisioner sets must stop the order with an error, not make a replica
// without it.
const strict = metav1.FieldValidationStrict

// requestTimeout bounds every single API request, whatever the caller's
// context: a pass of the reconciler must end even against an API server
// that accepts connections and never answers.
const requestTimeout = 30 * time.Second

// ClusterFromConfig builds the clientsets from c (RESTConfig) and returns
// the Cluster over them. It does not talk to the API server; Ping does.
func ClusterFromConfig(c *rest.Config) (Cluster, error) {
	if c == nil {
		return nil, errors.New("provisioner: no REST config")
	}
	c = rest.CopyConfig(c)
	c.UserAgent = "vmshelf-provisioner"
	if c.Timeout == 0 {
		c.Timeout = requestTimeout
	}
	k, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("provisioner: kubernetes client: %w", err)
	}
	kv, err := kubevirtclient.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("provisioner: kubevirt client: %w", err)
	}
	cdi, err := cdiclient.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("provisioner: CDI client: %w", err)
	}
	return &cluster{k: k, kv: kv, cdi: cdi, rc: c}, nil
}

// RESTConfig reads the kubeconfig file at path, or with "" the in-cluster
// configuration of the pod's service account. An unreadable or invalid
// file is an error; so is "" outside a cluster (it wraps
// rest.ErrNotInCluster).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// Connect is the provisioner's cluster: the kubeconfig file's, or with ""
// the pod's in-cluster configuration. With "" outside a cluster it is no
// error: the service still runs (the README's walk-through does), over a
// cluster that cannot be reached, so that readiness and the paid orders'
// notes say why nothing is provisioned. Its errors are one line; a file
// that cannot be read or parsed is a *ConfigError. client-go's own log
// lines go to log.
func Connect(kubeconfig string, log *slog.Logger) (Cluster, error) {
	klog.SetSlogLogger(log.With("component", "client-go"))
	rc, err := RESTConfig(kubeconfig)
	if err != nil && kubeconfig == "" {
		log.Warn("--vms-enable without --kubeconfig outside a cluster: paid orders are not provisioned", "err", err)
		return Unreachable(errors.New("no --kubeconfig is given and vmshelf does not run in a cluster")), nil
	}
	if err != nil {
		return nil, &ConfigError{err}
	}
	c, err := ClusterFromConfig(rc)
	if err != nil {
		return nil, lineError{err}
	}
	return c, nil
}

// ConfigError is Connect's refusal of a kubeconfig that cannot be read or
// parsed, as against clients that cannot be built from one that was. Its
// text is Err's on one line.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return lineError{e.Err}.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// lineError is err with its runs of white space (client-go's errors span
// lines) made single spaces.
type lineError struct{ err error }

func (e lineError) Error() string { return strings.Join(strings.Fields(e.err.Error()), " ") }
func (e lineError) Unwrap() error { return e.err }

// Ping asks for the server version. The discovery call takes no context,
// so it runs aside and Ping returns when ctx ends; the request itself ends
// within the client's timeout (requestTimeout).
func (c *cluster) Ping(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		_, err := c.k.Discovery().ServerVersion()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cluster) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	return c.k.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateNamespace(ctx context.Context, ns *corev1.Namespace) error {
	_, err := c.k.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldValidation: strict})
	return err
}

func (c *cluster) GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return c.k.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateSecret(ctx context.Context, s *corev1.Secret) error {
	_, err := c.k.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldValidation: strict})
	return err
}

func (c *cluster) GetService(ctx context.Context, ns, name string) (*corev1.Service, error) {
	return c.k.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateService(ctx context.Context, s *corev1.Service) error {
	_, err := c.k.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldValidation: strict})
	return err
}

func (c *cluster) GetIngress(ctx context.Context, ns, name string) (*networkingv1.Ingress, error) {
	return c.k.NetworkingV1().Ingresses(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateIngress(ctx context.Context, ing *networkingv1.Ingress) error {
	_, err := c.k.NetworkingV1().Ingresses(ing.Namespace).Create(ctx, ing, metav1.CreateOptions{FieldValidation: strict})
	return err
}

func (c *cluster) GetVM(ctx context.Context, ns, name string) (*kubevirtv1.VirtualMachine, error) {
	return c.kv.KubevirtV1().VirtualMachines(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateVM(ctx context.Context, vm *kubevirtv1.VirtualMachine) error {
	_, err := c.kv.KubevirtV1().VirtualMachines(vm.Namespace).Create(ctx, vm, metav1.CreateOptions{FieldValidation: strict})
	return err
}

// SetRunStrategy sends {"spec":{"runStrategy":s}} as a JSON merge patch:
// it names no resourceVersion and no other field, so it changes the run
// strategy and nothing the VM's owner or KubeVirt wrote.
func (c *cluster) SetRunStrategy(ctx context.Context, ns, name string, s kubevirtv1.VirtualMachineRunStrategy) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"runStrategy": s}})
	if err != nil {
		return err
	}
	_, err = c.kv.KubevirtV1().VirtualMachines(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldValidation: strict})
	return err
}

func (c *cluster) GetDataVolume(ctx context.Context, ns, name string) (*cdiv1.DataVolume, error) {
	return c.cdi.CdiV1beta1().DataVolumes(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *cluster) CreateDataVolume(ctx context.Context, dv *cdiv1.DataVolume) error {
	_, err := c.cdi.CdiV1beta1().DataVolumes(dv.Namespace).Create(ctx, dv, metav1.CreateOptions{FieldValidation: strict})
	return err
}

func (c *cluster) Power(ctx context.Context, ns, name string, a imagestore.PowerAction) error {
	vms := c.kv.KubevirtV1().VirtualMachines(ns)
	switch a {
	case imagestore.PowerStart:
		return vms.Start(ctx, name, &kubevirtv1.StartOptions{})
	case imagestore.PowerStop:
		return vms.Stop(ctx, name, &kubevirtv1.StopOptions{})
	case imagestore.PowerRestart:
		return vms.Restart(ctx, name, &kubevirtv1.RestartOptions{})
	}
	return fmt.Errorf("provisioner: power action %q", a)
}

// unreachable is a Cluster that cannot be asked anything.
type unreachable struct{ err error }

// Unreachable is a Cluster every call of which fails with reason: serve
// runs the provisioner over it when no cluster is configured (no
// --kubeconfig outside a cluster), so that /readyz and the paid orders'
// notes say why nothing is provisioned instead of saying nothing.
func Unreachable(reason error) Cluster { return unreachable{reason} }

func (u unreachable) Ping(context.Context) error { return u.err }
func (u unreachable) GetNamespace(context.Context, string) (*corev1.Namespace, error) {
	return nil, u.err
}
func (u unreachable) CreateNamespace(context.Context, *corev1.Namespace) error { return u.err }
func (u unreachable) GetSecret(context.Context, string, string) (*corev1.Secret, error) {
	return nil, u.err
}
func (u unreachable) CreateSecret(context.Context, *corev1.Secret) error { return u.err }
func (u unreachable) GetService(context.Context, string, string) (*corev1.Service, error) {
	return nil, u.err
}
func (u unreachable) CreateService(context.Context, *corev1.Service) error { return u.err }
func (u unreachable) GetIngress(context.Context, string, string) (*networkingv1.Ingress, error) {
	return nil, u.err
}
func (u unreachable) CreateIngress(context.Context, *networkingv1.Ingress) error { return u.err }
func (u unreachable) GetVM(context.Context, string, string) (*kubevirtv1.VirtualMachine, error) {
	return nil, u.err
}
func (u unreachable) CreateVM(context.Context, *kubevirtv1.VirtualMachine) error { return u.err }
func (u unreachable) SetRunStrategy(context.Context, string, string, kubevirtv1.VirtualMachineRunStrategy) error {
	return u.err
}
func (u unreachable) GetDataVolume(context.Context, string, string) (*cdiv1.DataVolume, error) {
	return nil, u.err
}
func (u unreachable) CreateDataVolume(context.Context, *cdiv1.DataVolume) error { return u.err }
func (u unreachable) Console(context.Context, string, string, imagestore.ConsoleKind) (net.Conn, error) {
	return nil, u.err
}
func (u unreachable) Power(context.Context, string, string, imagestore.PowerAction) error {
	return u.err
}

// Console dials KubeVirt's subresource through the API server: the
// plain.kubevirt.io WebSocket protocol (binary messages carrying the
// console's own bytes) at the path KubeVirt's client builds
// (kvcorev1.RequestFromConfig), with the REST config's TLS and
// credentials. It is dialed here rather than with client-go's
// AsyncSubresourceHelper because that helper takes no context and sets no
// handshake timeout: against an API server that accepts the connection and
// never answers the upgrade it waits for ever, and each of its streams
// keeps a goroutine until the stream's Stream method, which a net.Conn
// never calls, ends it. Here ctx bounds the whole handshake: cancelled or
// past its deadline, the connection is closed and the dial returns.
func (c *cluster) Console(ctx context.Context, ns, vmi string, kind imagestore.ConsoleKind) (net.Conn, error) {
	if c.rc == nil {
		return nil, errors.New("provisioner: this cluster client has no console")
	}
	sub := map[imagestore.ConsoleKind]string{imagestore.ConsoleVNC: "vnc", imagestore.ConsoleSerial: "console"}[kind]
	if sub == "" {
		return nil, fmt.Errorf("provisioner: console kind %q", kind)
	}
	req, err := kvcorev1.RequestFromConfig(c.rc, "virtualmachineinstances", vmi, ns, sub, url.Values{})
	if err != nil {
		return nil, fmt.Errorf("provisioner: %s of %s/%s: %w", sub, ns, vmi, err)
	}
	client, done, err := c.consoleClient()
	if err != nil {
		return nil, fmt.Errorf("provisioner: %s of %s/%s: %w", sub, ns, vmi, err)
	}
	defer done()
	ws, resp, err := websocket.Dial(ctx, req.URL.String(), &websocket.DialOptions{
		HTTPClient:   client,
		Subprotocols: []string{consoleProtocol},
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("no such VirtualMachineInstance (%s): %w", resp.Status, err)
		}
		return nil, fmt.Errorf("provisioner: %s of %s/%s: %w", sub, ns, vmi, err)
	}
	// The connection outlives ctx, which bounds only the dial: the caller
	// closes it.
	return websocket.NetConn(context.WithoutCancel(ctx), ws, websocket.MessageBinary), nil
}

// consoleProtocol is the WebSocket subprotocol of KubeVirt's console
// subresources: raw bytes in binary messages.
const consoleProtocol = "plain.kubevirt.io"

// consoleClient is an HTTP/1.1 client (a WebSocket upgrade is HTTP/1.1
// only) with the REST config's TLS, proxy and credentials; done releases
// its idle connections.
func (c *cluster) consoleClient() (client *http.Client, done func(), err error) {
	tlsConfig, err := rest.TLSConfigFor(c.rc)
	if err != nil {
		return nil, nil, err
	}
	if tlsConfig != nil {
		tlsConfig.NextProtos = []string{"http/1.1"}
	}
	proxy := http.ProxyFromEnvironment
	if c.rc.Proxy != nil {
		proxy = c.rc.Proxy
	}
	tr := &http.Transport{Proxy: proxy, TLSClientConfig: tlsConfig, ForceAttemptHTTP2: false}
	rt, err := rest.HTTPWrappersForConfig(c.rc, tr)
	if err != nil {
		return nil, nil, err
	}
	return &http.Client{Transport: rt}, tr.CloseIdleConnections, nil
}
