package market

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

func TestTicketIssued(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)

	r := e.post("/market/vm-images/ticket", token, `{"name":"  my disk  ","efi":true}`)
	if r.status != http.StatusCreated {
		t.Fatalf("status %d, want 201: %s", r.status, r.body)
	}
	var got struct {
		Ticket    string    `json:"ticket"`
		UploadID  string    `json:"upload_id"`
		UploadURL string    `json:"upload_url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	decode(t, r, &got)
	e.remember(got.Ticket)
	if len(got.Ticket) != 64 || strings.Trim(got.Ticket, "0123456789abcdef") != "" {
		t.Errorf("ticket %q is not 64 lower-case hex characters", got.Ticket)
	}
	if !imagestore.ValidUploadID(got.UploadID) {
		t.Errorf("upload_id %q is not an upload id", got.UploadID)
	}
	// The public URL's trailing slash was dropped: exactly one slash.
	if want := publicURL + "/market/vm-images/upload/" + got.Ticket; got.UploadURL != want {
		t.Errorf("upload_url %q, want %q", got.UploadURL, want)
	}
	if want := t0.Add(time.Hour); !got.ExpiresAt.Equal(want) {
		t.Errorf("expires_at %v, want %v", got.ExpiresAt, want)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q: an answer with a ticket must not be cached", cc)
	}

	// The store knows the ticket by its hash, with the trimmed name.
	tk, err := e.st.Ticket(t.Context(), imagestore.HashSecret(got.Ticket))
	if err != nil {
		t.Fatalf("store has no ticket under the hash: %v", err)
	}
	if tk.UploadID != got.UploadID || tk.TenantID != alice.ID || tk.Name != "my disk" || !tk.EFI {
		t.Errorf("stored ticket %+v does not match the request", tk)
	}

	// ...and not in clear: no file of the database holds the ticket text.
	files, err := filepath.Glob(e.dbPath + "*")
	if err != nil || len(files) == 0 {
		t.Fatalf("database files: %v, %v; want at least the database", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(got.Ticket)) {
			t.Errorf("%s holds the ticket in clear", filepath.Base(f))
		}
	}

	// Two tickets are two different secrets and ids.
	r2 := e.post("/market/vm-images/ticket", token, `{"name":"other"}`)
	if r2.status != http.StatusCreated {
		t.Fatalf("second ticket: status %d, want 201: %s", r2.status, r2.body)
	}
	var got2 struct {
		Ticket   string `json:"ticket"`
		UploadID string `json:"upload_id"`
	}
	decode(t, r2, &got2)
	e.remember(got2.Ticket)
	if len(got2.Ticket) != 64 || !imagestore.ValidUploadID(got2.UploadID) {
		t.Errorf("second ticket %q, upload id %q: not a ticket and an id", got2.Ticket, got2.UploadID)
	}
	if got2.Ticket == got.Ticket || got2.UploadID == got.UploadID {
		t.Error("a second ticket repeated the first's secret or id")
	}
}

func TestTicketRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 1 })
	_, token := e.tenant("alice", true)
	_, shy := e.tenant("bob", false)
	full, fullToken := e.tenant("carol", true)
	e.image(full, "qcow2 bytes")

	wantError(t, e.post("/market/vm-images/ticket", shy, `{"name":"disk"}`), http.StatusConflict, "notSharing")
	wantError(t, e.post("/market/vm-images/ticket", fullToken, `{"name":"disk"}`), http.StatusConflict, "imageQuota")
	// A refused ticket is not counted as issued, and alice still gets one.
	if r := e.post("/market/vm-images/ticket", token, `{"name":"disk"}`); r.status != http.StatusCreated {
		t.Errorf("alice: status %d: %s", r.status, r.body)
	}
}

// unsized hides a reader's length so the client sends it chunked.
type unsized struct{ io.Reader }

// Bodies that are not exactly one JSON object with known fields, and names
// that are not 1..128 printable characters, are 400 badRequest; bodies over
// 64 KiB are 413 tooLarge, with or without a Content-Length.
func TestTicketBadRequest(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	big := `{"name":"` + strings.Repeat("a", 70<<10) + `"}`

	cases := []struct {
		name   string
		body   io.Reader
		status int
		reason string
	}{
		{"empty", strings.NewReader(""), 400, "badRequest"},
		{"not JSON", strings.NewReader("name=disk"), 400, "badRequest"},
		{"syntax error", strings.NewReader(`{"name":}`), 400, "badRequest"},
		{"truncated", strings.NewReader(`{"name":"disk"`), 400, "badRequest"},
		{"null", strings.NewReader(`null`), 400, "badRequest"},
		{"array", strings.NewReader(`[{"name":"disk"}]`), 400, "badRequest"},
		{"unknown field", strings.NewReader(`{"name":"disk","size":1}`), 400, "badRequest"},
		{"wrong type", strings.NewReader(`{"name":"disk","efi":"yes"}`), 400, "badRequest"},
		{"two objects", strings.NewReader(`{"name":"disk"}{"name":"disk"}`), 400, "badRequest"},
		{"trailing data", strings.NewReader(`{"name":"disk"} x`), 400, "badRequest"},
		{"missing name", strings.NewReader(`{"efi":true}`), 400, "badRequest"},
		{"blank name", strings.NewReader(`{"name":"   "}`), 400, "badRequest"},
		{"name too long", strings.NewReader(`{"name":"` + strings.Repeat("é", 129) + `"}`), 400, "badRequest"},
		{"control character", strings.NewReader(`{"name":"a\u0000b"}`), 400, "badRequest"},
		{"newline", strings.NewReader(`{"name":"a\nb"}`), 400, "badRequest"},
		{"bidi override", strings.NewReader(`{"name":"a\u202eb"}`), 400, "badRequest"},
		{"too large", strings.NewReader(big), 413, "tooLarge"},
		{"too large chunked", unsized{strings.NewReader(big)}, 413, "tooLarge"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "too large" { // refused from its declared length: ask first (see sendExpecting)
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+"/market/vm-images/ticket", c.body)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				wantError(t, e.sendExpecting(req), c.status, c.reason)
				return
			}
			wantError(t, e.do(http.MethodPost, "/market/vm-images/ticket", token, c.body), c.status, c.reason)
		})
	}

	// The limits' other side: 128 characters (not bytes), trailing
	// whitespace after the object.
	for _, body := range []string{
		`{"name":"` + strings.Repeat("é", 128) + `"}`,
		"{\"name\":\"disk\"}\n",
	} {
		if r := e.post("/market/vm-images/ticket", token, body); r.status != http.StatusCreated {
			t.Errorf("%.20s…: status %d: %s", body, r.status, r.body)
		}
	}
}
