package market

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

func TestStatus(t *testing.T) {
	cases := []struct {
		name       string
		sharing    bool
		vms        bool
		images     int
		wantAvail  bool
		wantReason string
	}{
		{"available", true, true, 1, true, ""},
		{"vms off", true, false, 0, false, "notOffered"},
		// Not sharing wins over vms off, and images are still listed.
		{"not sharing", false, false, 2, false, "notSharing"},
		{"not sharing vms on", false, true, 0, false, "notSharing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.VMsEnabled = c.vms })
			tn, token := e.tenant("alice", c.sharing)
			tn.StripeAccount = "acct_secret123"
			tn.HostsVMs = true
			if err := e.st.UpdateTenant(t.Context(), tn); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for range c.images {
				ids = append(ids, e.image(tn, "disk").UploadID)
			}
			// Another tenant's image never shows.
			other, _ := e.tenant("bob", true)
			e.image(other, "bob's disk")

			r := e.post("/market/vms/status", token, "")
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var raw map[string]json.RawMessage
			decode(t, r, &raw)
			// Arrays are arrays even when empty: clients iterate
			// without nil checks.
			for _, k := range []string{"images", "sessions", "tickets", "listings", "offers", "orders"} {
				if !strings.HasPrefix(string(raw[k]), "[") {
					t.Errorf("%s = %s, want an array", k, raw[k])
				}
			}
			var got struct {
				Available *bool              `json:"available"`
				Reason    *string            `json:"reason"`
				Images    []imagestore.Image `json:"images"`
				Account   map[string]any     `json:"account"`
			}
			decode(t, r, &got)
			if got.Available == nil || *got.Available != c.wantAvail {
				t.Errorf("available %v, want %v", raw["available"], c.wantAvail)
			}
			switch {
			case c.wantReason == "" && got.Reason != nil:
				t.Errorf("reason %q on an available status", *got.Reason)
			case c.wantReason != "" && (got.Reason == nil || *got.Reason != c.wantReason):
				t.Errorf("reason %s, want %q", raw["reason"], c.wantReason)
			}
			if len(got.Images) != len(ids) {
				t.Errorf("%d images, want %d: %s", len(got.Images), len(ids), raw["images"])
			}
			for _, img := range got.Images {
				if !strings.Contains(strings.Join(ids, " "), img.UploadID) || img.SHA256 == "" || img.Size == 0 {
					t.Errorf("unexpected image %+v", img)
				}
			}
			wantAccount := map[string]any{"name": "alice", "in_mesh": true, "sharing": c.sharing,
				"hosts_vms": true, "appliance": "", "payout_account": true,
				"stripe_onboarded": false, "stripe_charges_enabled": false, "stripe_payouts_enabled": false}
			if len(got.Account) != len(wantAccount) {
				t.Errorf("account %v, want the fields of %v", got.Account, wantAccount)
			}
			for k, v := range wantAccount {
				if got.Account[k] != v {
					t.Errorf("account.%s = %v, want %v", k, got.Account[k], v)
				}
			}
			// No secret and no private id in the answer.
			for _, s := range []string{token, "acct_secret123", "user_data", "tenant_id"} {
				if strings.Contains(string(r.body), s) {
					t.Errorf("status answer contains %q", s)
				}
			}
		})
	}
}

func TestStatusBody(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	for _, body := range []string{"", "  \n", "{}", " {} \n"} {
		if r := e.post("/market/vms/status", token, body); r.status != http.StatusOK {
			t.Errorf("body %q: status %d: %s", body, r.status, r.body)
		}
	}
	for _, body := range []string{`{"verbose":true}`, `{} {}`, `null`, `[]`, `{`} {
		t.Run(body, func(t *testing.T) {
			wantError(t, e.post("/market/vms/status", token, body), http.StatusBadRequest, "badRequest")
		})
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(http.MethodGet, path, "", nil)
		var got map[string]string
		decode(t, r, &got)
		if r.status != http.StatusOK || len(got) != 1 || got["status"] != "ok" {
			t.Errorf("%s: %d %s, want 200 {status: ok}", path, r.status, r.body)
		}
		// Probes may use HEAD.
		if r := e.do(http.MethodHead, path, "", nil); r.status != http.StatusOK {
			t.Errorf("HEAD %s: %d", path, r.status)
		}
	}
}

