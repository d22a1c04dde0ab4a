package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
)

// vmValidatorName is the name KubeVirt's virt-api gives its webhook for
// VirtualMachines; the API server quotes it when it denies a request.
const vmValidatorName = "virtualmachine-validator.kubevirt.io"

// probeNamespace holds the dry-run VM that shows the webhook is on; it
// must exist (operatorNamespaces makes it).
const probeNamespace = "kubevirt"

// admission is one review KubeVirt's admitter answered.
type admission struct {
	Operation admissionv1.Operation
	Name      string
	Allowed   bool
	Message   string
}

// vmAdmission is KubeVirt v1.8.0's own VirtualMachine admitter
// (admitters.VMsAdmitter, what virt-api runs behind its validating
// webhook) served over loopback TLS and registered with the API server as
// a validating webhook for every create and update of a VirtualMachine, as
// virt-operator registers virt-api's.
type vmAdmission struct {
	admitter *admitters.VMsAdmitter
	mu       sync.Mutex
	reviews  []admission
}

// serveVMAdmission starts the admitter, judging with the cluster
// configuration of kv (the kit's KubeVirt CR), and registers it with the
// API server behind admin; it returns once the API server calls it.
func serveVMAdmission(t TB, admin *rest.Config, kv *kubevirtv1.KubeVirt) *vmAdmission {
	t.Helper()
	cfg, _, _ := testutils.NewFakeClusterConfigUsingKV(kv.DeepCopy())
	virtClient, err := kubecli.GetKubevirtClientFromRESTConfig(rest.CopyConfig(admin))
	if err != nil {
		t.Fatal(err)
	}
	// The admitter looks DataSources up for a dataVolumeTemplate's
	// sourceRef, and namespaces for one in another namespace; vmshelf uses
	// neither, so empty informers stand for them.
	dataSources, _ := testutils.NewFakeInformerFor(&cdiv1beta1.DataSource{})
	namespaces, _ := testutils.NewFakeInformerFor(&corev1.Namespace{})
	a := &vmAdmission{admitter: admitters.NewVMsAdmitter(cfg, virtClient,
		&webhooks.Informers{DataSourceInformer: dataSources, NamespaceInformer: namespaces}, map[string]struct{}{})}

	cert, caPEM := loopbackCert(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: a, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })

	url := "https://" + l.Addr().String() + "/virtualmachines-validate"
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	hook := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-api-validator"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         vmValidatorName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{kubevirtv1.VirtualMachineGroupVersionKind.Group},
					APIVersions: []string{"*"}, Resources: []string{"virtualmachines"}},
			}},
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	k, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := k.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register KubeVirt's VM admission: %v", err)
	}
	a.waitCalled(t, ctx, admin)
	return a
}

// waitCalled returns once the API server sends VirtualMachine writes to
// the webhook: it picks a new configuration up from its informer, a moment
// after the create. Each probe is a dry-run create, so nothing is stored.
func (a *vmAdmission) waitCalled(t TB, ctx context.Context, admin *rest.Config) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "admission-probe", "namespace": probeNamespace},
		"spec": map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{
			"domain": map[string]any{"devices": map[string]any{}, "resources": map[string]any{"requests": map[string]any{"memory": "64Mi"}}}}}},
	}}
	vms := dyn.Resource(kubevirtv1.VirtualMachineGroupVersionKind.GroupVersion().WithResource("virtualmachines")).Namespace(probeNamespace)
	var last error
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = vms.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.reviews) > 0, nil
	})
	if err != nil {
		t.Fatalf("the API server never called KubeVirt's VM admission: %v (last probe: %v)", err, last)
	}
	a.Reviews()
}

// ServeHTTP answers an AdmissionReview as virt-api does: the admitter's
// response, with the request's UID.
func (a *vmAdmission) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := a.admitter.Admit(r.Context(), &review)
	resp.UID = review.Request.UID
	rec := admission{Operation: review.Request.Operation, Name: review.Request.Name, Allowed: resp.Allowed}
	if resp.Result != nil {
		rec.Message = resp.Result.Message
	}
	a.mu.Lock()
	a.reviews = append(a.reviews, rec)
	a.mu.Unlock()
	review.Response = resp
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(&review)
}

// Reviews are the reviews answered so far, and forgets them.
func (a *vmAdmission) Reviews() []admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reviews
	a.reviews = nil
	return r
}

// loopbackCert is a self-signed certificate for 127.0.0.1 and its PEM,
// which the webhook configuration carries as its CA bundle.
func loopbackCert(t TB) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virt-api.kubetest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return cert, certPEM
}
