// Package virtapi is KubeVirt's virt-api as the test's API server reaches
// it: an aggregated API (the APIService v1.subresources.kubevirt.io,
// backed by the Service kubevirt/virt-api) served over loopback TLS, which
// the real API server authenticates, authorizes (RBAC on the
// subresources) and proxies. A VirtualMachine's start, stop and restart
// are KubeVirt v1.8.0's own handlers (pkg/virt-api/rest's
// SubresourceAPIApp, on the routes virt-api gives them), acting on the API
// server as virt-api does, so that what they change is what KubeVirt's
// controllers then act on. A VirtualMachineInstance's console and vnc are
// served by whoever plays the node (Config.Console), or answer 404 as
// virt-api does for a VMI it cannot reach.
package virtapi

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	restful "github.com/emicklei/go-restful/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	k8srest "k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	"kubevirt.io/kubevirt/pkg/virt-api/rest"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"

	"github.com/vmshelf/vmshelf/internal/testkit/selfsigned"
)

// Names of the aggregated API, as virt-operator registers it.
const (
	Namespace = "kubevirt"
	Service   = "virt-api"
	Port      = 443
	group     = "subresources.kubevirt.io"
	version   = "v1"
)

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// ConsoleFunc serves the console ("console") or vnc ("vnc") WebSocket of
// VMI ns/name.
type ConsoleFunc func(w http.ResponseWriter, r *http.Request, ns, name, sub string)

// Config is what Start needs.
type Config struct {
	// Dir takes the server's certificate.
	Dir string
	// Admin is the API server's loopback config: the handlers act as
	// virt-api's ServiceAccount would, with every right it has.
	Admin *k8srest.Config
	// ClusterConfig is KubeVirt's cluster configuration (virt-controller's).
	ClusterConfig *virtconfig.ClusterConfig
	// NodeName is where the endpoint of virt-api's Service says it runs.
	NodeName string
	// Console serves the VMIs' consoles; nil: 404.
	Console ConsoleFunc
}

// Server is a running virt-api.
type Server struct {
	cfg   Config
	srv   *http.Server
	addr  string
	ca    []byte
	power *restful.Container
	kube  kubernetes.Interface
	dyn   dynamic.Interface
}

// Start serves virt-api on a loopback port until Close.
func Start(cfg Config) (*Server, error) {
	admin := k8srest.CopyConfig(cfg.Admin)
	// Custom resources (KubeVirt's) speak JSON only.
	admin.ContentType, admin.AcceptContentTypes = "", ""
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	virtCli, err := kubecli.GetKubevirtClientFromRESTConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("virtapi: %w", err)
	}
	// The API server verifies the name of the Service it dials.
	cert, err := selfsigned.WriteFor(cfg.Dir, Service+"."+Namespace+".svc")
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(cert.CertFile, cert.KeyFile)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(cert.CertFile)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, addr: l.Addr().String(), ca: ca, kube: kube, dyn: dyn,
		power: powerRoutes(rest.NewSubresourceAPIApp(virtCli, 0, nil, cfg.ClusterConfig))}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
			// A WebSocket upgrade is HTTP/1.1.
			NextProtos: []string{"http/1.1"}}}
	go func() { _ = s.srv.ServeTLS(l, "", "") }()
	return s, nil
}

// powerRoutes are virt-api's start, stop and restart routes of a
// VirtualMachine (pkg/virt-api/api.go's), each to its handler.
func powerRoutes(app *rest.SubresourceAPIApp) *restful.Container {
	ws := new(restful.WebService)
	ws.Path("/apis/"+group+"/"+version).Consumes(restful.MIME_JSON, "*/*").Produces(restful.MIME_JSON)
	path := "/namespaces/{namespace}/virtualmachines/{name}/"
	ws.Route(ws.PUT(path + "start").To(app.StartVMRequestHandler))
	ws.Route(ws.PUT(path + "stop").To(app.StopVMRequestHandler))
	ws.Route(ws.PUT(path + "restart").To(app.RestartVMRequestHandler))
	c := restful.NewContainer()
	c.Add(ws)
	return c
}

// Addr is the server's address (https): where the API server's service
// resolver must send the Service kubevirt/virt-api.
func (s *Server) Addr() string { return s.addr }

