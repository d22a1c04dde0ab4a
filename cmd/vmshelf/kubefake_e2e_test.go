package main

// The whole way of an order through the real binary to its machines:
// placed on the market, paid at the stand-in Stripe (billing/stripetest),
// confirmed by a signed webhook, provisioned by serve's provisioner into
// the stand-in Kubernetes (kubeFake), and its replicas' states read back
// by the buyer. The helpers here are for the browser tests too.

import (
	"crypto/rand"
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// kubeMarket is a serve with the market on (--vms-enable), its Stripe
// the stand-in stripe and its cluster the stand-in kube.
type kubeMarket struct {
	s      *server
	stripe *stripetest.Server
	kube   *kubeFake
	key    string // STRIPE_SECRET_KEY
	whsec  string // STRIPE_WEBHOOK_SECRET
}

// startKubeMarket starts a stand-in Stripe whose one account (account) is
// active, a kubeFake, and serve --vms-enable with both (plus args, e.g.
// "--vms-domain", "vms.example.org"). The Stripe key, the webhook secret
// and the kube token are noted as secrets of serve's log. Everything
// stops when the test ends.
func startKubeMarket(t *testing.T, account string, args ...string) *kubeMarket {
	t.Helper()
	needTool(t, "curl")
	m := &kubeMarket{kube: newKubeFake(t)}
	m.key, m.whsec = stripeTestSecrets()
	var err error
	if m.stripe, err = stripetest.New(m.key, map[string]string{account: "active"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.stripe.Close() })
	env := append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+m.key, "STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, m.whsec))
	m.s = startServe(t, filepath.Join(t.TempDir(), "data"), append([]string{"--vms-enable",
		"--stripe-api-base", m.stripe.URL, "--kubeconfig", m.kube.kubeconfig(t)}, args...), env...)
	m.s.secret(m.key)
	m.s.secret(m.whsec)
	m.s.secret(kubeFakeToken)
	return m
}

// pay plays the buyer at Stripe's checkout and Stripe's webhook: the
// checkout session of orderID is paid, and checkout.session.completed
// (event eventID, unique per test) is posted signed to serve, which must
// answer "paid". The payment kicks serve's provisioner.
func (m *kubeMarket) pay(t *testing.T, orderID, eventID string) {
	t.Helper()
	var session string
	for _, cs := range m.stripe.Sessions() {
		if cs.OrderID == orderID {
			session = cs.ID
		}
	}
	if session == "" {
		t.Fatalf("Stripe has no checkout session for order %s", orderID)
	}
	if err := m.stripe.Pay(session); err != nil {
		t.Fatal(err)
	}
	payload, sig, err := m.stripe.Event(eventID, "checkout.session.completed", session, m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body := postWebhook(t, m.s, payload, sig)
	wantWebhookResult(t, "checkout.session.completed of "+orderID, code, body, "paid")
}

// replicaStatus is a replica as POST /market/vms/status shows it.
type replicaStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Detail   string `json:"detail"`
	Progress string `json:"progress"`
}

// machineStatus is an order as POST /market/vms/status shows it, with
// the whole replica (detail and progress too).
type machineStatus struct {
	OrderID  string          `json:"order_id"`
	State    string          `json:"state"`
	Address  string          `json:"address"`
	Note     string          `json:"note"`
	Replicas []replicaStatus `json:"replicas"`
}

// machines is the buyer's (token's) orders by id, from POST
// /market/vms/status.
func (m *kubeMarket) machines(t *testing.T, token string) map[string]machineStatus {
	t.Helper()
	code, body := m.s.ctl(t, "/market/vms/status", token, "")
	if code != http.StatusOK {
		t.Fatalf("status: %d %s", code, body)
	}
	var st struct {
		Orders []machineStatus `json:"orders"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	out := map[string]machineStatus{}
	for _, o := range st.Orders {
		out[o.OrderID] = o
	}
	return out
}

// waitMachine polls (bounded: 400 × 25 ms) the buyer's status until
// order orderID is in state with exactly the replicas want, and returns
// it.
func (m *kubeMarket) waitMachine(t *testing.T, token, orderID, state string, want []replicaStatus) machineStatus {
	t.Helper()
	var got machineStatus
	poll(t, 400, 25*time.Millisecond, "order "+orderID+" "+state+" with its replicas' states", func() bool {
		got = m.machines(t, token)[orderID]
		if got.State != state || len(got.Replicas) != len(want) {
			return false
		}
		for i := range want {
			if got.Replicas[i] != want[i] {
				return false
			}
		}
		return true
	}, func() string { b, _ := json.Marshal(got); return string(b) + "; want replicas " + mustJSON(want) })
	return got
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// order places an order of the dev tenant and returns it (awaiting
// payment).
func (m *kubeMarket) order(t *testing.T, listingID, image, name string, quantity int, userData string) orderAnswer {
	t.Helper()
	req := map[string]any{"listing_id": listingID, "quantity": quantity, "image": image, "name": name}
	if userData != "" {
		req["user_data"] = userData
	}
	code, body := m.s.ctl(t, "/market/vms/orders", m.s.token, mustJSON(req))
	if code != http.StatusCreated {
		t.Fatalf("order: %d %s", code, body)
	}
	var o orderAnswer
	decode(t, body, &o)
	if o.OrderID == "" || o.State != "awaitingPayment" {
		t.Fatalf("order answered %s, want awaitingPayment", body)
	}
	return o
}

var marketNamespace = regexp.MustCompile(`^market-[0-9]+$`)

// TestE2EKubeFakeOrder: an order placed and paid through the binary
// becomes machines in the cluster: the payment's webhook kicks the
// provisioner, which makes the buyer's namespace, the cloud-init Secret,
// a VirtualMachine per replica, the Service and the Ingress, marks the
// order active, and reports what KubeVirt and CDI say of each replica
// (Running; importing at 42.5%) in the buyer's status. A later change is
// reported on the next pass (here the one another payment kicks); an own
// image's order gets a fetch token that is in its Secret only and fetches
// the image. Nothing is deleted, and no secret reaches serve's log.
func TestE2EKubeFakeOrder(t *testing.T) {
	needTool(t, "qemu-img")
	start := time.Now()
	const account = "acct_e2eKubeHost"
	// Replica sizes other than serve's defaults (1 vCPU, 2048 MiB, 20 GiB,
	// losos-vm-local), so that wiring that drops a flag is seen.
	m := startKubeMarket(t, account, "--vms-domain", "vms.example.org",
		"--vm-cpu", "3", "--vm-memory-mib", "3000", "--vm-disk-gib", "25", "--vm-storage-class", "fast-nvme")
	s, kube := m.s, m.kube
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)

	// Order A: two replicas of a catalogue system with user data.
	userMark := "e2e-kube-user-data-" + rand.Text()
	userData := "#cloud-config\npassword: " + userMark + "\n"
	s.secret(userMark)
	a := m.order(t, l.ListingID, "debian-13", "web", 2, userData)
	// KubeVirt and CDI are quick here: replica 0 runs, replica 1's
	// disk is being imported, as soon as the provisioner makes them.
	kube.setVMStatus("", "vm-"+a.OrderID+"-0", "Running")
	kube.putDataVolume("", "vm-"+a.OrderID+"-1-disk", "ImportInProgress", "42.5%")
	if got := m.machines(t, s.token)[a.OrderID]; got.State != "awaitingPayment" || len(kube.objects("VirtualMachine")) != 0 {
		t.Fatalf("before the payment: %+v and %d VMs, want awaitingPayment and none", got, len(kube.objects("VirtualMachine")))
	}
	paid := time.Now()
	m.pay(t, a.OrderID, "evt_e2e_kube_a")
	got := m.waitMachine(t, s.token, a.OrderID, "active", []replicaStatus{
		{Name: "vm-" + a.OrderID + "-0", State: "running", Detail: "Running"},
		{Name: "vm-" + a.OrderID + "-1", State: "importing", Detail: "ImportInProgress", Progress: "42.5%"},
	})
	t.Logf("order A active with its replicas' states %v after the webhook", time.Since(paid).Round(time.Millisecond))
	if got.Note != "" || got.Address != "vm-"+a.OrderID+".vms.example.org" {
		t.Errorf("order A: note %q, address %q; want no note, vm-%s.vms.example.org", got.Note, got.Address, a.OrderID)
	}

	// What the provisioner made.
	nss := kube.objects("Namespace")
	if len(nss) != 1 {
		t.Fatalf("the cluster has %d namespaces, want the buyer's one", len(nss))
	}
	ns := kubeStr(kubeMeta(nss[0]), "name")
	if !marketNamespace.MatchString(ns) {
		t.Errorf("the buyer's namespace is %q, want market-<tenant id>", ns)
	}
	ci := kubeObject[corev1.Secret](t, kube, "Secret", ns, "vm-"+a.OrderID+"-cloudinit")
	if string(ci.Data["userdata"]) != userData || ci.Labels["losos.dev/order"] != a.OrderID {
		t.Errorf("the cloud-init Secret holds %q with labels %v; want the order's user data, labelled", ci.Data["userdata"], ci.Labels)
	}
	for i, name := range []string{"vm-" + a.OrderID + "-0", "vm-" + a.OrderID + "-1"} {
		vm := kubeObject[kubevirtv1.VirtualMachine](t, kube, "VirtualMachine", ns, name)
		tmpl := vm.Spec.Template
		if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways ||
			vm.Labels["losos.dev/order"] != a.OrderID || vm.Labels["losos.dev/replica"] != strconv.Itoa(i) ||
			tmpl == nil || tmpl.Spec.NodeSelector["losos.dev/appliance"] != "node1" || len(vm.Spec.DataVolumeTemplates) != 0 ||
			len(tmpl.Spec.Volumes) == 0 || tmpl.Spec.Volumes[0].DataVolume == nil || tmpl.Spec.Volumes[0].DataVolume.Name != name+"-disk" {
			t.Errorf("VirtualMachine %s: %s; want runStrategy Always, the order's labels, node1, booting from the DataVolume %s-disk",
				name, mustJSON(vm.Spec), name)
			continue
		}
		disk := kubeObject[cdiv1.DataVolume](t, kube, "DataVolume", ns, name+"-disk")
		if disk.Spec.Source == nil || disk.Spec.Source.HTTP == nil || disk.Spec.Source.HTTP.Checksum != "" ||
			disk.Labels["losos.dev/replica"] != strconv.Itoa(i) || len(disk.OwnerReferences) != 0 {
			t.Errorf("DataVolume %s-disk: %s; want an http source without checksum (a catalogue image), the replica's labels, no owner",
				name, mustJSON(disk))
		}
		dv := disk.Spec.Storage
		mem := tmpl.Spec.Domain.Resources.Requests[corev1.ResourceMemory]
		if tmpl.Spec.Domain.CPU == nil || tmpl.Spec.Domain.CPU.Cores != 3 || mem.String() != "3000Mi" ||
			dv == nil || dv.StorageClassName == nil || *dv.StorageClassName != "fast-nvme" ||
			dv.Resources.Requests.Storage().String() != "25Gi" {
			t.Errorf("VirtualMachine %s: cpu %s, memory %s, disk %s; want --vm-cpu 3, --vm-memory-mib 3000, --vm-disk-gib 25 on fast-nvme",
				name, mustJSON(tmpl.Spec.Domain.CPU), mem.String(), mustJSON(dv))
		}
	}
	if n := len(kube.objects("VirtualMachine")); n != 2 {
		t.Errorf("the cluster has %d VirtualMachines, want 2", n)
	}
	svc := kubeObject[corev1.Service](t, kube, "Service", ns, "vm-"+a.OrderID)
	if svc.Spec.Selector["losos.dev/order"] != a.OrderID {
		t.Errorf("the Service selects %v, want the order's replicas", svc.Spec.Selector)
	}
	ing := kubeObject[networkingv1.Ingress](t, kube, "Ingress", ns, "vm-"+a.OrderID)
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != "vm-"+a.OrderID+".vms.example.org" {
		t.Errorf("the Ingress has rules %s, want host vm-%s.vms.example.org", mustJSON(ing.Spec.Rules), a.OrderID)
	}
	if kube.get("Secret", ns, "vm-"+a.OrderID+"-fetch") != nil {
		t.Error("a catalogue order got a fetch Secret")
	}

	// Later, CDI finishes and KubeVirt starts replica 1. The provisioner
	// sees it on its next pass: every 30 s (serve has no flag for it), or
	// at once when another payment kicks it, as order B's does here.
	kube.putDataVolume(ns, "vm-"+a.OrderID+"-1-disk", "Succeeded", "100.0%")
	kube.setVMStatus(ns, "vm-"+a.OrderID+"-1", "Running")

	// Order B: the buyer's own image, one replica.
	dir := t.TempDir()
	file, data := makeBootableImage(t, dir, "own.qcow2")
	tk := s.ticket(t, "own")
	img := s.upload(t, tk, file, data)
	b := m.order(t, l.ListingID, img.UploadID, "own", 1, "")
	m.pay(t, b.OrderID, "evt_e2e_kube_b")
	m.waitMachine(t, s.token, b.OrderID, "active", []replicaStatus{{Name: "vm-" + b.OrderID + "-0", State: "starting"}})
	m.waitMachine(t, s.token, a.OrderID, "active", []replicaStatus{
		{Name: "vm-" + a.OrderID + "-0", State: "running", Detail: "Running"},
		{Name: "vm-" + a.OrderID + "-1", State: "running", Detail: "Running"},
	})

	// B's fetch token: in its Secret, as the header CDI sends, and
	// nowhere else; it fetches the image, as CDI's importer would.
	fetch := kubeObject[corev1.Secret](t, kube, "Secret", ns, "vm-"+b.OrderID+"-fetch")
	header := string(fetch.Data["authorization"])
	token, ok := strings.CutPrefix(header, "Authorization: Bearer ")
	if !ok || !hex64.MatchString(token) {
		t.Fatalf("the fetch Secret holds %q, want the header Authorization: Bearer <64 hex>", header)
	}
	s.secret(token)
	vmB := kube.get("VirtualMachine", ns, "vm-"+b.OrderID+"-0")
	if strings.Contains(mustJSON(vmB), token) {
		t.Error("the fetch token is in the VirtualMachine")
	}
	if dvB := kube.get("DataVolume", ns, "vm-"+b.OrderID+"-0-disk"); strings.Contains(mustJSON(dvB), token) {
		t.Error("the fetch token is in the DataVolume")
	}
	src := kubeObject[cdiv1.DataVolume](t, kube, "DataVolume", ns, "vm-"+b.OrderID+"-0-disk").Spec.Source
	wantURL := s.dataBase + "/market/vm-images/fetch/" + img.UploadID
	if src == nil || src.HTTP == nil || src.HTTP.URL != wantURL || len(src.HTTP.SecretExtraHeaders) != 1 ||
		src.HTTP.SecretExtraHeaders[0] != "vm-"+b.OrderID+"-fetch" {
		t.Fatalf("B's disk source %s; want %s with the header Secret vm-%s-fetch", mustJSON(src), wantURL, b.OrderID)
	}
	// The checksum CDI's importer checks is the SHA-256 of the bytes the
	// fetch route serves (checked against the upload's below).
	if src.HTTP.Checksum != "sha256:"+img.SHA256 {
		t.Errorf("B's disk checksum %q, want sha256:%s", src.HTTP.Checksum, img.SHA256)
	}
	// The header from a file, as CDI's importer gets it: the token on
	// no command line.
	if code, got := curl(t, "-H", "@"+writeSecret(t, "headers", header+"\n"), wantURL); code != http.StatusOK || sha256hex(got) != img.SHA256 {
		t.Errorf("fetching B's image with its token: %d, sha256 %s; want 200 and %s", code, sha256hex(got), img.SHA256)
	}

	// No DELETE, nothing the fake does not implement, every request
	// with the kubeconfig's token as vmshelf-provisioner.
	kube.assertClean(t)
	s.assertNoSecrets()
	wantOrderIDsInClear(t, s.logs(), a.OrderID, b.OrderID)
	t.Logf("the whole test took %v", time.Since(start).Round(time.Millisecond))
}

// wantOrderIDsInClear checks serve's log of a whole order flow (market,
// billing, provisioner) against the rule on order ids (docs/operations.md,
// "Logs"): they are no secret, so never redacted ("o[redacted]"), always
// under the key order_id (never "order"), and every line that names one of
// ids carries it as order_id.
func wantOrderIDsInClear(t *testing.T, logs string, ids ...string) {
	t.Helper()
	attr := regexp.MustCompile(`\border_id=(\S+)`)
	named := 0
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		if strings.Contains(line, "o[redacted]") || strings.Contains(line, " order=") {
			t.Errorf("an order id is redacted or not under order_id: %s", line)
		}
		got := ""
		if m := attr.FindStringSubmatch(line); m != nil {
			got = m[1]
		}
		for _, id := range ids {
			if strings.Contains(line, id) {
				named++
				if got != id {
					t.Errorf("the line names order %s but its order_id is %q: %s", id, got, line)
				}
			}
		}
	}
	if named < 2*len(ids) {
		t.Errorf("only %d lines name the orders %v; the flow logs each one placed, paid and made active:\n%s", named, ids, logs)
	}
}
