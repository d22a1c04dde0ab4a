package main

// kubeFake: an in-memory stand-in for the Kubernetes API server that
// `vmshelf serve --vms-enable` talks to, so that the binary's tests (this
// package's e2e tests and the browser tests of the machines page) can
// place an order and watch its machines appear without a cluster. It
// speaks exactly the REST the provisioner's client-go clients send
// (provisioner/cluster.go), keeps objects as the JSON they were sent in,
// and lets a test play KubeVirt and CDI: give a VM a printable status,
// give a replica's DataVolume (which the provisioner makes itself, before
// the VM) a phase and a progress.
//
// It is no validating API server (provisioner/kubetest runs the real
// one); it is faithful where the provisioner's safety depends on it: only
// a missing object is NotFound, a second create is AlreadyExists, objects
// need their namespace, status is the status subresource's alone, every
// write must ask for strict field validation (fieldValidation=Strict), and
// a DELETE is never carried out but recorded, so a test can assert none
// came.

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	kubescheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	kubevirtclient "kubevirt.io/client-go/kubevirt"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/provisioner"
)

// kubeFakeToken is the bearer token kubeconfigFile hands out; the fake
// answers 401 to any other credentials, so a test that gets past Ping
// proves the binary sent what its kubeconfig says.
const kubeFakeToken = "kube-token-e2e-not-a-real-one"

// kubeKind is one kind the fake serves, at its one REST path.
type kubeKind struct {
	gv, resource, kind string
	namespaced         bool
	custom             bool // a CRD's kind: no strategic merge patch
}

// kubeKinds are the provisioner's kinds (docs/deploy/components/market/rbac.yaml
// grants the same six).
var kubeKinds = []kubeKind{
	{gv: "v1", resource: "namespaces", kind: "Namespace"},
	{gv: "v1", resource: "secrets", kind: "Secret", namespaced: true},
	{gv: "v1", resource: "services", kind: "Service", namespaced: true},
	{gv: "networking.k8s.io/v1", resource: "ingresses", kind: "Ingress", namespaced: true},
	{gv: "kubevirt.io/v1", resource: "virtualmachines", kind: "VirtualMachine", namespaced: true, custom: true},
	{gv: "cdi.kubevirt.io/v1beta1", resource: "datavolumes", kind: "DataVolume", namespaced: true, custom: true},
}

func (k kubeKind) groupResource() schema.GroupResource {
	gv, _ := schema.ParseGroupVersion(k.gv)
	return schema.GroupResource{Group: gv.Group, Resource: k.resource}
}

func (k kubeKind) groupKind() schema.GroupKind {
	gv, _ := schema.ParseGroupVersion(k.gv)
	return schema.GroupKind{Group: gv.Group, Kind: k.kind}
}

// kubeKindNamed is the kind called kind ("VirtualMachine"). A kind the
// fake does not serve is a mistake in the calling test: it panics (a
// t.Fatal would be on the wrong goroutine when a subtest asks).
func kubeKindNamed(kind string) kubeKind {
	for _, k := range kubeKinds {
		if k.kind == kind {
			return k
		}
	}
	panic(fmt.Sprintf("kubeFake serves no kind %q", kind))
}

// kubeKey names one stored object.
type kubeKey struct {
	gv, resource, namespace, name string
}

// kubeRequest is one request the fake answered. The Authorization header
// is not kept, only whether it carried kubeFakeToken.
type kubeRequest struct {
	Method, Path, Query string
	ContentType         string
	UserAgent           string
	Authorized          bool
	Code                int // the status the fake answered
	// Unexpected is set when the request is not one the provisioner's
	// clients send (unknown path, verb or patch type): a test asserts
	// there are none, so the fake never silently answers what it does not
	// implement.
	Unexpected bool
}

func (r kubeRequest) String() string {
	q := ""
	if r.Query != "" {
		q = "?" + r.Query
	}
	return fmt.Sprintf("%s %s%s → %d", r.Method, r.Path, q, r.Code)
}

// pendingVM is what a test arranged for a VM before the provisioner made
// it (ns "" matches any namespace).
type pendingVM struct{ ns, name, status string }

// pendingDV is a DataVolume status a test arranged before the provisioner
// made the DataVolume.
type pendingDV struct{ ns, name, phase, progress string }

// kubeFake is the stand-in API server. Build it with newKubeFake; hand
// its URL and ca() to kubeconfigFile.
type kubeFake struct {
	*httptest.Server

	mu        sync.Mutex
	rv        int64 // the last resourceVersion given out, across all objects (as etcd's revision)
	objs      map[kubeKey]map[string]any
	requests  []kubeRequest
	pendingVM []pendingVM
	pendingDV []pendingDV
	consoles  consoleBackends // the console subresources (kubefake_console_test.go)
	restarts  map[kubeKey]int // restarts the power subresources took (kubefake_power_test.go)
	// powerFailing makes the power subresources answer 503.
	powerFailing bool
	// closing is closed when the test ends, before the server closes:
	// it lets go of what the fake holds (a hung console).
	closing chan struct{}
}

