package fakeedge

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestExchange drives the fake edge by hand through what its users rely
// on: a queued 503 with Retry-After, a PATCH cut after two bytes and kept,
// a wrong offset answered with the right one, a stored digest that is not
// the bytes', and the record of all of it in order.
func TestExchange(t *testing.T) {
	busy := map[Route][]int{Ticket: {3}}
	e := Start(t, Options{Busy: busy, CutFirstPatchAfter: 2, WrongDigest: true})
	send := func(method, target string, header map[string]string, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(t.Context(), method, target, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Tus-Resumable", "1.0.0")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := e.Client().Do(req)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp, nil
	}
	do := func(method, target string, header map[string]string, body string) *http.Response {
		t.Helper()
		resp, err := send(method, target, header, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		return resp
	}
	auth := map[string]string{"Authorization": "Bearer " + e.Token}

	if resp := do(http.MethodPost, e.URL+ticketPath, auth, `{"name":"disk"}`); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("first ticket: %d, Retry-After %q; want 503 with Retry-After 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	var tk struct {
		UploadID  string `json:"upload_id"`
		UploadURL string `json:"upload_url"`
	}
	resp := do(http.MethodPost, e.URL+ticketPath, auth, `{"name":"disk"}`)
	if err := json.NewDecoder(resp.Body).Decode(&tk); err != nil || tk.UploadID != e.UploadID {
		t.Fatalf("second ticket: %d %+v (%v)", resp.StatusCode, tk, err)
	}
	resp = do(http.MethodPost, tk.UploadURL, map[string]string{"Upload-Length": "5"}, "")
	loc, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	session := loc.ResolveReference(&url.URL{Path: resp.Header.Get("Location")}).String()
	if resp, err := send(http.MethodPatch, session, map[string]string{"Upload-Offset": "0"}, "hello"); err == nil {
		t.Fatalf("the first PATCH was answered %d; want the connection closed", resp.StatusCode)
	}
	if resp := do(http.MethodHead, session, nil, ""); resp.Header.Get("Upload-Offset") != "2" {
		t.Fatalf("HEAD after the cut: Upload-Offset %q, want the 2 bytes kept", resp.Header.Get("Upload-Offset"))
	}
	if resp := do(http.MethodPatch, session, map[string]string{"Upload-Offset": "0"}, "hello"); resp.StatusCode != http.StatusConflict || resp.Header.Get("Upload-Offset") != "2" {
		t.Fatalf("PATCH at a stale offset: %d, Upload-Offset %q; want 409 naming 2", resp.StatusCode, resp.Header.Get("Upload-Offset"))
	}
	do(http.MethodPatch, session, map[string]string{"Upload-Offset": "2"}, "llo")
	resp = do(http.MethodPost, e.URL+statusPath, auth, `{}`)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}

	sum := sha256.Sum256([]byte("hello"))
	tally := e.Tally()
	if tally.Reported == "" || tally.Reported == hex.EncodeToString(sum[:]) || !strings.Contains(string(b), tally.Reported) {
		t.Errorf("status listed %s; want a digest other than the bytes'", b)
	}
	if string(tally.Held) != "hello" || tally.Received != 5 || tally.Tickets != 1 || tally.Sessions != 1 {
		t.Errorf("the edge took %+v; want hello, 5 bytes, 1 ticket and 1 session", tally)
	}
	var got []string
	for _, r := range e.Requests() {
		got = append(got, r.String())
	}
	want := []string{"ticket 503", "ticket 201", "create 201", "patch hung up", "head 200", "patch 409", "patch 204", "status 200"}
	if !slices.Equal(got, want) {
		t.Errorf("recorded %q, want %q", got, want)
	}
	if !slices.Equal(busy[Ticket], []int{3}) {
		t.Errorf("the caller's Busy map was changed to %v", busy)
	}
}
