package testnode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vmshelf/vmshelf/provisioner/kubetest/virtapi"
)

// The node's virt-api: virtapi's aggregated API, KubeVirt's own start,
// stop and restart handlers, and the VMIs' console and vnc served here,
// as KubeVirt serves them: a WebSocket whose binary messages carry the
// bytes of the domain's serial port or VNC socket (pkg/virt-api/rest: the
// plain.kubevirt.io protocol). virt-api reaches the socket through
// virt-handler; here the node dials it itself.

// Names of the aggregated API, as virt-operator registers it.
const (
	SubresourcesNamespace = virtapi.Namespace
	SubresourcesService   = virtapi.Service
	SubresourcesPort      = virtapi.Port
	consoleProtocol       = "plain.kubevirt.io"
)

// SubresourcesAddr is the address of the node's virt-api (https): where the
// API server's service resolver must send the Service kubevirt/virt-api.
func (n *Node) SubresourcesAddr() string { return n.api.Addr() }

func startSubresources(n *Node) (*virtapi.Server, error) {
	return virtapi.Start(virtapi.Config{Dir: n.cfg.Dir, Admin: n.cfg.Admin, ClusterConfig: n.cfg.ClusterConfig,
		NodeName: n.cfg.Name, Console: n.console})
}

// RegisterSubresources makes the Service and the APIService by which the
// API server serves the node's virt-api, as virt-operator registers
// virt-api's, and waits (bounded by ctx) until the API server reports it
// Available. The API server must route the Service to SubresourcesAddr.
func (n *Node) RegisterSubresources(ctx context.Context) error {
	return n.api.Register(ctx)
}

// console bridges the WebSocket to the VMI's serial port (sub "console")
// or VNC socket ("vnc"), after virt-api's checks: the VMI exists
// (404) and is Running (400 in virt-api's words).
func (n *Node) console(w http.ResponseWriter, r *http.Request, ns, name, sub string) {
	obj, exists, err := n.vmis.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !exists {
		http.Error(w, fmt.Sprintf("virtualmachineinstance.kubevirt.io %q not found", name), http.StatusNotFound)
		return
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, &vmi); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	d := n.domainByKey(ns + "/" + name)
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
	conn := websocket.NetConn(n.ctx, ws, websocket.MessageBinary)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(target, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, target); done <- struct{}{} }()
	select {
	case <-done:
	case <-n.ctx.Done():
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}
