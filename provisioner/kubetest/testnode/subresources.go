package testnode

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vmshelf/vmshelf/internal/testkit/selfsigned"
)

// The subresources are virt-api's console and vnc of a VMI, served as
// KubeVirt serves them: an aggregated API (the APIService
// v1.subresources.kubevirt.io, backed by the Service kubevirt/virt-api)
// that the real API server authenticates, authorizes (RBAC's
// virtualmachineinstances/console and /vnc) and proxies, WebSocket
// upgrade included; the WebSocket's binary messages carry the bytes of the
// domain's serial port or VNC socket (pkg/virt-api/rest: the
// plain.kubevirt.io protocol). virt-api reaches the socket through
// virt-handler; here the node dials it itself.

// Names of the aggregated API, as virt-operator registers it.
const (
	SubresourcesNamespace = "kubevirt"
	SubresourcesService   = "virt-api"
	SubresourcesPort      = 443
	subresourcesGroup     = "subresources.kubevirt.io"
	subresourcesVersion   = "v1"
	consoleProtocol       = "plain.kubevirt.io"
)

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

type subresources struct {
	n    *Node
	srv  *http.Server
	addr string
	ca   []byte
}

// SubresourcesAddr is the address of the node's virt-api (https): where the
// API server's service resolver must send the Service kubevirt/virt-api.
func (n *Node) SubresourcesAddr() string { return n.api.addr }

func startSubresources(n *Node) (*subresources, error) {
	// The API server verifies the name of the Service it dials.
	cert, err := selfsigned.WriteFor(n.cfg.Dir, SubresourcesService+"."+SubresourcesNamespace+".svc")
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
	s := &subresources{n: n, addr: l.Addr().String(), ca: ca}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
			// A WebSocket upgrade is HTTP/1.1.
			NextProtos: []string{"http/1.1"}}}
	go func() { _ = s.srv.ServeTLS(l, "", "") }()
	return s, nil
}

func (s *subresources) close() { _ = s.srv.Close() }

