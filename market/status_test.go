package market

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

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
			for _, k := range []string{"images", "listings", "offers", "orders"} {
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
				"hosts_vms": true, "appliance": "", "payout_account": true}
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
		wantError(t, r, http.StatusServiceUnavailable, "notReady")
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
		wantError(t, r, http.StatusServiceUnavailable, "notReady")
		if !strings.Contains(string(r.body), "image storage") || strings.Contains(string(r.body), e.blobDir) {
			t.Errorf("body %s should name the image storage and no path", r.body)
		}
	})
}
