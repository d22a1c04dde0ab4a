package main

import (
	"bufio"
	"bytes"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/testdisk"
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

// TestE2ETenantReserveFlag: --tenant-reserve-gib is one tenant's share of
// the disk's promises. With it at twice --upload-max-gib, a second upload
// of the same tenant is admitted beside a first one that has written
// almost nothing yet (the default share, --upload-max-gib, would refuse
// it 507).
func TestE2ETenantReserveFlag(t *testing.T) {
	needQemu(t)
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--upload-max-gib", "0.01", "--tenant-reserve-gib", "0.02",
		"--headroom-mib", "1", "--images-per-tenant", "10"})
	_, img := makeImageData(t, t.TempDir(), "disk.qcow2", 9)
	first := rawUpload(t, s, s.ticket(t, "first"), int64(len(img)))
	if _, err := first.Write(img[:64<<10]); err != nil {
		t.Fatal(err)
	}
	poll(t, 400, 25*time.Millisecond, "the first upload to take its first 64 KiB", func() bool {
		v, ok := metricValue(s.scrape(t), "vmshelf_transfer_bytes_total", map[string]string{"direction": "upload"})
		return ok && v == 64<<10
	})
	second := rawUpload(t, s, s.ticket(t, "second"), int64(len(img)), "Expect: 100-continue")
	resp, err := http.ReadResponse(bufio.NewReader(second), nil)
	if err != nil {
		t.Fatalf("no answer to the second upload's Expect: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusContinue {
		t.Fatalf("the second upload of %d bytes beside the first, with a share of 0.02 GiB: %d, want 100 Continue", len(img), resp.StatusCode)
	}
}
