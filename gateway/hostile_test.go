package gateway

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// TestUploadHostileSynthetic sends the pure-Go part of the shared corpus —
// header and structure mutations — through the real upload route: each
// gets the status and reason docs/api.md names, or 201, and a refusal leaves
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

// TestUploadVirtualSizeLimit: the edge holds an image to its own
// MaxVirtualSize, not to the default every corpus case assumes: with the
// limit at exactly the base image's 64 MiB disk, that image is stored and
// the same image one byte larger is refused 422 virtualSizeTooLarge.
func TestUploadVirtualSizeLimit(t *testing.T) {
	base := qcow2test.Base()
	const limit = 64 << 20 // Base's virtual size
	if limit == qcow2test.Limits.MaxVirtualSize {
		t.Fatal("the limit must differ from the default to show it is applied")
	}
	e := newEnv(t, func(c *Config) { c.MaxVirtualSize = limit })
	var stored []string
	for _, tc := range []struct {
		name   string
		data   []byte
		status int
		reason string
	}{
		{"at the limit", base, http.StatusCreated, ""},
		{"one byte over", qcow2test.Mutate(base, qcow2test.Put64(24, limit+1)), http.StatusUnprocessableEntity, qcow2.ReasonVirtualSizeTooLarge},
	} {
		url, id := e.ticket()
		resp, b := do(t, newRequest(t, http.MethodPut, url, bytes.NewReader(tc.data)))
		e.waitSlotFreed(dirUpload)
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d %s, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
		if tc.reason == "" {
			stored = append(stored, id)
		} else if eb := errorOf(t, bytes.NewReader(b)); eb.Reason != tc.reason {
			t.Errorf("%s: reason %q, want %q (%s)", tc.name, eb.Reason, tc.reason, eb.Error)
		}
		e.assertNothingLeft(stored...)
	}
}
