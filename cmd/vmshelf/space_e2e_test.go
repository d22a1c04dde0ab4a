package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/testdisk"
)

// TestE2EIdleSessionHoldsNoSpace: on a small disk, tenant A opens a
// resumable upload of an image that fits the free space only alone and
// sends nothing; tenant B's upload that fits the free space is stored
// (an idle session holds no space). A's bytes still get their room as
// they arrive: its first 8 MiB are stored beside B's image, and once B
// removed its image A finishes, to the right SHA-256.
func TestE2EIdleSessionHoldsNoSpace(t *testing.T) {
	needTool(t, "curl")
	needQemu(t)
	onSmallDisks(t, 64, testIdleSessionHoldsNoSpace)
}

func testIdleSessionHoldsNoSpace(t *testing.T, mnt string) {
	s := startServe(t, filepath.Join(mnt, "data"), []string{"--headroom-mib", "1"})
	r := vmshelf(t, "tenant", "add", "box2", "--sharing", "--data-dir", s.dataDir)
	if r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	other := strings.TrimSpace(r.stdout)
	s.secret(other)
	free := testdisk.Free(t, mnt)
	dir := t.TempDir()
	_, imgA := makeImageData(t, dir, "a.qcow2", int(free>>20)-6)
	fileB, imgB := makeImageData(t, dir, "b.qcow2", 12)
	if a, b := int64(len(imgA)), int64(len(imgB)); a+1<<20 > free || a+b+1<<20 <= free {
		t.Fatalf("setup: %d bytes free, images of %d and %d: want A to fit alone, not beside B", free, a, b)
	}

	sessA := tusCreate(t, s, s.ticket(t, "a"), len(imgA))
	code, body := s.ctl(t, "/market/vm-images/ticket", other, `{"name":"b","efi":false}`)
	if code != http.StatusCreated {
		t.Fatalf("B's ticket: %d %s", code, body)
	}
	var tkB ticketAnswer
	decode(t, body, &tkB)
	s.secret(tkB.Ticket)
	imgBAnswer := s.upload(t, tkB, fileB, imgB) // 201, or the helper fails the test

	octets := []string{"Content-Type", "application/offset+octet-stream"}
	resp := tusDo(t, http.MethodPatch, sessA, bytes.NewReader(imgA[:8<<20]), 8<<20, append(octets, "Upload-Offset", "0")...)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("A's first 8 MiB beside B's image: %d, want 204", resp.StatusCode)
	}
	if code, body := s.ctl(t, "/market/vm-images/remove", other, `{"upload_id":"`+imgBAnswer.UploadID+`"}`); code != http.StatusOK {
		t.Fatalf("B's remove: %d %s", code, body)
	}
	rest := imgA[8<<20:]
	resp = tusDo(t, http.MethodPatch, sessA, bytes.NewReader(rest), int64(len(rest)), append(octets, "Upload-Offset", strconv.Itoa(8<<20))...)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("A's rest once B's image went: %d, want 204", resp.StatusCode)
	}
	st := s.status(t, s.token)
	if len(st.Images) != 1 || st.Images[0].SHA256 != sha256hex(imgA) {
		t.Fatalf("A's images: %+v, want one with sha256 %s", st.Images, sha256hex(imgA))
	}
}
