package main

// Tests of 'vmshelf images' and 'vmshelf rm' (the built binary) against
// serve: a box lists its images and removes one, and every way the
// control plane or the command line says no.

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dustin/go-humanize"
)

// TestE2EImages: two uploads are listed (table and --json, flags from the
// command line or the environment); rm removes one: it is no longer
// listed, its file is gone and its fetch URL answers 404; and the
// refusals: an unknown image, a bad token, the data plane's URL as
// --control (exit 1), a malformed --control or UPLOAD_ID (exit 2), a
// control plane that does not answer (exit 3).
func TestE2EImages(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "data"), nil)
	tokenFile := filepath.Join(s.dataDir, "dev-token")
	control := []string{"--control", s.ctlBase, "--token-file", tokenFile}
	var stored []imageAnswer
	for i, name := range []string{"first disk", "second disk"} {
		disk, b := makeImageData(t, work, strings.ReplaceAll(name, " ", "-")+".qcow2", i+1)
		stored = append(stored, s.wantStored(t, vmshelf(t, s.uploadArgs(disk, name)...), disk, b, name))
	}
	gone := stored[0]
	fetch := s.fetchURL(t, gone.UploadID)

	r := vmshelf(t, append([]string{"images"}, control...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("images: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	wantImageRows(t, r.stdout, stored)
	r = runCmd(t, []string{"VMSHELF_CONTROL=" + s.ctlBase, "VMSHELF_TOKEN_FILE=" + tokenFile}, binPath, "images", "--json")
	if r.code != 0 {
		t.Fatalf("images --json: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var listed []imageAnswer
	decode(t, []byte(r.stdout), &listed)
	same := func(a, b imageAnswer) bool {
		return a.UploadID == b.UploadID && a.CreatedAt.Equal(b.CreatedAt) && a.SHA256 == b.SHA256
	}
	if !slices.EqualFunc(listed, stored, same) || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("images --json printed %q; want the two uploads' images in one line", r.stdout)
	}

	r = vmshelf(t, append([]string{"rm", gone.UploadID}, control...)...)
	if r.code != 0 || r.stdout != "removed "+gone.UploadID+"\n" {
		t.Fatalf("rm: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = vmshelf(t, append([]string{"images"}, control...)...)
	if r.code != 0 {
		t.Fatalf("images after rm: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	wantImageRows(t, r.stdout, stored[1:])
	if _, err := os.Stat(filepath.Join(s.dataDir, "vm-images", gone.UploadID+".qcow2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed image's file is still there (stat: %v)", err)
	}
	code, body := curl(t, fetch)
	wantError(t, "a fetch of the removed image", code, body, http.StatusNotFound, "tokenUnknown")

	badToken := filepath.Join(work, "bad-token")
	if err := os.WriteFile(badToken, []byte(randomHex(t, 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in the refusal line
	}{
		{"rm of an unknown image", append([]string{"rm", gone.UploadID, stored[1].UploadID}, control...), 1,
			[]string{"removing image " + gone.UploadID, "no image with that upload_id", "imageUnknown", "not tried: " + stored[1].UploadID}},
		{"a bad token", []string{"images", "--control", s.ctlBase, "--token-file", badToken}, 1,
			[]string{"did not accept the token in " + badToken, "401"}},
		{"the data plane as --control", []string{"rm", stored[1].UploadID, "--control", s.dataBase, "--token-file", tokenFile}, 1,
			[]string{"no vmshelf control plane route", "port 8481"}},
		{"a --control that is no URL", []string{"images", "--control", s.ctlAddr, "--token-file", tokenFile}, 2,
			[]string{"is not an http(s) URL of the control plane"}},
		{"no --token-file", []string{"images", "--control", s.ctlBase}, 2, []string{"images needs --token-file"}},
		{"a malformed UPLOAD_ID", append([]string{"rm", "../vmshelf.db"}, control...), 2, []string{"is not an UPLOAD_ID"}},
		{"no UPLOAD_ID", append([]string{"rm"}, control...), 2, []string{"rm needs the UPLOAD_IDs"}},
		{"a control plane that does not answer", []string{"images", "--control", "http://" + freeAddr(t), "--token-file", tokenFile}, 3,
			[]string{"asking the control plane for the image list failed", "run the same command again"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := vmshelf(t, tc.args...)
			line := refusal(t, r, tc.code)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q does not say %q", line, w)
				}
			}
			if strings.Contains(r.stderr, s.token) {
				t.Errorf("printed the token")
			}
		})
	}
	if st := s.status(t, s.token); len(st.Images) != 1 || st.Images[0].UploadID != stored[1].UploadID {
		t.Errorf("status lists %+v after the refusals; want only %s", st.Images, stored[1].UploadID)
	}
}

// columns splits a row of 'vmshelf images' (tabwriter pads with two spaces
// or more; a value has single spaces at most).
var columns = regexp.MustCompile(` {2,}`)

// wantImageRows checks the table of 'vmshelf images': a header, then a row
// per image in order, with its upload id, name, size and virtual size in
// IEC units, creation minute (UTC) and the first 12 hex digits of its
// SHA-256.
func wantImageRows(t *testing.T, out string, want []imageAnswer) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want)+1 || !slices.Equal(columns.Split(lines[0], -1), []string{"UPLOAD_ID", "NAME", "SIZE", "VIRTUAL", "CREATED (UTC)", "SHA256"}) {
		t.Fatalf("images printed:\n%s\nwant a header and %d rows", out, len(want))
	}
	for i, img := range want {
		row := []string{img.UploadID, img.Name, humanize.IBytes(uint64(img.Size)), humanize.IBytes(uint64(img.VirtualSize)),
			img.CreatedAt.UTC().Format("2006-01-02 15:04"), img.SHA256[:12]}
		if got := columns.Split(lines[i+1], -1); !slices.Equal(got, row) {
			t.Errorf("images row %d is %q, want %q", i+1, got, row)
		}
	}
}