// readyz names the part that failed, and only that.
func TestReadyzFails(t *testing.T) {
	t.Run("store", func(t *testing.T) {
		e := newEnv(t)
		if err := e.st.Close(); err != nil {
			t.Fatalf("closing the store: %v", err)
		}
		r := e.do(http.MethodGet, "/readyz", "", nil)
		wantNotReady(t, r, "notReady")
		if !strings.Contains(string(r.body), "record store") || strings.Contains(string(r.body), "sqlite") {
			t.Errorf("body %s should name the record store and no internals", r.body)
		}
		// Liveness is not readiness: healthz still answers.
		if r := e.do(http.MethodGet, "/healthz", "", nil); r.status != http.StatusOK {
			t.Errorf("healthz: %d", r.status)
		}
	})
	t.Run("blobs", func(t *testing.T) {
		e := newEnv(t)
		if err := os.RemoveAll(e.blobDir); err != nil {
			t.Fatal(err)
		}
		r := e.do(http.MethodGet, "/readyz", "", nil)
		wantNotReady(t, r, "blobStoreUnreachable")
		if !strings.Contains(string(r.body), "image storage") || strings.Contains(string(r.body), e.blobDir) {
			t.Errorf("body %s should name the image storage and no path", r.body)
		}
	})
}

// TestStatusReplicaStates: status shows each replica as the provisioner
// stored it, with its detail and import progress, and the order's note; a
// replica the provisioner has not seen is "starting" while the order is
// paid or active and "stopped" once it expired; an unpaid order has none.
func TestStatusReplicaStates(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	_, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "")
	listing := e.listing(host, 600, 10)
	paid := e.placed(buyer, listing, 3).OrderID
	expired := e.placed(buyer, listing, 2).OrderID
	unpaid := e.placed(buyer, listing, 1).OrderID
	month := t0.Add(30 * 24 * time.Hour)
	for _, id := range []string{paid, expired} {
		if _, err := e.st.PayOrder(ctx, id, t0, month); err != nil {
			t.Fatal(err)
		}
	}
	byID := func(st statusAnswer) map[string]orderInfo {
		m := map[string]orderInfo{}
		for _, o := range st.Orders {
			m[o.OrderID] = o
		}
		return m
	}
	check := func(when string, o orderInfo, note string, want ...replicaInfo) {
		t.Helper()
		if o.Note != note {
			t.Errorf("%s: note %q, want %q", when, o.Note, note)
		}
		if len(o.Replicas) != len(want) {
			t.Fatalf("%s: replicas %+v, want %+v", when, o.Replicas, want)
		}
		for i := range want {
			if o.Replicas[i] != want[i] {
				t.Errorf("%s: replica %d = %+v, want %+v", when, i, o.Replicas[i], want[i])
			}
		}
	}
	starting := func(id string, i int) replicaInfo {
		return replicaInfo{Name: fmt.Sprintf("vm-%s-%d", id, i), State: "starting"}
	}

	// Nothing stored yet.
	orders := byID(e.statusOf(buyer))
	check("paid, unseen", orders[paid], "", starting(paid, 0), starting(paid, 1), starting(paid, 2))
	check("unpaid", orders[unpaid], "")

	// The provisioner saw two of three replicas and has a problem.
	err := e.st.SetReplicaStates(ctx, paid, []imagestore.ReplicaState{
		{Index: 2, Name: "vm-" + paid + "-2", State: imagestore.ReplicaFailed, Detail: "ErrImagePull", ObservedAt: t0},
		{Index: 0, Name: "vm-" + paid + "-0", State: imagestore.ReplicaImporting, Detail: "ImportInProgress", Progress: "42.50%", ObservedAt: t0},
	})
	if err != nil {
		t.Fatal(err)
	}
	const note = "making the VirtualMachine vm-x-1: forbidden"
	if err := e.st.SetOrderNote(ctx, paid, note); err != nil {
		t.Fatal(err)
	}
	r := e.post("/market/vms/status", buyer, "")
	orders = byID(e.statusOf(buyer))
	check("paid, two seen", orders[paid], note,
		replicaInfo{Name: "vm-" + paid + "-0", State: "importing", Detail: "ImportInProgress", Progress: "42.50%"},
		starting(paid, 1),
		replicaInfo{Name: "vm-" + paid + "-2", State: "failed", Detail: "ErrImagePull"})
	if !strings.Contains(string(r.body), `"note":"`+note+`"`) || !strings.Contains(string(r.body), `"progress":"42.50%"`) {
		t.Errorf("status body lacks the note or the progress: %s", r.body)
	}

	// Expired: the stored states, or stopped where none.
	if err := e.st.MarkOrderActive(ctx, expired); err != nil {
		t.Fatal(err)
	}
	if err := e.st.ExpireOrder(ctx, expired, month); err != nil {
		t.Fatal(err)
	}
	orders = byID(e.statusOf(buyer))
	check("expired, unseen", orders[expired], "",
		replicaInfo{Name: "vm-" + expired + "-0", State: "stopped"}, replicaInfo{Name: "vm-" + expired + "-1", State: "stopped"})
	err = e.st.SetReplicaStates(ctx, expired, []imagestore.ReplicaState{
		{Index: 1, Name: "vm-" + expired + "-1", State: imagestore.ReplicaStopped, Detail: "Halted", ObservedAt: month},
	})
	if err != nil {
		t.Fatal(err)
	}
	orders = byID(e.statusOf(buyer))
	check("expired, halted", orders[expired], "",
		replicaInfo{Name: "vm-" + expired + "-0", State: "stopped"}, replicaInfo{Name: "vm-" + expired + "-1", State: "stopped", Detail: "Halted"})
}

