package gateway

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore/qcow2"
	"github.com/vmshelf/vmshelf/imagestore/qcow2/qcow2test"
)

// TestUploadHostileSynthetic sends the pure-Go part of the shared corpus —
// header and structure mutations — through the real upload route: each
// gets the status and reason SPEC names, or 201, and a refusal leaves
// nothing behind. It needs no external tool.
func TestUploadHostileSynthetic(t *testing.T) {
	uploadCorpus(t, qcow2test.Synthetic())
}

// TestUploadHostileQemu does the same with the images made by qemu-img:
// backing files, external data files, LUKS, huge virtual sizes,
// compression. QemuImages skips (or fails under CI=true) first when qemu
// is missing.
func TestUploadHostileQemu(t *testing.T) {
	uploadCorpus(t, qcow2test.QemuImages(t, t.TempDir()))
}

func uploadCorpus(t *testing.T, cases []qcow2test.Case) {
	if len(cases) == 0 {
		t.Fatal("empty corpus")
	}
	e := newEnv(t, func(c *Config) {
		c.MaxVirtualSize = qcow2test.Limits.MaxVirtualSize
		c.ImagesPerTenant = len(cases) + 1
	})
	var stored []string
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			url, id := e.ticket()
			resp, b := do(t, newRequest(t, http.MethodPut, url, bytes.NewReader(tc.Data)))
			e.waitSlotFreed(dirUpload)
			want := http.StatusCreated
			switch {
			case tc.Want == qcow2.ReasonNotQcow2:
				want = http.StatusUnsupportedMediaType
			case tc.Want != "":
				want = http.StatusUnprocessableEntity
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d (%q): %s", resp.StatusCode, want, tc.Want, b)
			}
			if tc.Want == "" {
				stored = append(stored, id)
			} else if eb := errorOf(t, bytes.NewReader(b)); eb.Reason != tc.Want {
				t.Fatalf("reason %q, want %q (%s)", eb.Reason, tc.Want, eb.Error)
			}
			e.assertNothingLeft(stored...)
			e.assertTicket(url, true) // accepted or refused, the transfer started
		})
	}
}