// newKubeFake starts the fake on 127.0.0.1 over TLS (client-go sends a
// bearer token only so) and stops it when the test ends. It answers GET
// /version; GET, POST, PUT and PATCH (JSON merge patch, JSON patch) of
// namespaces, secrets, services, ingresses, KubeVirt VirtualMachines and
// CDI DataVolumes, with their status subresource; a write without
// fieldValidation=Strict with 400, DELETE with 405, and anything else with
// 404 or 405, all marked unexpected.
func newKubeFake(t *testing.T) *kubeFake {
	t.Helper()
	f := &kubeFake{objs: map[kubeKey]map[string]any{}, restarts: map[kubeKey]int{}, closing: make(chan struct{})}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(f.serveHTTP))
	t.Cleanup(func() {
		close(f.closing)
		f.Close()
	})
	return f
}

// ca is the fake's certificate, PEM-encoded, for kubeconfigFile.
func (f *kubeFake) ca() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
}

// kubeconfig writes a kubeconfig for the fake (kubeconfigFile) and
// returns its path, for serve's --kubeconfig.
func (f *kubeFake) kubeconfig(t *testing.T) string {
	t.Helper()
	return kubeconfigFile(t, f.URL, f.ca())
}

// kubeAnswer is what handle decided: a status code and a body to send as
// JSON (an object, or a *metav1.Status).
type kubeAnswer struct {
	code       int
	body       any
	unexpected bool
}

func (f *kubeFake) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if f.serveConsole(w, r) {
		return
	}
	rec := kubeRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		ContentType: r.Header.Get("Content-Type"), UserAgent: r.UserAgent(),
		Authorized: r.Header.Get("Authorization") == "Bearer "+kubeFakeToken}
	body, readErr := kubeReadBody(r)
	// The answer is encoded under the lock: it may be a stored object,
	// which the test's helpers change.
	f.mu.Lock()
	var a kubeAnswer
	switch {
	case !rec.Authorized:
		a = kubeStatus(apierrors.NewUnauthorized("Unauthorized"), false)
	case readErr != nil:
		a = kubeStatus(apierrors.NewBadRequest("reading the body: "+readErr.Error()), true)
	default:
		a = f.handle(r.Method, r.URL.Path, r.URL.Query().Get("fieldValidation"), rec.ContentType, body)
	}
	b, err := json.Marshal(a.body)
	if err != nil {
		a = kubeStatus(apierrors.NewInternalError(err), true)
		b, _ = json.Marshal(a.body)
	}
	rec.Code, rec.Unexpected = a.code, a.unexpected
	f.requests = append(f.requests, rec)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.code)
	_, _ = w.Write(b)
}

// kubeReadBody reads at most 3 MiB (the API server's own limit for most
// requests).
func kubeReadBody(r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(nil, r.Body, 3<<20))
	return buf.Bytes(), err
}

// kubeStatus is a refusal as the API server sends it: a metav1.Status
// with its kind, which client-go turns back into the same error.
func kubeStatus(se *apierrors.StatusError, unexpected bool) kubeAnswer {
	st := se.ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	return kubeAnswer{code: int(st.Code), body: &st, unexpected: unexpected}
}

// kubeUnsupported is the 415 of a body or patch type the server does not take.
func kubeUnsupported(msg string, unexpected bool) kubeAnswer {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType, Message: msg}
	return kubeAnswer{code: http.StatusUnsupportedMediaType, body: &st, unexpected: unexpected}
}

// kubePath splits a REST path into its kind, namespace, name and
// subresource; ok is false for a path the fake does not serve.
func kubePath(p string) (k kubeKind, ns, name, sub string, ok bool) {
	seg := strings.Split(strings.Trim(p, "/"), "/")
	var gv string
	switch {
	case len(seg) >= 3 && seg[0] == "api":
		gv, seg = seg[1], seg[2:]
	case len(seg) >= 4 && seg[0] == "apis":
		gv, seg = seg[1]+"/"+seg[2], seg[3:]
	default:
		return kubeKind{}, "", "", "", false
	}
	find := func(resource string, namespaced bool) (kubeKind, bool) {
		for _, k := range kubeKinds {
			if k.gv == gv && k.resource == resource && k.namespaced == namespaced {
				return k, true
			}
		}
		return kubeKind{}, false
	}
	// namespaces/<ns>/<resource>[/<name>[/<sub>]], else
	// <resource>[/<name>[/<sub>]] of a cluster-scoped kind.
	if len(seg) >= 3 && len(seg) <= 5 && seg[0] == "namespaces" {
		if k, found := find(seg[2], true); found {
			ns = seg[1]
			seg = seg[2:]
			if len(seg) > 1 {
				name = seg[1]
			}
			if len(seg) > 2 {
				sub = seg[2]
			}
			return k, ns, name, sub, (sub == "" || sub == "status") && ns != ""
		}
	}
	if len(seg) > 3 {
		return kubeKind{}, "", "", "", false
	}
	k, found := find(seg[0], false)
	if !found {
		return kubeKind{}, "", "", "", false
	}
	if len(seg) > 1 {
		name = seg[1]
	}
	if len(seg) > 2 {
		sub = seg[2]
	}
	return k, "", name, sub, sub == "" || sub == "status"
}