// Close stops the server.
func (s *Server) Close() { _ = s.srv.Close() }

// Register makes the Service and the APIService by which the API server
// serves virt-api's subresources, as virt-operator registers them, and
// waits (bounded by ctx) until the API server reports it Available. The
// API server must route the Service to Addr.
func (s *Server) Register(ctx context.Context) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: Service, Namespace: Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: Port, Protocol: corev1.ProtocolTCP}},
			Selector: map[string]string{kubevirtv1.AppLabel: "virt-api"}},
	}
	if _, err := s.kube.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("virtapi: the Service: %w", err)
	}
	// The endpoint the endpointslice controller would list for virt-api's
	// pod: the aggregator's availability check wants a ready one on the
	// Service's port before it dials (through the API server's service
	// resolver, which routes it to Addr). An EndpointSlice may not hold a
	// loopback address, so the endpoint stands at a pod network's address
	// that nothing dials.
	_, portStr, err := net.SplitHostPort(s.addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return err
	}
	ready, portName, port32 := true, "", int32(port)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: Service + "-test", Namespace: Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: Service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.2"}, NodeName: &s.cfg.NodeName,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port32}},
	}
	if _, err := s.kube.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("virtapi: the EndpointSlice: %w", err)
	}
	apiSvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": version + "." + group},
		"spec": map[string]any{
			"group": group, "version": version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"caBundle": base64.StdEncoding.EncodeToString(s.ca),
			"service":  map[string]any{"namespace": Namespace, "name": Service, "port": int64(Port)},
		},
	}}
	apis := s.dyn.Resource(apiServiceGVR)
	if _, err := apis.Create(ctx, apiSvc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("virtapi: the APIService: %w", err)
	}
	for {
		u, err := apis.Get(ctx, version+"."+group, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Available" && m["status"] == "True" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("virtapi: the APIService is not Available: %v", conds)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ServeHTTP answers the aggregated API's discovery, the VMs' power
// subresources and the VMIs' consoles.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := "/apis/" + group + "/" + version
	switch {
	case r.URL.Path == "/openapi/v2":
		// The aggregator merges every APIService's OpenAPI document; the
		// subresources add no schema of their own.
		writeJSON(w, map[string]any{"swagger": "2.0", "info": map[string]any{"title": "KubeVirt API", "version": version},
			"paths": map[string]any{}})
	case r.URL.Path == "/openapi/v3":
		writeJSON(w, map[string]any{"paths": map[string]any{}})
	case r.URL.Path == "/apis":
		writeJSON(w, metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
			Groups: []metav1.APIGroup{apiGroup()}})
	case r.URL.Path == "/apis/"+group:
		g := apiGroup()
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		writeJSON(w, g)
	case r.URL.Path == base:
		writeJSON(w, metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: group + "/" + version,
			APIResources: []metav1.APIResource{
				{Name: "virtualmachineinstances/console", Namespaced: true, Kind: "VirtualMachineInstance", Verbs: []string{"get"}},
				{Name: "virtualmachineinstances/vnc", Namespaced: true, Kind: "VirtualMachineInstance", Verbs: []string{"get"}},
				{Name: "virtualmachines/start", Namespaced: true, Kind: "VirtualMachine", Verbs: []string{"update"}},
				{Name: "virtualmachines/stop", Namespaced: true, Kind: "VirtualMachine", Verbs: []string{"update"}},
				{Name: "virtualmachines/restart", Namespaced: true, Kind: "VirtualMachine", Verbs: []string{"update"}},
			}})
	case strings.HasPrefix(r.URL.Path, base+"/namespaces/"):
		// .../namespaces/{ns}/{virtualmachines|virtualmachineinstances}/{name}/{sub}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, base+"/namespaces/"), "/")
		switch {
		case len(parts) == 4 && parts[1] == "virtualmachines":
			s.power.ServeHTTP(w, r)
		case len(parts) == 4 && parts[1] == "virtualmachineinstances" && (parts[3] == "console" || parts[3] == "vnc") && s.cfg.Console != nil:
			s.cfg.Console(w, r, parts[0], parts[2], parts[3])
		default:
			http.NotFound(w, r)
		}
	default:
		http.NotFound(w, r)
	}
}

func apiGroup() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: group + "/" + version, Version: version}
	return metav1.APIGroup{Name: group, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