// TestReadyzCluster: with --vms-enable, /readyz stays 200 and says
// clusterUnreachable while the provisioner cannot reach the cluster; the
// reason itself is not in the answer. The Stripe reasons come first: they
// stop every order before a cluster is needed.
func TestReadyzCluster(t *testing.T) {
	unreachable := func() error { return errors.New("dial tcp 127.0.0.1:6443: connection refused") }
	for _, c := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"unreachable", func(c *Config) { c.ClusterReady = unreachable }, "clusterUnreachable"},
		{"reachable", func(c *Config) { c.ClusterReady = func() error { return nil } }, ""},
		{"no provisioner", func(c *Config) { c.ClusterReady = nil }, ""},
		{"vms off", func(c *Config) { c.VMsEnabled = false; c.ClusterReady = unreachable }, ""},
		{"no stripe key first", func(c *Config) { c.Payments = nil; c.ClusterReady = unreachable }, "paymentsUnavailable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.mod)
			r := e.do(http.MethodGet, "/readyz", "", nil)
			var got readyAnswer
			decode(t, r, &got)
			if r.status != http.StatusOK || got.Status != "ok" || got.Machines != c.want {
				t.Errorf("/readyz %d %s, want 200 with machines %q", r.status, r.body, c.want)
			}
			if strings.Contains(string(r.body), "6443") {
				t.Errorf("/readyz tells the cause: %s", r.body)
			}
		})
	}
}

// TestStatusLimits: status tells a client the edge's limits, so that the
// page refuses a file too big or a fifth upload at once before it takes a
// ticket; a limit the configuration leaves at 0 is left out.
func TestStatusLimits(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"all", func(c *Config) {
			c.ImagesPerTenant, c.UploadMax, c.MaxVirtualSize, c.MaxTransfers = 2, 32<<30, 512<<30, 4
		}, `{"images_per_tenant":2,"upload_max_bytes":34359738368,"max_virtual_bytes":549755813888,"max_transfers":4}`},
		{"only the quota", func(c *Config) { c.ImagesPerTenant = 3 }, `{"images_per_tenant":3}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.mod)
			for _, sharing := range []bool{true, false} {
				_, token := e.tenant(fmt.Sprintf("t%v", sharing), sharing)
				r := e.post("/market/vms/status", token, "")
				if r.status != http.StatusOK {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				var got struct {
					Limits   json.RawMessage `json:"limits"`
					Currency string          `json:"currency"`
				}
				decode(t, r, &got)
				if string(got.Limits) != c.want {
					t.Errorf("sharing %v: limits %s, want %s", sharing, got.Limits, c.want)
				}
				if got.Currency != e.cfg.Currency || got.Currency == "" {
					t.Errorf("sharing %v: currency %q, want the edge's %q", sharing, got.Currency, e.cfg.Currency)
				}
			}
		})
	}
}

// TestStatusDemoPayments: a trial edge whose payments go to a stand-in
// on this machine says so in status (the page's banner reads it); any
// other edge leaves the field out.
func TestStatusDemoPayments(t *testing.T) {
	for _, demo := range []bool{true, false} {
		e := newEnv(t, func(c *Config) { c.DemoPayments = demo })
		_, token := e.tenant("buyer", true)
		r := e.post("/market/vms/status", token, "")
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		var got map[string]json.RawMessage
		decode(t, r, &got)
		field, ok := got["demo_payments"]
		if demo && string(field) != "true" || !demo && ok {
			t.Errorf("DemoPayments %v: demo_payments %s (present %v)", demo, field, ok)
		}
	}
}

// TestStatusNamesHostsWithoutOffers: an order names its host even when
// no listing is open any more (status reads the tenants only when its
// answer names one), and a host whose only open listing is its own sees
// no offer.
func TestStatusNamesHostsWithoutOffers(t *testing.T) {
	e := newEnv(t)
	hostT, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "")
	listing := e.listing(host, 600, 10)
	order := e.placed(buyer, listing, 1).OrderID
	if err := e.st.CloseListing(t.Context(), hostT.ID, listing, t0); err != nil {
		t.Fatal(err)
	}
	st := e.statusOf(buyer)
	if len(st.Offers) != 0 || len(st.Orders) != 1 || st.Orders[0].OrderID != order || st.Orders[0].Host != "host" {
		t.Errorf("buyer's status with the listing closed: offers %+v, orders %+v; want no offer and order %s of host", st.Offers, st.Orders, order)
	}
	e.listing(host, 700, 1)
	if st := e.statusOf(host); len(st.Offers) != 0 || len(st.Listings) != 2 {
		t.Errorf("host's status: offers %+v, listings %+v; want no offer, its two listings", st.Offers, st.Listings)
	}
}