// handle answers one authorized request, sent with the fieldValidation
// query parameter fieldValidation; f.mu is held.
func (f *kubeFake) handle(method, path, fieldValidation, contentType string, body []byte) kubeAnswer {
	if method == http.MethodGet && path == "/version" {
		return kubeAnswer{code: http.StatusOK, body: map[string]string{"major": "1", "minor": "34", "gitVersion": "v1.34.3",
			"goVersion": "go1.24", "platform": "linux/amd64"}}
	}
	k, ns, name, sub, ok := kubePath(path)
	if !ok {
		return kubeStatus(apierrors.NewNotFound(schema.GroupResource{}, path), true)
	}
	gr := k.groupResource()
	if method == http.MethodDelete {
		// Never carried out: the provisioner deletes nothing, and a
		// test asserts that no DELETE came (deletes).
		return kubeStatus(apierrors.NewMethodNotSupported(gr, "delete"), true)
	}
	if method != http.MethodGet && fieldValidation != metav1.FieldValidationStrict {
		// The provisioner writes nothing a schema could drop unseen
		// (provisioner/cluster.go, strict).
		return kubeStatus(apierrors.NewBadRequest(fmt.Sprintf("the fake takes writes with fieldValidation=Strict only, not %q",
			fieldValidation)), true)
	}
	key := kubeKey{gv: k.gv, resource: k.resource, namespace: ns, name: name}
	switch {
	case method == http.MethodGet && name != "":
		obj, found := f.objs[key]
		if !found {
			return kubeStatus(apierrors.NewNotFound(gr, name), false)
		}
		return kubeAnswer{code: http.StatusOK, body: obj}
	case method == http.MethodPost && name == "":
		return f.create(k, ns, contentType, body)
	case method == http.MethodPut && name != "":
		return f.update(k, key, sub, contentType, body)
	case method == http.MethodPatch && name != "":
		return f.patch(k, key, sub, contentType, body)
	}
	return kubeStatus(apierrors.NewMethodNotSupported(gr, strings.ToLower(method)), true)
}

// kubeDecode reads an object body: JSON, or for Kubernetes' own kinds
// the protobuf client-go sends them in (since v0.33), decoded by
// client-go's scheme. Numbers are kept exact.
func kubeDecode(k kubeKind, contentType string, body []byte) (map[string]any, *kubeAnswer) {
	switch mt, _, _ := mime.ParseMediaType(contentType); {
	case mt == "application/vnd.kubernetes.protobuf" && !k.custom:
		obj, gvk, err := kubescheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			a := kubeStatus(apierrors.NewBadRequest(fmt.Sprintf("the body does not decode: %v", err)), true)
			return nil, &a
		}
		if body, err = json.Marshal(obj); err != nil {
			a := kubeStatus(apierrors.NewInternalError(err), true)
			return nil, &a
		}
		m, bad := kubeDecode(k, "application/json", body)
		if bad == nil {
			m["apiVersion"], m["kind"] = gvk.GroupVersion().String(), gvk.Kind
		}
		return m, bad
	case mt != "application/json":
		a := kubeUnsupported("the body is "+contentType+", the fake takes application/json (and protobuf for Kubernetes' own kinds)", true)
		return nil, &a
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil {
		a := kubeStatus(apierrors.NewBadRequest(fmt.Sprintf("the body is not a JSON object: %v", err)), true)
		return nil, &a
	}
	return obj, nil
}

// kubeMeta is obj's metadata, made if missing.
func kubeMeta(obj map[string]any) map[string]any {
	m, ok := obj["metadata"].(map[string]any)
	if !ok {
		m = map[string]any{}
		obj["metadata"] = m
	}
	return m
}

