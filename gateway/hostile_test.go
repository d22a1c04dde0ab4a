package gateway

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore/qcow2"
	"github.com/vmshelf/vmshelf/imagestore/qcow2/qcow2test"
)

// TestUploadHostileImages sends the whole shared corpus — header and
// structure mutations, and images made by qemu-img with backing files,
// external data files, LUKS, huge virtual sizes, compression — through the
// real upload route: each gets the status and reason SPEC names, or 201,
// and a refusal leaves nothing behind.
func TestUploadHostileImages(t *testing.T) {
	cases := append(qcow2test.Synthetic(), qcow2test.QemuImages(t, t.TempDir())...)
	e := newEnv(t, func(c *Config) {
		c.MaxVirtualSize = qcow2test.Limits.MaxVirtualSize
		c.ImagesPerTenant = len(cases) + 1
	})
	var stored []string
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			url, id := e.ticket()
			resp, err := http.DefaultClient.Do(mustPut(t, url, tc.Data))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			e.waitSlotFreed(dirUpload)
			want := http.StatusCreated
			switch {
			case tc.Want == qcow2.ReasonNotQcow2:
				want = http.StatusUnsupportedMediaType
			case tc.Want != "":
				want = http.StatusUnprocessableEntity
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d (%q)", resp.StatusCode, want, tc.Want)
			}
			if tc.Want == "" {
				stored = append(stored, id)
			} else if b := errorOf(t, resp.Body); b.Reason != tc.Want {
				t.Fatalf("reason %q, want %q (%s)", b.Reason, tc.Want, b.Error)
			}
			e.assertNothingLeft(stored...)
		})
	}
}

func mustPut(t *testing.T, url string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
