package main

// The in-memory Kubernetes API's power subresources: what KubeVirt's
// virt-api serves at
// /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/start,
// …/stop and …/restart, for the run strategies the provisioner writes
// (Always, and Halted at an order's end): start turns Halted into Always,
// stop Always into Halted, restart restarts a VM that is not Halted, and
// each answers 409 otherwise, in virt-api's words. The VM's printable
// status follows at once, as a quick KubeVirt's would. provisioner/kubetest
// runs KubeVirt's own handlers and controllers for the real thing.

import (
	"encoding/json"
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// servePower answers a power subresource of the VM name in ns.
func (f *kubeFake) servePower(w http.ResponseWriter, r *http.Request, ns, name, sub string) {
	f.mu.Lock()
	a := f.powerLocked(r.Method, ns, name, sub)
	f.requests = append(f.requests, kubeRequest{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"),
		UserAgent: r.UserAgent(), Authorized: true, Code: a.code, Unexpected: a.unexpected})
	f.mu.Unlock()
	b, _ := json.Marshal(a.body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.code)
	_, _ = w.Write(b)
}

// powerLocked does sub to the VM; f.mu is held.
func (f *kubeFake) powerLocked(method, ns, name, sub string) kubeAnswer {
	gr := schema.GroupResource{Group: "kubevirt.io", Resource: "virtualmachine"}
	if method != http.MethodPut {
		return kubeStatus(apierrors.NewMethodNotSupported(gr, method), true)
	}
	if f.powerFailing {
		return kubeStatus(apierrors.NewServiceUnavailable("virt-api is not available"), false)
	}
	key := kubeKey{gv: "kubevirt.io/v1", resource: "virtualmachines", namespace: ns, name: name}
	vm, ok := f.objs[key]
	if !ok {
		return kubeStatus(apierrors.NewNotFound(gr, name), false)
	}
	spec, _ := vm["spec"].(map[string]any)
	halted := spec["runStrategy"] == "Halted"
	conflict := func(msg string) kubeAnswer {
		return kubeStatus(apierrors.NewConflict(gr, name, errors.New(msg)), false)
	}
	switch {
	case sub == "start" && !halted:
		return conflict("VM is already running")
	case sub == "stop" && halted:
		return conflict("VM is not running")
	case sub == "restart" && halted:
		return conflict("RunStategy Halted does not support manual restart requests")
	case sub == "start":
		spec["runStrategy"] = "Always"
		f.setStatusLocked(key, map[string]any{"printableStatus": "Running"})
	case sub == "stop":
		spec["runStrategy"] = "Halted"
		f.setStatusLocked(key, map[string]any{"printableStatus": "Stopped"})
	}
	f.restarts[key] += map[bool]int{true: 1}[sub == "restart"]
	return kubeAnswer{code: http.StatusAccepted, body: map[string]any{}}
}

// restartsOf is how many restarts VM name (in any namespace) took.
func (f *kubeFake) restartsOf(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	key, _ := f.findLocked(kubeKindNamed("VirtualMachine"), "", name)
	return f.restarts[key]
}

// runStrategyOf is the spec.runStrategy of VM name (in any namespace).
func (f *kubeFake) runStrategyOf(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	key, _ := f.findLocked(kubeKindNamed("VirtualMachine"), "", name)
	spec, _ := f.objs[key]["spec"].(map[string]any)
	s, _ := spec["runStrategy"].(string)
	return s
}

// failPower makes every power subresource answer 503, as virt-api that
// does not answer (behind a running API server) is told.
func (f *kubeFake) failPower() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.powerFailing = true
}
