package uploadclient

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// fakeEdge is a control plane and a data plane in one: it issues tickets,
// keeps one tus session and lists the image once the session has every
// byte. It can cut the first PATCH after some bytes (the connection
// closed, as a proxy's restart does), lose the answer to the first
// creation (the session is made, the connection closes; the ticket is
// used, so a retry with it is the edge's 410 ticketUsed) and report
// another digest than the one of the bytes it holds (a file changed, or
// bytes changed on the way).
type fakeEdge struct {
	t   *testing.T
	srv *httptest.Server

	mu          sync.Mutex
	cutAfter    int  // the first PATCH is cut after this many bytes; 0: none
	loseCreate  bool // the first creation's answer is lost
	ticketUsed  bool // the last ticket made a session
	wrongDigest bool // the image is listed with another digest
	tickets     int
	sessions    int
	length      int64
	data        []byte // the session's bytes
	received    int    // body bytes taken over every PATCH
}

func newFakeEdge(t *testing.T) *fakeEdge {
	e := &fakeEdge{t: t}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEdge) control() Control {
	return Control{URL: e.srv.URL, Token: testToken, TokenFile: "/box/token", HTTPClient: e.srv.Client()}
}

func (e *fakeEdge) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/market/vm-images/ticket":
		e.tickets++
		e.ticketUsed = false
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"ticket": testToken, "upload_id": testID, "upload_url": e.srv.URL + "/up/" + testID})
	case r.Method == http.MethodPost && r.URL.Path == "/up/"+testID:
		if e.ticketUsed {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(reason.TicketUsed.Status())
			w.Write(apierr.New(reason.TicketUsed).JSON())
			return
		}
		e.ticketUsed = true
		e.sessions++
		e.length, _ = strconv.ParseInt(r.Header.Get("Upload-Length"), 10, 64)
		e.data = nil
		if e.loseCreate {
			e.loseCreate = false
			hangUp(e.t, w)
			return
		}
		w.Header().Set("Location", "/sessions/"+testID)
		w.WriteHeader(http.StatusCreated)
	case r.Method == http.MethodHead && r.URL.Path == "/sessions/"+testID:
		w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
		w.Header().Set("Upload-Length", strconv.FormatInt(e.length, 10))
	case r.Method == http.MethodPatch && r.URL.Path == "/sessions/"+testID:
		e.patch(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/market/vms/status":
		images := []Image{}
		if e.length > 0 && int64(len(e.data)) == e.length {
			sum := sha256.Sum256(e.data)
			if e.wrongDigest {
				sum[0] ^= 1
			}
			images = append(images, Image{UploadID: testID, Name: "disk", Size: e.length, SHA256: hex.EncodeToString(sum[:])})
		}
		json.NewEncoder(w).Encode(map[string]any{"images": images})
	default:
		e.t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusNotFound)
	}
}

func (e *fakeEdge) patch(w http.ResponseWriter, r *http.Request) {
	if off, err := strconv.Atoi(r.Header.Get("Upload-Offset")); err != nil || off != len(e.data) {
		w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
		w.WriteHeader(http.StatusConflict)
		return
	}
	if e.cutAfter > 0 {
		buf := make([]byte, e.cutAfter)
		n, _ := io.ReadFull(r.Body, buf)
		e.data, e.received, e.cutAfter = append(e.data, buf[:n]...), e.received+n, 0
		hangUp(e.t, w)
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		e.t.Errorf("read a PATCH: %v", err)
	}
	e.data, e.received = append(e.data, b...), e.received+len(b)
	w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
	w.WriteHeader(http.StatusNoContent)
}

// hangUp closes the connection of w without an answer.
func hangUp(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack to hang up: %v", err)
		return
	}
	conn.Close()
}

// TestUploadFlow runs Upload against the fake edge: a whole upload whose
// stored digest is the file's; a PATCH cut halfway is resumed in the same
// session from the edge's offset, with one ticket and each byte sent once;
// a stored digest that is not the file's is refused naming both.
func TestUploadFlow(t *testing.T) {
	img := qcow2test.Base()
	sum := sha256.Sum256(img)
	want := hex.EncodeToString(sum[:])
	sum[0] ^= 1 // what the fake lists when told to report another digest
	other := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name        string
		cutAfter    int
		loseCreate  bool
		wrongDigest bool
	}{
		{name: "whole"},
		{name: "cut halfway", cutAfter: len(img) / 2},
		{name: "creation's answer lost", loseCreate: true},
		{name: "digest not the file's", wrongDigest: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEdge(t)
			e.cutAfter, e.loseCreate, e.wrongDigest = tc.cutAfter, tc.loseCreate, tc.wrongDigest
			path := filepath.Join(t.TempDir(), "disk.qcow2")
			if err := os.WriteFile(path, img, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := OpenImage(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var said bytes.Buffer
			got, err := Upload(t.Context(), Config{Control: e.control(), Name: "disk", Retries: 2, MaxVirtual: 1 << 40, Progress: &said}, f)
			e.mu.Lock()
			defer e.mu.Unlock()
			if tc.wrongDigest {
				var refused *RefusedError
				if !errors.As(err, &refused) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), other) {
					t.Fatalf("Upload with another digest stored: %v, want a refusal naming the file's %s and the stored %s", err, want, other)
				}
				return
			}
			if err != nil {
				t.Fatalf("Upload: %v (it said: %s)", err, said.String())
			}
			if got.SHA256 != want || got.UploadID != testID {
				t.Errorf("stored %+v, want image %s with sha256 %s", got, testID, want)
			}
			// A creation whose answer was lost used its ticket: its retry
			// is 410 ticketUsed, and the client takes one fresh ticket.
			fresh := 0
			if tc.loseCreate {
				fresh = 1
			}
			if e.tickets != 1+fresh || e.sessions != 1+fresh || e.received != len(img) || !bytes.Equal(e.data, img) {
				t.Errorf("%d tickets, %d sessions, %d bytes received (the edge holds %d, the file's: %v); want %d tickets and sessions, each of the %d bytes once",
					e.tickets, e.sessions, e.received, len(e.data), bytes.Equal(e.data, img), 1+fresh, len(img))
			}
			if tc.loseCreate && !strings.Contains(said.String(), "taking a new ticket") {
				t.Errorf("the client does not say it took a new ticket:\n%s", said.String())
			}
			if _, err := os.Stat(path + stateSuffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state file is left after the upload: %v", err)
			}
			if tc.cutAfter > 0 && !strings.Contains(said.String(), "the edge has") {
				t.Errorf("the resumed upload does not say where it resumed:\n%s", said.String())
			}
		})
	}
}