// kubeStr is m[k] if it is a string.
func kubeStr(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func (f *kubeFake) nextRV() string {
	f.rv++
	return strconv.FormatInt(f.rv, 10)
}

// kubeCheckType refuses an object that says it is another kind.
func kubeCheckType(k kubeKind, obj map[string]any) *kubeAnswer {
	if av, kind := kubeStr(obj, "apiVersion"), kubeStr(obj, "kind"); (av != "" && av != k.gv) || (kind != "" && kind != k.kind) {
		a := kubeStatus(apierrors.NewBadRequest(fmt.Sprintf("the body is a %s %s, the path is for %s %s", av, kind, k.gv, k.kind)), true)
		return &a
	}
	obj["apiVersion"], obj["kind"] = k.gv, k.kind
	return nil
}

func (f *kubeFake) create(k kubeKind, ns, contentType string, body []byte) kubeAnswer {
	obj, bad := kubeDecode(k, contentType, body)
	if bad != nil {
		return *bad
	}
	if bad := kubeCheckType(k, obj); bad != nil {
		return *bad
	}
	m := kubeMeta(obj)
	name := kubeStr(m, "name")
	if name == "" {
		return kubeStatus(apierrors.NewInvalid(k.groupKind(), "", field.ErrorList{
			field.Required(field.NewPath("metadata", "name"), "name or generateName is required")}), true)
	}
	if k.namespaced {
		if got := kubeStr(m, "namespace"); got != "" && got != ns {
			return kubeStatus(apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request"), true)
		}
		// As the real API server: an object needs its namespace first.
		if _, found := f.objs[kubeKey{gv: "v1", resource: "namespaces", name: ns}]; !found {
			return kubeStatus(apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns), false)
		}
		m["namespace"] = ns
	}
	key := kubeKey{gv: k.gv, resource: k.resource, namespace: ns, name: name}
	if _, found := f.objs[key]; found {
		return kubeStatus(apierrors.NewAlreadyExists(k.groupResource(), name), false)
	}
	m["uid"] = string(uuid.NewUUID())
	m["resourceVersion"] = f.nextRV()
	m["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	// Status is the status subresource's: what a create sends is
	// dropped, as by the real API server.
	delete(obj, "status")
	if k.kind == "Namespace" {
		obj["status"] = map[string]any{"phase": "Active"}
	}
	f.objs[key] = obj
	switch k.kind {
	case "VirtualMachine":
		f.vmCreated(key)
	case "DataVolume":
		f.dvCreated(key)
	}
	return kubeAnswer{code: http.StatusCreated, body: obj}
}

// replace stores next in place of the object at key as a PUT or PATCH of
// sub would: the main resource keeps its status, the status subresource
// changes only the status; identity stays.
func (f *kubeFake) replace(k kubeKind, key kubeKey, sub string, next map[string]any) kubeAnswer {
	old := f.objs[key]
	om, nm := kubeMeta(old), kubeMeta(next)
	if n := kubeStr(nm, "name"); n != key.name {
		return kubeStatus(apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", n, key.name)), true)
	}
	if rv := kubeStr(nm, "resourceVersion"); rv != "" && rv != kubeStr(om, "resourceVersion") {
		return kubeStatus(apierrors.NewConflict(k.groupResource(), key.name,
			fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again")), false)
	}
	if sub == "status" {
		st, hasStatus := next["status"]
		next = kubeCopy(old)
		if hasStatus {
			next["status"] = st
		}
		nm = kubeMeta(next)
	} else {
		if st, ok := old["status"]; ok {
			next["status"] = st
		} else {
			delete(next, "status")
		}
	}
	for _, fld := range []string{"uid", "creationTimestamp", "namespace"} {
		if v, ok := om[fld]; ok {
			nm[fld] = v
		}
	}
	next["apiVersion"], next["kind"] = k.gv, k.kind
	nm["resourceVersion"] = f.nextRV()
	f.objs[key] = next
	return kubeAnswer{code: http.StatusOK, body: next}
}

func (f *kubeFake) update(k kubeKind, key kubeKey, sub, contentType string, body []byte) kubeAnswer {
	if _, found := f.objs[key]; !found {
		return kubeStatus(apierrors.NewNotFound(k.groupResource(), key.name), false)
	}
	next, bad := kubeDecode(k, contentType, body)
	if bad != nil {
		return *bad
	}
	if bad := kubeCheckType(k, next); bad != nil {
		return *bad
	}
	if kubeStr(kubeMeta(next), "resourceVersion") == "" {
		return kubeStatus(apierrors.NewInvalid(k.groupKind(), key.name, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "resourceVersion"), "", "must be specified for an update")}), false)
	}
	return f.replace(k, key, sub, next)
}

func (f *kubeFake) patch(k kubeKind, key kubeKey, sub, contentType string, body []byte) kubeAnswer {
	old, found := f.objs[key]
	if !found {
		return kubeStatus(apierrors.NewNotFound(k.groupResource(), key.name), false)
	}
	doc, err := json.Marshal(old)
	if err != nil {
		return kubeStatus(apierrors.NewInternalError(err), true)
	}
	var patched []byte
	switch mt, _, _ := mime.ParseMediaType(contentType); mt {
	case "application/merge-patch+json":
		patched, err = jsonpatch.MergePatch(doc, body)
	case "application/json-patch+json":
		var p jsonpatch.Patch
		if p, err = jsonpatch.DecodePatch(body); err == nil {
			patched, err = p.Apply(doc)
		}
	case "application/strategic-merge-patch+json":
		if k.custom {
			// What the real API server answers for a custom resource
			// (and what the provisioner must never send to a VM).
			return kubeUnsupported("the body of the request was in an unknown format - accepted media types include: "+
				"application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml", false)
		}
		return kubeUnsupported("the fake does not implement strategic merge patches", true)
	default:
		return kubeUnsupported("the fake does not implement patches of type "+contentType, true)
	}
	if err != nil {
		return kubeStatus(apierrors.NewBadRequest("the patch does not apply: "+err.Error()), false)
	}
	next, bad := kubeDecode(k, "application/json", patched)
	if bad != nil {
		return *bad
	}
	if bad := kubeCheckType(k, next); bad != nil {
		return *bad
	}
	return f.replace(k, key, sub, next)
}

// kubeCopy copies a JSON value by a round trip.
func kubeCopy(obj map[string]any) map[string]any {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err) // stored objects came from JSON
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var c map[string]any
	if err := dec.Decode(&c); err != nil {
		panic(err)
	}
	return c
}

// vmCreated plays KubeVirt for a VM just created: it gives the VM the
// printable status a test arranged for it. f.mu is held.
func (f *kubeFake) vmCreated(key kubeKey) {
	f.pendingVM = slices.DeleteFunc(f.pendingVM, func(p pendingVM) bool {
		if p.name != key.name || (p.ns != "" && p.ns != key.namespace) {
			return false
		}
		f.setStatusLocked(key, map[string]any{"printableStatus": p.status})
		return true
	})
}

// dvCreated plays CDI for a DataVolume just created: it gets the phase and
// progress a test arranged for it. f.mu is held.
func (f *kubeFake) dvCreated(key kubeKey) {
	f.pendingDV = slices.DeleteFunc(f.pendingDV, func(p pendingDV) bool {
		if p.name != key.name || (p.ns != "" && p.ns != key.namespace) {
			return false
		}
		f.setStatusLocked(key, kubeDVStatus(p.phase, p.progress))
		return true
	})
}

// setStatusLocked merges fields into the status of the object at key,
// as a controller's status update would. f.mu is held.
func (f *kubeFake) setStatusLocked(key kubeKey, fields map[string]any) {
	obj := f.objs[key]
	st, _ := obj["status"].(map[string]any)
	if st == nil {
		st = map[string]any{}
	}
	for k, v := range fields {
		st[k] = v
	}
	obj["status"] = st
	kubeMeta(obj)["resourceVersion"] = f.nextRV()
}

// findLocked is the key of the object of kind k named name in ns (any
// namespace when ns is ""). f.mu is held.
func (f *kubeFake) findLocked(k kubeKind, ns, name string) (kubeKey, bool) {
	if ns != "" {
		key := kubeKey{gv: k.gv, resource: k.resource, namespace: ns, name: name}
		_, ok := f.objs[key]
		return key, ok
	}
	for key := range f.objs {
		if key.gv == k.gv && key.resource == k.resource && key.name == name {
			return key, true
		}
	}
	return kubeKey{}, false
}

// setVMStatus plays KubeVirt: the VirtualMachine name in namespace ns
// gets status.printableStatus (e.g. "Running", "Starting",
// "ErrImagePull"), with a new resourceVersion. ns "" means whichever
// namespace it is in (a test may not know the buyer's tenant id). If the
// VM does not exist yet, it gets that status the moment it is created,
// before the provisioner reads it back in the same pass, as a quick
// KubeVirt would: so a test can arrange the states an order's first pass
// reports (the provisioner only runs again on a payment or every 30 s).
func (f *kubeFake) setVMStatus(ns, name, printableStatus string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if key, ok := f.findLocked(kubeKindNamed("VirtualMachine"), ns, name); ok {
		f.setStatusLocked(key, map[string]any{"printableStatus": printableStatus})
		return
	}
	f.pendingVM = append(f.pendingVM, pendingVM{ns: ns, name: name, status: printableStatus})
}

// putDataVolume plays CDI: the DataVolume name in namespace ns (a
// replica's is vm-<order>-<i>-disk, made by the provisioner before the
// VM) gets status.phase (e.g. "ImportScheduled", "ImportInProgress",
// "Succeeded", "Failed") and status.progress (CDI's text, e.g. "42.5%",
// shown to the buyer as it is; "" for none), with a new resourceVersion.
// ns "" means whichever namespace it is in. If the DataVolume does not
// exist yet, it gets that status the moment it is created (see
// setVMStatus for why).
func (f *kubeFake) putDataVolume(ns, name, phase, progress string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if key, ok := f.findLocked(kubeKindNamed("DataVolume"), ns, name); ok {
		f.setStatusLocked(key, kubeDVStatus(phase, progress))
		return
	}
	f.pendingDV = append(f.pendingDV, pendingDV{ns: ns, name: name, phase: phase, progress: progress})
}

// kubeDVStatus is a DataVolume's status fields as CDI writes them.
func kubeDVStatus(phase, progress string) map[string]any {
	status := map[string]any{"phase": phase}
	if progress != "" {
		status["progress"] = progress
	}
	return status
}

// objects is every stored object of kind ("Namespace", "Secret",
// "Service", "Ingress", "VirtualMachine", "DataVolume") as JSON (deep
// copies), by namespace and name.
func (f *kubeFake) objects(kind string) []map[string]any {
	k := kubeKindNamed(kind)
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []kubeKey
	for key := range f.objs {
		if key.gv == k.gv && key.resource == k.resource {
			keys = append(keys, key)
		}
	}
	slices.SortFunc(keys, func(a, b kubeKey) int {
		return strings.Compare(a.namespace+"/"+a.name, b.namespace+"/"+b.name)
	})
	out := make([]map[string]any, 0, len(keys))
	for _, key := range keys {
		out = append(out, kubeCopy(f.objs[key]))
	}
	return out
}

// get is the stored object of kind named name in ns ("" for a Namespace)
// as JSON (a deep copy), or nil.
func (f *kubeFake) get(kind, ns, name string) map[string]any {
	k := kubeKindNamed(kind)
	f.mu.Lock()
	defer f.mu.Unlock()
	obj, ok := f.objs[kubeKey{gv: k.gv, resource: k.resource, namespace: ns, name: name}]
	if !ok {
		return nil
	}
	return kubeCopy(obj)
}

// kubeObject is the stored object of kind named name in ns decoded into
// T (e.g. kubevirtv1.VirtualMachine, corev1.Secret); the test fails if
// it is missing or does not decode.
func kubeObject[T any](t *testing.T, f *kubeFake, kind, ns, name string) *T {
	t.Helper()
	obj := f.get(kind, ns, name)
	if obj == nil {
		t.Fatalf("the cluster has no %s %s/%s", kind, ns, name)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s %s/%s does not decode: %v", kind, ns, name, err)
	}
	return v
}

// requestLog is every request the fake answered, in order.
func (f *kubeFake) requestLog() []kubeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// deletes is every DELETE the fake was sent ("DELETE <path>"); the
// provisioner must send none.
func (f *kubeFake) deletes() []string {
	var out []string
	for _, r := range f.requestLog() {
		if r.Method == http.MethodDelete {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	return out
}

// unexpected is every request the fake does not implement (see
// kubeRequest.Unexpected) and every one without kubeFakeToken.
func (f *kubeFake) unexpected() []kubeRequest {
	var out []kubeRequest
	for _, r := range f.requestLog() {
		if r.Unexpected || !r.Authorized {
			out = append(out, r)
		}
	}
	return out
}

// assertClean fails the test if the fake got a DELETE, a request it does
// not implement, one without the kubeconfig's token, or one not from the
// provisioner's client (user agent vmshelf-provisioner).
func (f *kubeFake) assertClean(t *testing.T) {
	t.Helper()
	if d := f.deletes(); len(d) != 0 {
		t.Errorf("the cluster was sent deletes: %v", d)
	}
	for _, r := range f.unexpected() {
		t.Errorf("the cluster got a request the provisioner should not send: %s (authorized %v)", r, r.Authorized)
	}
	for _, r := range f.requestLog() {
		if !strings.HasPrefix(r.UserAgent, "vmshelf-provisioner") {
			t.Errorf("%s came as %q, want vmshelf-provisioner", r, r.UserAgent)
		}
	}
}

// kubeFakeCluster is the provisioner's own Cluster (client-go) over the
// fake, as serve builds it from a kubeconfig.
func kubeFakeCluster(t *testing.T, f *kubeFake) (provisioner.Cluster, *rest.Config) {
	t.Helper()
	rc, err := provisioner.RESTConfig(f.kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := provisioner.ClusterFromConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c, rc
}

// testVM is a replica as the provisioner makes it, in short: a volume
// naming its DataVolume, a run strategy, and a status that a create must
// drop.
func testVM(ns, name string) *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"losos.dev/order": "o1"}},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Volumes: []kubevirtv1.Volume{{Name: "rootdisk", VolumeSource: kubevirtv1.VolumeSource{
					DataVolume: &kubevirtv1.DataVolumeSource{Name: name + "-disk"}}}},
			}},
		},
		Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: "Running"},
	}
}

