package main

// Process-level tests of --vm-catalogue: a bad file stops serve before any
// port is opened, with one line naming the file, the entry and the
// problem; a good one is what GET /market/vm-images answers.

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/catalogue"
)

// catalogueEntry is a valid cloud entry of a catalogue file; mod may
// replace one "key": value pair of it (old → new, as text).
func catalogueEntry(id string, mod ...string) string {
	e := `{"id": "` + id + `", "name": "System ` + id + `", "source": "cloud",
	  "url": "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2",
	  "format": "qcow2", "efi": false, "min_memory_mib": 0, "min_disk_gib": 3}`
	if len(mod) == 2 {
		e = strings.Replace(e, mod[0], mod[1], 1)
	}
	return e
}

func writeCatalogue(t *testing.T, entries ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vm-images.json")
	body := `{"catalogue": [` + strings.Join(entries, ",\n") + `],
	  "not_offered": [{"name": "Windows", "reason": "needs a licence"}]}`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestE2ECatalogueRefused: each bad catalogue file is one line, exit 2,
// before any bind(2) or listen(2), and the line names the file, the entry
// and the problem.
func TestE2ECatalogueRefused(t *testing.T) {
	needTool(t, "strace")
	for _, tc := range []struct {
		name    string
		entries []string
		mention []string
	}{
		{"archive", []string{catalogueEntry("good"), catalogueEntry("kali", "genericcloud-amd64.qcow2", "amd64.qcow2.tar.xz")},
			[]string{`catalogue[1] (id "kali")`, "ends in .tar.xz"}},
		{"http", []string{catalogueEntry("debian", "https://", "http://")},
			[]string{`catalogue[0] (id "debian")`, "is http"}},
		{"duplicate id", []string{catalogueEntry("debian"), catalogueEntry("debian", `"System debian"`, `"Other"`)},
			[]string{`catalogue[1] (id "debian")`, "same id"}},
		{"unknown field", []string{catalogueEntry("debian", `"efi"`, `"uefi"`)},
			[]string{`catalogue[0] (id "debian")`, `unknown field "uefi"`}},
		{"registry disk without a tag", []string{catalogueEntry("demo",
			`"source": "cloud",
	  "url": "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2",
	  "format": "qcow2",`, `"source": "losos", "url": "docker://ghcr.io/vmshelf/vmshelf-demo-containerdisk",`)},
			[]string{`catalogue[0] (id "demo")`, "no tag or digest"}},
		{"no entries", nil, []string{"at least one entry"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeCatalogue(t, tc.entries...)
			r, calls := traceSockets(t, 20*time.Second, nil, "serve", "--data-dir", filepath.Join(t.TempDir(), "data"),
				"--data-addr", freeAddr(t), "--control-addr", freeAddr(t), "--vm-catalogue", file)
			if len(calls) != 0 {
				t.Errorf("bound or listened before refusing:\n%s", strings.Join(calls, "\n"))
			}
			line := refusal(t, r, 2)
			if strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") != 0 {
				t.Errorf("stderr has more than one line:\n%s", r.stderr)
			}
			for _, w := range append([]string{"--vm-catalogue", file}, tc.mention...) {
				if !strings.Contains(line, w) {
					t.Errorf("the refusal %q does not say %q", line, w)
				}
			}
		})
	}
}

// TestE2ECatalogueServed: without --vm-catalogue serve answers the built-in
// catalogue, with one the file's; either revalidates with its ETag (304).
func TestE2ECatalogueServed(t *testing.T) {
	file := writeCatalogue(t, catalogueEntry("house"),
		`{"id": "demo", "name": "House demo", "source": "losos",
		  "url": "docker://registry.example.org/house/demo:v1", "efi": true, "min_memory_mib": 4096, "min_disk_gib": 0}`)
	own, err := catalogue.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want *catalogue.Catalogue
	}{
		{"built in", nil, catalogue.Builtin()},
		{"from the file", []string{"--vm-catalogue", file}, own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServe(t, filepath.Join(t.TempDir(), "data"), tc.args)
			code, etag, body := getCatalogue(t, s, "")
			if code != http.StatusOK || !bytes.Equal(body, tc.want.JSON()) {
				t.Fatalf("GET /market/vm-images: %d %s; want 200 with %s", code, body, tc.want.JSON())
			}
			if etag != tc.want.ETag() {
				t.Errorf("ETag %s, want %s", etag, tc.want.ETag())
			}
			if code, _, body := getCatalogue(t, s, etag); code != http.StatusNotModified || len(body) != 0 {
				t.Errorf("revalidation: %d with %d bytes, want 304 without a body", code, len(body))
			}
		})
	}
}

// getCatalogue sends GET /market/vm-images, with If-None-Match unless
// ifNoneMatch is empty.
func getCatalogue(t *testing.T, s *server, ifNoneMatch string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.ctlBase+"/market/vm-images", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET /market/vm-images: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the catalogue: %v", err)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=300" {
		t.Errorf("Cache-Control %q, want public, max-age=300", cc)
	}
	return resp.StatusCode, resp.Header.Get("ETag"), body
}