// RegisterSubresources makes the Service and the APIService by which the
// API server serves the node's console and vnc subresources, as
// virt-operator registers virt-api's, and waits (bounded by ctx) until
// the API server reports it Available. The API server must route the
// Service to SubresourcesAddr.
func (n *Node) RegisterSubresources(ctx context.Context) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: SubresourcesService, Namespace: SubresourcesNamespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: SubresourcesPort, Protocol: corev1.ProtocolTCP}},
			Selector: map[string]string{kubevirtv1.AppLabel: "virt-api"}},
	}
	if _, err := n.kube.CoreV1().Services(SubresourcesNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("testnode: virt-api's Service: %w", err)
	}
	// The endpoint the endpointslice controller would list for virt-api's
	// pod: the aggregator's availability check wants a ready one on the
	// Service's port before it dials (through the API server's service
	// resolver, which routes it to SubresourcesAddr). An EndpointSlice may
	// not hold a loopback address, so the endpoint stands at a pod
	// network's address that nothing dials.
	_, portStr, err := net.SplitHostPort(n.api.addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return err
	}
	ready, portName, port32 := true, "", int32(port)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: SubresourcesService + "-node", Namespace: SubresourcesNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: SubresourcesService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.2"}, NodeName: &n.cfg.Name,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port32}},
	}
	if _, err := n.kube.DiscoveryV1().EndpointSlices(SubresourcesNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("testnode: virt-api's EndpointSlice: %w", err)
	}
	apiSvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": subresourcesVersion + "." + subresourcesGroup},
		"spec": map[string]any{
			"group": subresourcesGroup, "version": subresourcesVersion,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"caBundle": base64.StdEncoding.EncodeToString(n.api.ca),
			"service":  map[string]any{"namespace": SubresourcesNamespace, "name": SubresourcesService, "port": int64(SubresourcesPort)},
		},
	}}
	apis := n.dyn.Resource(apiServiceGVR)
	if _, err := apis.Create(ctx, apiSvc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("testnode: virt-api's APIService: %w", err)
	}
	for {
		u, err := apis.Get(ctx, subresourcesVersion+"."+subresourcesGroup, metav1.GetOptions{})
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
			return fmt.Errorf("testnode: the APIService of virt-api is not Available: %v", conds)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ServeHTTP answers the aggregated API's discovery and the two
// subresources.
func (s *subresources) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := "/apis/" + subresourcesGroup + "/" + subresourcesVersion
	switch {
	case r.URL.Path == "/openapi/v2":
		// The aggregator merges every APIService's OpenAPI document; the
		// subresources add no schema of their own.
		writeJSON(w, map[string]any{"swagger": "2.0", "info": map[string]any{"title": "KubeVirt API", "version": subresourcesVersion},
			"paths": map[string]any{}})
	case r.URL.Path == "/openapi/v3":
		writeJSON(w, map[string]any{"paths": map[string]any{}})
	case r.URL.Path == "/apis":
		writeJSON(w, metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
			Groups: []metav1.APIGroup{apiGroup()}})
	case r.URL.Path == "/apis/"+subresourcesGroup:
		g := apiGroup()
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		writeJSON(w, g)
	case r.URL.Path == base:
		writeJSON(w, metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: subresourcesGroup + "/" + subresourcesVersion,
			APIResources: []metav1.APIResource{
				{Name: "virtualmachineinstances/console", Namespaced: true, Kind: "VirtualMachineInstance", Verbs: []string{"get"}},
				{Name: "virtualmachineinstances/vnc", Namespaced: true, Kind: "VirtualMachineInstance", Verbs: []string{"get"}},
			}})
	case strings.HasPrefix(r.URL.Path, base+"/namespaces/"):
		// .../namespaces/{ns}/virtualmachineinstances/{name}/{console|vnc}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, base+"/namespaces/"), "/")
		if len(parts) != 4 || parts[1] != "virtualmachineinstances" || (parts[3] != "console" && parts[3] != "vnc") {
			http.NotFound(w, r)
			return
		}
		s.console(w, r, parts[0], parts[2], parts[3])
	default:
		http.NotFound(w, r)
	}
}

func apiGroup() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: subresourcesGroup + "/" + subresourcesVersion, Version: subresourcesVersion}
	return metav1.APIGroup{Name: subresourcesGroup, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// console bridges the WebSocket to the VMI's serial port (sub "console")
// or VNC socket ("vnc"), after virt-api's checks: the VMI exists
// (404) and is Running (400 in virt-api's words).
func (s *subresources) console(w http.ResponseWriter, r *http.Request, ns, name, sub string) {
	obj, exists, err := s.n.vmis.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !exists {
		http.Error(w, fmt.Sprintf("virtualmachineinstance.kubevirt.io %q not found", name), http.StatusNotFound)
		return
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, &vmi); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	d := s.n.domainByKey(ns + "/" + name)
	if vmi.Status.Phase != kubevirtv1.Running || d == nil || d.vmiUID != string(vmi.UID) {
		http.Error(w, fmt.Sprintf("Unable to connect to VirtualMachineInstance because phase is %s instead of Running", vmi.Status.Phase),
			http.StatusBadRequest)
		return
	}
	sock := d.serial
	if sub == "vnc" {
		sock = d.vnc
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	target, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
	cancel()
	if err != nil {
		http.Error(w, fmt.Sprintf("Can't connect to websocket (%s): %v", sub, err), http.StatusServiceUnavailable)
		return
	}
	defer target.Close()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{consoleProtocol},
		// The API server proxies the upgrade; the Origin is the client's.
		InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ws.SetReadLimit(-1)
	conn := websocket.NetConn(s.n.ctx, ws, websocket.MessageBinary)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(target, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, target); done <- struct{}{} }()
	select {
	case <-done:
	case <-s.n.ctx.Done():
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}