// testDV is a replica's disk as the provisioner makes it, in short: an
// http source with a checksum, and a status that a create must drop.
func testDV(ns, name string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"losos.dev/replica": "0"}},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{
			URL: "https://example.org/d.qcow2", Checksum: "sha256:" + strings.Repeat("ab", 32)}}},
		Status: cdiv1.DataVolumeStatus{Phase: cdiv1.Succeeded},
	}
}

// TestKubeFakeClientGo drives the fake with the provisioner's real
// client-go clients: each verb the provisioner uses answers as an API
// server would (NotFound, AlreadyExists, a namespace needed first,
// status kept from the subresource, the merge patch), the test's KubeVirt
// and CDI helpers show through GetVM and GetDataVolume, a DELETE is
// refused and recorded, and bad credentials are 401.
func TestKubeFakeClientGo(t *testing.T) {
	ctx := t.Context()
	f := newKubeFake(t)
	c, rc := kubeFakeCluster(t, f)
	const ns = "market-1"

	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if _, err := c.GetNamespace(ctx, ns); !apierrors.IsNotFound(err) {
		t.Fatalf("GetNamespace of a missing one: %v, want NotFound", err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "vm-o1-cloudinit", Namespace: ns},
		Data: map[string][]byte{"userdata": []byte("#cloud-config\n")}}
	if err := c.CreateSecret(ctx, secret); !apierrors.IsNotFound(err) {
		t.Fatalf("CreateSecret before its namespace: %v, want NotFound", err)
	}
	if err := c.CreateNamespace(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
	if err := c.CreateNamespace(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("CreateNamespace again: %v, want AlreadyExists", err)
	}
	got, err := c.GetNamespace(ctx, ns)
	if err != nil || got.Name != ns || got.UID == "" || got.ResourceVersion == "" || got.CreationTimestamp.IsZero() ||
		got.Status.Phase != corev1.NamespaceActive {
		t.Fatalf("GetNamespace: %+v, %v; want it with uid, resourceVersion, creationTimestamp, Active", got, err)
	}

	for _, tc := range []struct {
		kind   string
		create func() error
		get    func() (metav1.Object, error)
	}{
		{"Secret", func() error { return c.CreateSecret(ctx, secret) },
			func() (metav1.Object, error) { return c.GetSecret(ctx, ns, "vm-o1-cloudinit") }},
		{"Service", func() error {
			return c.CreateService(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "vm-o1", Namespace: ns},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
		}, func() (metav1.Object, error) { return c.GetService(ctx, ns, "vm-o1") }},
		{"Ingress", func() error {
			return c.CreateIngress(ctx, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "vm-o1", Namespace: ns}})
		}, func() (metav1.Object, error) { return c.GetIngress(ctx, ns, "vm-o1") }},
		{"DataVolume", func() error { return c.CreateDataVolume(ctx, testDV(ns, "vm-o1-0-disk")) },
			func() (metav1.Object, error) { return c.GetDataVolume(ctx, ns, "vm-o1-0-disk") }},
		{"VirtualMachine", func() error { return c.CreateVM(ctx, testVM(ns, "vm-o1-0")) },
			func() (metav1.Object, error) { return c.GetVM(ctx, ns, "vm-o1-0") }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			if _, err := tc.get(); !apierrors.IsNotFound(err) {
				t.Fatalf("Get before Create: %v, want NotFound", err)
			}
			if err := tc.create(); err != nil {
				t.Fatalf("Create: %v", err)
			}
			if err := tc.create(); !apierrors.IsAlreadyExists(err) {
				t.Fatalf("Create again: %v, want AlreadyExists", err)
			}
			obj, err := tc.get()
			if err != nil || obj.GetNamespace() != ns || obj.GetUID() == "" || obj.GetResourceVersion() == "" {
				t.Fatalf("Get: %v, %v; want it in %s with uid and resourceVersion", obj, err, ns)
			}
			if n := len(f.objects(tc.kind)); n != 1 {
				t.Errorf("the fake holds %d %s objects, want 1", n, tc.kind)
			}
		})
	}
	if s, err := c.GetSecret(ctx, ns, "vm-o1-cloudinit"); err != nil || string(s.Data["userdata"]) != "#cloud-config\n" {
		t.Errorf("the Secret's data came back as %v (%v)", s, err)
	}

	// Status is the subresource's: the create's "Running" is gone; what
	// KubeVirt writes (setVMStatus) shows, and the patch keeps it.
	vm, err := c.GetVM(ctx, ns, "vm-o1-0")
	if err != nil || vm.Status.PrintableStatus != "" {
		t.Fatalf("a new VM has printableStatus %q (%v), want none", vm.Status.PrintableStatus, err)
	}
	rv := vm.ResourceVersion
	f.setVMStatus(ns, "vm-o1-0", "Running")
	if vm, err = c.GetVM(ctx, ns, "vm-o1-0"); err != nil || vm.Status.PrintableStatus != "Running" || vm.ResourceVersion == rv {
		t.Fatalf("after setVMStatus: %q, resourceVersion %s (was %s), %v; want Running with a new resourceVersion",
			vm.Status.PrintableStatus, vm.ResourceVersion, rv, err)
	}
	if err := c.SetRunStrategy(ctx, ns, "vm-o1-0", kubevirtv1.RunStrategyHalted); err != nil {
		t.Fatalf("SetRunStrategy: %v", err)
	}
	halted, err := c.GetVM(ctx, ns, "vm-o1-0")
	if err != nil || halted.Spec.RunStrategy == nil || *halted.Spec.RunStrategy != kubevirtv1.RunStrategyHalted ||
		halted.Status.PrintableStatus != "Running" || halted.ResourceVersion == vm.ResourceVersion || halted.UID != vm.UID ||
		len(halted.Spec.Template.Spec.Volumes) != 1 || halted.Labels["losos.dev/order"] != "o1" {
		t.Fatalf("after the patch: %+v (%v); want Halted, the rest and the status kept, a new resourceVersion", halted, err)
	}
	if err := c.SetRunStrategy(ctx, ns, "vm-o1-9", kubevirtv1.RunStrategyHalted); !apierrors.IsNotFound(err) {
		t.Errorf("SetRunStrategy of a missing VM: %v, want NotFound", err)
	}

	// CDI: the DataVolume the provisioner made gets what CDI writes; a
	// create's status is dropped, the spec and labels stay, and no VM
	// owns it.
	dv, err := c.GetDataVolume(ctx, ns, "vm-o1-0-disk")
	if err != nil || dv.Status.Phase != "" {
		t.Fatalf("a new DataVolume has phase %q (%v), want none", dv.Status.Phase, err)
	}
	f.putDataVolume(ns, "vm-o1-0-disk", "ImportInProgress", "42.5%")
	dv, err = c.GetDataVolume(ctx, ns, "vm-o1-0-disk")
	if err != nil || dv.Status.Phase != cdiv1.ImportInProgress || dv.Status.Progress != "42.5%" ||
		dv.Spec.Source == nil || dv.Spec.Source.HTTP == nil || dv.Spec.Source.HTTP.Checksum != "sha256:"+strings.Repeat("ab", 32) ||
		dv.Labels["losos.dev/replica"] != "0" || len(dv.OwnerReferences) != 0 {
		t.Fatalf("GetDataVolume: %+v (%v); want ImportInProgress 42.5%%, its spec and labels as made, no owner", dv, err)
	}
	f.putDataVolume("", "vm-o1-0-disk", "Succeeded", "100.0%")
	if dv, err = c.GetDataVolume(ctx, ns, "vm-o1-0-disk"); err != nil || dv.Status.Phase != cdiv1.Succeeded || dv.Status.Progress != "100.0%" {
		t.Fatalf("after a second putDataVolume: %+v (%v), want Succeeded 100.0%%", dv.Status, err)
	}

	// Arranged before the VM exists: the first read after its create
	// sees it (the provisioner's first pass).
	f.setVMStatus("", "vm-o1-1", "Starting")
	f.putDataVolume("", "vm-o1-1-disk", "ImportScheduled", "")
	if err := c.CreateDataVolume(ctx, testDV(ns, "vm-o1-1-disk")); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVM(ctx, testVM(ns, "vm-o1-1")); err != nil {
		t.Fatal(err)
	}
	if vm, err := c.GetVM(ctx, ns, "vm-o1-1"); err != nil || vm.Status.PrintableStatus != "Starting" {
		t.Errorf("an arranged VM status came back as %q (%v), want Starting", vm.Status.PrintableStatus, err)
	}
	if dv, err := c.GetDataVolume(ctx, ns, "vm-o1-1-disk"); err != nil || dv.Status.Phase != cdiv1.ImportScheduled {
		t.Errorf("an arranged DataVolume came back as %+v (%v), want ImportScheduled", dv, err)
	}
	if vm := kubeObject[kubevirtv1.VirtualMachine](t, f, "VirtualMachine", ns, "vm-o1-1"); vm.Spec.Template.Spec.Volumes[0].DataVolume.Name != "vm-o1-1-disk" {
		t.Errorf("kubeObject decoded %+v", vm)
	}
	if len(f.unexpected()) != 0 || len(f.deletes()) != 0 {
		t.Fatalf("the provisioner's own calls were unexpected: %v", f.unexpected())
	}

	// Refused, and recorded as what the provisioner must never send: a
	// DELETE, a write without strict field validation, a strategic merge
	// patch of a VM, other credentials.
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.CoreV1().Secrets(ns).Delete(ctx, "vm-o1-cloudinit", metav1.DeleteOptions{}); !apierrors.IsMethodNotSupported(err) {
		t.Errorf("a DELETE: %v, want MethodNotSupported", err)
	}
	if _, err := c.GetSecret(ctx, ns, "vm-o1-cloudinit"); err != nil {
		t.Errorf("the Secret is gone after a refused DELETE: %v", err)
	}
	if d := f.deletes(); !slices.Equal(d, []string{"DELETE /api/v1/namespaces/" + ns + "/secrets/vm-o1-cloudinit"}) {
		t.Errorf("deletes() = %v", d)
	}
	kv, err := kubevirtclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, fv := range []string{"", metav1.FieldValidationWarn, metav1.FieldValidationIgnore} {
		before := len(f.unexpected())
		_, err := kv.KubevirtV1().VirtualMachines(ns).Patch(ctx, "vm-o1-0", types.MergePatchType,
			[]byte(`{"spec":{"runStrategy":"Always"}}`), metav1.PatchOptions{FieldValidation: fv})
		if !apierrors.IsBadRequest(err) || len(f.unexpected()) != before+1 {
			t.Errorf("a patch with fieldValidation %q: %v, want BadRequest, recorded as unexpected", fv, err)
		}
	}
	if vm, err := c.GetVM(ctx, ns, "vm-o1-0"); err != nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("a refused patch changed the VM: %v (%v)", vm.Spec.RunStrategy, err)
	}
	_, err = kv.KubevirtV1().VirtualMachines(ns).Patch(ctx, "vm-o1-0", types.StrategicMergePatchType,
		[]byte(`{"spec":{"runStrategy":"Always"}}`), metav1.PatchOptions{FieldValidation: metav1.FieldValidationStrict})
	if !apierrors.IsUnsupportedMediaType(err) {
		t.Errorf("a strategic merge patch of a VM: %v, want UnsupportedMediaType", err)
	}
	bad := rest.CopyConfig(rc)
	bad.BearerToken = "another-token"
	other, err := provisioner.ClusterFromConfig(bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Ping(ctx); !apierrors.IsUnauthorized(err) {
		t.Errorf("Ping with another token: %v, want Unauthorized", err)
	}
	var unauthorized int
	for _, r := range f.unexpected() {
		if !r.Authorized {
			unauthorized++
		}
	}
	if unauthorized != 1 {
		t.Errorf("unexpected() lists %d unauthorized requests, want 1: %v", unauthorized, f.unexpected())
	}
	if log := fmt.Sprintf("%+v", f.requestLog()); strings.Contains(log, kubeFakeToken) || strings.Contains(log, "another-token") {
		t.Errorf("the request log holds a bearer token: %s", log)
	}
}

