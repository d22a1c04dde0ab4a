package uploadclient

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/testkit/fakeedge"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// TestUploadFlow runs Upload against the fake edge: a whole upload whose
// stored digest is the file's; a PATCH cut halfway is resumed in the same
// session from the edge's offset, with one ticket and each byte sent once;
// a stored digest that is not the file's is refused naming both.
func TestUploadFlow(t *testing.T) {
	img := qcow2test.Base()
	sum := sha256.Sum256(img)
	want := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name string
		edge fakeedge.Options
	}{
		{name: "whole"},
		{name: "cut halfway", edge: fakeedge.Options{CutFirstPatchAfter: len(img) / 2}},
		{name: "creation's answer lost", edge: fakeedge.Options{LoseFirstCreation: true}},
		{name: "digest not the file's", edge: fakeedge.Options{WrongDigest: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fakeedge.Start(t, tc.edge)
			control := Control{URL: e.URL, Token: e.Token, TokenFile: "/box/token", HTTPClient: e.Client()}
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
			got, err := Upload(t.Context(), Config{Control: control, Name: "disk", Retries: 2, MaxVirtual: 1 << 40, Progress: &said}, f)
			if tc.edge.WrongDigest {
				other := e.Tally().Reported
				var refused *RefusedError
				if other == "" || other == want || !errors.As(err, &refused) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), other) {
					t.Fatalf("Upload with another digest stored: %v, want a refusal naming the file's %s and the stored %s", err, want, other)
				}
				return
			}
			if err != nil {
				t.Fatalf("Upload: %v (it said: %s)", err, said.String())
			}
			if got.SHA256 != want || got.UploadID != e.UploadID {
				t.Errorf("stored %+v, want image %s with sha256 %s", got, e.UploadID, want)
			}
			// A creation whose answer was lost used its ticket: its retry
			// is 410 ticketUsed, and the client takes one fresh ticket.
			fresh := 0
			if tc.edge.LoseFirstCreation {
				fresh = 1
			}
			took := e.Tally()
			if took.Tickets != 1+fresh || took.Sessions != 1+fresh || took.Received != len(img) || !bytes.Equal(took.Held, img) {
				t.Errorf("%d tickets, %d sessions, %d bytes received (the edge holds %d, the file's: %v); want %d tickets and sessions, each of the %d bytes once",
					took.Tickets, took.Sessions, took.Received, len(took.Held), bytes.Equal(took.Held, img), 1+fresh, len(img))
			}
			if tc.edge.LoseFirstCreation && !strings.Contains(said.String(), "taking a new ticket") {
				t.Errorf("the client does not say it took a new ticket:\n%s", said.String())
			}
			if _, err := os.Stat(path + stateSuffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state file is left after the upload: %v", err)
			}
			if tc.edge.CutFirstPatchAfter > 0 && !strings.Contains(said.String(), "the edge has") {
				t.Errorf("the resumed upload does not say where it resumed:\n%s", said.String())
			}
		})
	}
}
