package testnode

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// proxy plays kube-proxy for the Services of the cluster: each TCP port of
// a Service with a selector gets a listener on 127.0.0.1 (standing for the
// Service's cluster IP and port), and each connection to it goes to a
// ready endpoint: a running pod of this node whose labels the selector
// matches, at the port the Service's targetPort names there. A Service
// that selects no such pod has no endpoint: its connections are closed at
// once, as kube-proxy rejects them.
type proxy struct {
	n *Node
	q *queue

	mu        sync.Mutex
	listeners map[string]*serviceListener // by namespace/name/port
}

// proxyResync is the one key of the proxy's queue: every change looks at
// all Services again.
const proxyResync = "resync"

type serviceListener struct {
	l        net.Listener
	selector labels.Selector
	ns       string
	target   intstr.IntOrString
	next     int // round robin
}

func newProxy(n *Node) *proxy {
	p := &proxy{n: n, listeners: map[string]*serviceListener{}}
	p.q = newQueue("kube-proxy", p.sync, n.logf)
	return p
}

// ServiceAddr is where the node serves port of Service ns/name (what
// kube-proxy makes of its cluster IP), once the node has seen it.
func (n *Node) ServiceAddr(ns, name string, port int32) (string, bool) {
	n.proxy.mu.Lock()
	defer n.proxy.mu.Unlock()
	sl, ok := n.proxy.listeners[fmt.Sprintf("%s/%s/%d", ns, name, port)]
	if !ok {
		return "", false
	}
	return sl.l.Addr().String(), true
}

// sync opens a listener for each Service port not yet served and updates
// the selector and target of those that are.
func (p *proxy) sync(context.Context, string) error {
	seen := map[string]bool{}
	for _, obj := range p.n.services.GetStore().List() {
		svc := obj.(*corev1.Service)
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		for _, port := range svc.Spec.Ports {
			if port.Protocol != corev1.ProtocolTCP && port.Protocol != "" {
				continue
			}
			key := fmt.Sprintf("%s/%s/%d", svc.Namespace, svc.Name, port.Port)
			seen[key] = true
			p.mu.Lock()
			if p.n.ctx.Err() != nil {
				// The node is closing (close has run or waits for mu).
				p.mu.Unlock()
				return nil
			}
			sl, ok := p.listeners[key]
			if !ok {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					p.mu.Unlock()
					return err
				}
				sl = &serviceListener{l: l, ns: svc.Namespace}
				p.listeners[key] = sl
				p.n.wg.Add(1)
				go func() { defer p.n.wg.Done(); p.serve(sl) }()
			}
			sl.selector = labels.SelectorFromSet(svc.Spec.Selector)
			sl.target = port.TargetPort
			if sl.target.IntVal == 0 && sl.target.StrVal == "" {
				sl.target = intstr.FromInt32(port.Port)
			}
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, sl := range p.listeners {
		if !seen[key] {
			sl.l.Close()
			delete(p.listeners, key)
		}
	}
	return nil
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, sl := range p.listeners {
		sl.l.Close()
		delete(p.listeners, key)
	}
}

func (p *proxy) serve(sl *serviceListener) {
	for {
		c, err := sl.l.Accept()
		if err != nil {
			return
		}
		p.n.wg.Add(1)
		go func() { defer p.n.wg.Done(); p.forward(sl, c) }()
	}
}

// forward joins c to an endpoint of the Service, or closes it when the
// Service has none.
func (p *proxy) forward(sl *serviceListener, c net.Conn) {
	defer c.Close()
	addr := p.endpoint(sl)
	if addr == "" {
		return
	}
	up, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		p.n.logf("testnode: kube-proxy: %v", err)
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	select {
	case <-done:
		<-done
	case <-p.n.ctx.Done():
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// endpoint picks the next ready endpoint of the Service: a running launcher
// pod of this node that the selector matches, whose domain forwards the
// target port (the pod's port 80 is the guest's, as masquerade forwards
// it). "" if there is none.
func (p *proxy) endpoint(sl *serviceListener) string {
	p.mu.Lock()
	selector, target := sl.selector, sl.target
	p.mu.Unlock()
	var addrs []string
	for _, obj := range p.n.pods.GetStore().List() {
		pod := obj.(*corev1.Pod)
		if pod.Namespace != sl.ns || pod.Spec.NodeName != p.n.cfg.Name || pod.Status.Phase != corev1.PodRunning ||
			pod.DeletionTimestamp != nil || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		d := p.n.domainOfPod(pod)
		if d == nil || target.IntValue() != guestHTTPPort {
			continue
		}
		if ended, _ := d.ended(); !ended {
			addrs = append(addrs, d.httpFwd)
		}
	}
	if len(addrs) == 0 {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sl.next++
	return addrs[sl.next%len(addrs)]
}