// TestKubeFakePaths: the REST paths client-go builds for the six kinds,
// and what the fake makes of paths it does not serve.
func TestKubeFakePaths(t *testing.T) {
	for _, tc := range []struct {
		path                string
		kind, ns, name, sub string
		ok                  bool
	}{
		{"/api/v1/namespaces", "Namespace", "", "", "", true},
		{"/api/v1/namespaces/market-1", "Namespace", "", "market-1", "", true},
		{"/api/v1/namespaces/market-1/status", "Namespace", "", "market-1", "status", true},
		{"/api/v1/namespaces/market-1/secrets", "Secret", "market-1", "", "", true},
		{"/api/v1/namespaces/market-1/secrets/s", "Secret", "market-1", "s", "", true},
		{"/api/v1/namespaces/market-1/services/vm-o", "Service", "market-1", "vm-o", "", true},
		{"/apis/networking.k8s.io/v1/namespaces/market-1/ingresses/vm-o", "Ingress", "market-1", "vm-o", "", true},
		{"/apis/kubevirt.io/v1/namespaces/market-1/virtualmachines/vm-o-0", "VirtualMachine", "market-1", "vm-o-0", "", true},
		{"/apis/kubevirt.io/v1/namespaces/market-1/virtualmachines/vm-o-0/status", "VirtualMachine", "market-1", "vm-o-0", "status", true},
		{"/apis/cdi.kubevirt.io/v1beta1/namespaces/market-1/datavolumes/d", "DataVolume", "market-1", "d", "", true},
		{"/api/v1/namespaces/market-1/pods/p", "", "", "", "", false},
		{"/api/v1/namespaces/market-1/secrets/s/log", "", "", "", "", false},
		{"/apis/kubevirt.io/v1/namespaces/market-1/virtualmachineinstances/v", "", "", "", "", false},
		{"/apis/kubevirt.io/v1/virtualmachines", "", "", "", "", false},
		{"/api/v1/secrets", "", "", "", "", false},
		{"/apis/cdi.kubevirt.io/v1/namespaces/market-1/datavolumes/d", "", "", "", "", false},
		{"/healthz", "", "", "", "", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			k, ns, name, sub, ok := kubePath(tc.path)
			if ok != tc.ok || (ok && (k.kind != tc.kind || ns != tc.ns || name != tc.name || sub != tc.sub)) {
				t.Errorf("kubePath = %s %q %q %q %v; want %s %q %q %q %v", k.kind, ns, name, sub, ok, tc.kind, tc.ns, tc.name, tc.sub, tc.ok)
			}
		})
	}
}
