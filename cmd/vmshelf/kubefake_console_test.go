package main

// The in-memory Kubernetes API's console subresources: what KubeVirt's
// virt-api serves at
// /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/vnc
// and …/console, a WebSocket of the plain.kubevirt.io protocol carrying the
// raw bytes of the machine's VNC server or serial line. Here they are
// backed by a real QEMU (internal/testkit/testguest) the test registers.

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// kubeConsolePrefix is the path of KubeVirt's subresource API group.
const kubeConsolePrefix = "/apis/subresources.kubevirt.io/v1/namespaces/"

// consoleBackends are the consoles the fake serves, by "ns/vmi/sub" (sub
// "vnc" or "console"); a VMI without one is 404, as virt-api answers for
// a VMI that does not exist.
type consoleBackends struct {
	mu   sync.Mutex
	dial map[string]func(ctx context.Context) (net.Conn, error)
	// opened counts the WebSockets the fake accepted, by key.
	opened map[string]int
	// hang is how a console of a key hangs instead (consoleHang), and
	// hanging counts the requests hanging now.
	hang    map[string]consoleHang
	hanging int
}

// consoleHang is how a stalled virt-api (or an API server in front of it)
// hangs a console request.
type consoleHang int

const (
	// hangBeforeUpgrade takes the request and never answers it: no 101,
	// no error, until the client goes away.
	hangBeforeUpgrade consoleHang = iota + 1
	// hangAfterUpgrade answers 101 and then neither reads nor writes a
	// byte until the test ends.
	hangAfterUpgrade
)

// setConsoleHang makes the fake hang every request of sub ("vnc" or
// "console") of VMI vmi (in any namespace) as h says.
func (f *kubeFake) setConsoleHang(vmi, sub string, h consoleHang) {
	f.consoles.mu.Lock()
	defer f.consoles.mu.Unlock()
	if f.consoles.hang == nil {
		f.consoles.hang = map[string]consoleHang{}
	}
	f.consoles.hang["/"+vmi+"/"+sub] = h
}

// consolesHanging is how many console requests the fake holds hanging
// now: a request is let go when its client closes the connection.
func (f *kubeFake) consolesHanging() int {
	f.consoles.mu.Lock()
	defer f.consoles.mu.Unlock()
	return f.consoles.hanging
}

// serveHang holds a console request as h says until its client goes away
// (hangBeforeUpgrade) or the fake closes (hangAfterUpgrade).
func (f *kubeFake) serveHang(w http.ResponseWriter, r *http.Request, h consoleHang) {
	f.consoles.mu.Lock()
	f.consoles.hanging++
	f.consoles.mu.Unlock()
	defer func() {
		f.consoles.mu.Lock()
		f.consoles.hanging--
		f.consoles.mu.Unlock()
	}()
	if h == hangBeforeUpgrade {
		<-r.Context().Done() // net/http ends it when the client's connection closes
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"plain.kubevirt.io"}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	<-f.closing
}

// setConsole makes the fake serve sub ("vnc" or "console") of VMI vmi in
// ns by dialing dial for each WebSocket. An empty ns matches any.
func (f *kubeFake) setConsole(ns, vmi, sub string, dial func(ctx context.Context) (net.Conn, error)) {
	f.consoles.mu.Lock()
	defer f.consoles.mu.Unlock()
	if f.consoles.dial == nil {
		f.consoles.dial, f.consoles.opened = map[string]func(context.Context) (net.Conn, error){}, map[string]int{}
	}
	f.consoles.dial[ns+"/"+vmi+"/"+sub] = dial
}

// consolesOpened is how many console WebSockets the fake accepted.
func (f *kubeFake) consolesOpened() int {
	f.consoles.mu.Lock()
	defer f.consoles.mu.Unlock()
	n := 0
	for _, k := range f.consoles.opened {
		n += k
	}
	return n
}

// serveConsole answers a console subresource request and reports true, or
// reports false for any other path.
func (f *kubeFake) serveConsole(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, kubeConsolePrefix)
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/") // ns, virtualmachineinstances, name, sub
	power := len(parts) == 4 && parts[1] == "virtualmachines" && (parts[3] == "start" || parts[3] == "stop" || parts[3] == "restart")
	if !power && (len(parts) != 4 || parts[1] != "virtualmachineinstances" || (parts[3] != "vnc" && parts[3] != "console")) {
		http.Error(w, "not found", http.StatusNotFound)
		return true
	}
	if r.Header.Get("Authorization") != "Bearer "+kubeFakeToken {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return true
	}
	if power {
		f.servePower(w, r, parts[0], parts[2], parts[3])
		return true
	}
	ns, vmi, sub := parts[0], parts[2], parts[3]
	f.consoles.mu.Lock()
	hang := f.consoles.hang["/"+vmi+"/"+sub]
	f.consoles.mu.Unlock()
	if hang != 0 {
		f.serveHang(w, r, hang)
		return true
	}
	f.consoles.mu.Lock()
	dial := f.consoles.dial[ns+"/"+vmi+"/"+sub]
	if dial == nil {
		dial = f.consoles.dial["/"+vmi+"/"+sub]
	}
	f.consoles.mu.Unlock()
	if dial == nil {
		http.Error(w, "VirtualMachineInstance "+vmi+" not found", http.StatusNotFound)
		return true
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"plain.kubevirt.io"}})
	if err != nil {
		return true
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	vm, err := dial(ctx)
	if err != nil {
		_ = c.Close(websocket.StatusInternalError, "dialing the machine: "+err.Error())
		return true
	}
	defer vm.Close()
	f.consoles.mu.Lock()
	f.consoles.opened[ns+"/"+vmi+"/"+sub]++
	f.consoles.mu.Unlock()
	ws := websocket.NetConn(ctx, c, websocket.MessageBinary)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(vm, ws); done <- struct{}{} }()
	go func() { _, _ = io.Copy(ws, vm); done <- struct{}{} }()
	<-done
	_ = ws.Close()
	return true
}
