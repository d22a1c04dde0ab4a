package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/testkit/testdisk"
)

// spaceImage is a qcow2 file of a little over 16 MiB: four of them do not
// fit a 64 MiB disk with 1 MiB of headroom, three do.
func spaceImage(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", p, "1G")
	qemuIO(t, p, "write -q -P 0x5a 0 16M")
	return mustRead(t, p)
}

func putHead(e *env, url string, length int) string {
	return fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), length)
}

// TestAdmissionReservesSpace: four uploads on a disk that fits three.
// Each admitted upload holds its announced size until it ends, so the
// fourth is refused 507 before its body (not one byte of it taken),
// instead of all four running into a full disk after their whole body.
func TestAdmissionReservesSpace(t *testing.T) {
	needQemu(t)
	img := spaceImage(t)
	dir := testdisk.Mount(t, "tmpfs", 64)
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom = 1 << 20; c.ImagesPerTenant = 10 })
	// An upload cut off after 1 MiB gives its claim back with its slot:
	// else the three below would not fit.
	cutURL, _ := e.ticket()
	cut := openRaw(t, e.base, putHead(e, cutURL, len(img)))
	cut.send(img[:1<<20], "the first MiB of the upload to be cut")
	waitFor(t, "the cut upload to take its first MiB", func() bool { return uploadedBytes(e) == 1<<20 })
	cut.c.Close()
	e.waitSlotFreed(dirUpload)
	const before = 1 << 20 // bytes the cut upload took

	var conns []*rawConn
	var ids []string
	for i := range 3 {
		url, id := e.ticket()
		ids = append(ids, id)
		rc := openRaw(t, e.base, putHead(e, url, len(img)))
		rc.send(img[:1<<20], fmt.Sprintf("the first MiB of upload %d", i+1))
		conns = append(conns, rc)
	}
	waitFor(t, "three uploads to take their first MiB", func() bool { return uploadedBytes(e) == before+3<<20 })

	url4, _ := e.ticket()
	// With Expect: the refusal comes instead of 100 Continue.
	rc := openRaw(t, e.base, putHead(e, url4, len(img))+"\r\nExpect: 100-continue")
	resp, body := rc.answer("the fourth upload's head, with Expect")
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), `"noSpace"`) {
		t.Fatalf("fourth upload with Expect: %d %s, want 507 noSpace", resp.StatusCode, body)
	}
	// Without Expect: refused as soon as the handler runs, the rest of
	// the body never read.
	rc = openRaw(t, e.base, putHead(e, url4, len(img)))
	rc.send(img[:64<<10], "the first 64 KiB of the fourth upload")
	resp, body = rc.answer("the fourth upload")
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), `"noSpace"`) {
		t.Fatalf("fourth upload: %d %s, want 507 noSpace", resp.StatusCode, body)
	}
	if got := uploadedBytes(e); got != before+3<<20 {
		t.Errorf("upload bytes taken = %v, want the three uploads' 3 MiB and none of the fourth's", got)
	}
	e.assertTicket(url4, false) // refused before it started: the ticket stays usable

	for i, rc := range conns {
		rc.send(img[1<<20:], fmt.Sprintf("the rest of upload %d", i+1))
		if resp, body := rc.answer(fmt.Sprintf("upload %d", i+1)); resp.StatusCode != http.StatusCreated {
			t.Errorf("upload %d: %d %s, want 201", i+1, resp.StatusCode, body)
		}
	}
	for range 3 {
		e.waitSlotFreed(dirUpload)
	}
	e.assertNothingLeft(ids...)
	if got := uploadedBytes(e); got != float64(before+3*len(img)) {
		t.Errorf("upload bytes taken = %v, want the cut upload's MiB and exactly three images' %d", got, 3*len(img))
	}
}

// qcowImage is a qcow2 file with mib MiB of data (and a little metadata).
func qcowImage(t *testing.T, mib int) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", p, "1G")
	qemuIO(t, p, fmt.Sprintf("write -q -P 0x6b 0 %dM", mib))
	return mustRead(t, p)
}

// ticketOf issues a ticket of another tenant, made on first use.
func (e *env) ticketOf(name string) (string, string) {
	e.t.Helper()
	ctx := context.Background()
	tn, err := e.st.Tenant(ctx, name)
	if errors.Is(err, imagestore.ErrNotFound) {
		tn, err = e.st.CreateTenant(ctx, imagestore.Tenant{Name: name, Sharing: true}, imagestore.HashSecret(imagestore.NewSecret()))
	}
	if err != nil {
		e.t.Fatal(err)
	}
	secret, id, now := imagestore.NewSecret(), imagestore.NewUploadID(), e.clock.Now()
	err = e.st.CreateTicket(ctx, imagestore.Ticket{UploadID: id, TenantID: tn.ID, Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
		imagestore.HashSecret(secret), 100)
	if err != nil {
		e.t.Fatal(err)
	}
	e.remember(secret)
	return e.base + uploadPrefix + secret, id
}

// TestSessionHoldsNoSpaceIdle: a resumable session that sends nothing
// holds no disk space. Tenant A announces an image that fits the disk only
// alone and sends nothing; tenant B's PUT that fits the free space is
// stored. A's bytes then get their room chunk by chunk as they arrive,
// until the disk has no room for the next chunk: 507 noSpace there, all
// that arrived kept durable, and once space is freed A resumes to the
// right SHA-256.
func TestSessionHoldsNoSpaceIdle(t *testing.T) {
	needQemu(t)
	imgA, imgB := qcowImage(t, 52), spaceImage(t)
	dir := testdisk.Mount(t, "tmpfs", 64)
	const ahead = 4 << 20
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom, c.SessionAhead, c.ImagesPerTenant = 1<<20, ahead, 10 })
	free := testdisk.Free(t, dir)
	if a, b := int64(len(imgA)), int64(len(imgB)); a+1<<20 > free || a+b+1<<20 <= free {
		t.Fatalf("setup: %d bytes free, images of %d and %d: want A to fit alone, not beside B", free, a, b)
	}
	upA, idA := e.ticketOf("tenant-a")
	resp, body := tusReq(t, http.MethodPost, upA, nil, "Upload-Length", strconv.Itoa(len(imgA)))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("A's session: %d %s", resp.StatusCode, body)
	}
	sessA := e.sessionOf(upA, resp)

	upB, idB := e.ticketOf("tenant-b")
	if resp, body := rawRequest(t, e.base, putHead(e, upB, len(imgB)), bytes.NewReader(imgB)); resp.StatusCode != http.StatusCreated {
		t.Fatalf("B's PUT beside A's idle session: %d %s, want 201", resp.StatusCode, body)
	}

	// A's first bytes get their room.
	if resp, body := patch(t, sessA, 0, imgA[:8<<20]); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("A's first 8 MiB: %d %s, want 204", resp.StatusCode, body)
	}
	// The rest does not fit beside B: it runs until the next chunk finds
	// no room, and stops there with 507.
	resp, body = patch(t, sessA, 8<<20, imgA[8<<20:])
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), `"noSpace"`) {
		t.Fatalf("A's rest beside B: %d %s, want 507 noSpace", resp.StatusCode, body)
	}
	e.waitSlotFreed(dirUpload)
	answered, err := strconv.Atoi(resp.Header.Get("Upload-Offset"))
	head, _ := headOffset(t, sessA)
	if err != nil || answered != head {
		t.Fatalf("the 507 says Upload-Offset %q, HEAD %d: want the same", resp.Header.Get("Upload-Offset"), head)
	}
	// Chunk by chunk up to the last that had room: what is left free is
	// the headroom and less than one chunk besides.
	if left := testdisk.Free(t, dir); head <= 8<<20 || left < 1<<20 || left >= 1<<20+ahead {
		t.Fatalf("A stopped at %d with %d bytes free: want past its first 8 MiB, with the headroom and less than a chunk (%d) free", head, left, ahead)
	}
	if partial, err := os.Stat(filepath.Join(dir, "vm-images", ".partial", idA)); err != nil || partial.Size() != int64(head) {
		t.Fatalf("A's partial after the 507: %v, %v; want %d bytes", partial, err, head)
	}

	// B's image goes: A resumes and finishes.
	if err := e.st.RemoveImage(t.Context(), mustTicketTenant(t, e, idB), idB); err != nil {
		t.Fatal(err)
	}
	if err := e.blobs.Delete(t.Context(), idB); err != nil {
		t.Fatal(err)
	}
	if resp, body := patch(t, sessA, head, imgA[head:]); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("A resumed after B's image went: %d %s, want 204", resp.StatusCode, body)
	}
	if stored, err := e.st.Image(t.Context(), idA); err != nil || stored.SHA256 != sha(imgA) {
		t.Fatalf("A's image: %+v, %v; want sha256 %s", stored, err, sha(imgA))
	}
}

// mustTicketTenant is the tenant of a stored image.
func mustTicketTenant(t *testing.T, e *env, uploadID string) int64 {
	t.Helper()
	img, err := e.st.Image(t.Context(), uploadID)
	if err != nil {
		t.Fatal(err)
	}
	return img.TenantID
}

// TestUploadChunkedReservesMax: an upload of unknown length may grow to
// the upload limit, so that is what it must find room for.
func TestUploadChunkedReservesMax(t *testing.T) {
	dir := testdisk.Mount(t, "tmpfs", 64)
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom = 1 << 20; c.UploadMax = 64 << 20 })
	url, _ := e.ticket()
	resp, body := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue",
		strings.TrimPrefix(url, e.base)), nil)
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("chunked upload that may reach 64 MiB on a 64 MiB disk: %d %s, want 507", resp.StatusCode, body)
	}
	e.assertTicket(url, false)
	e.assertNothingLeft()
}

// TestUploadDiskFillsWhileStreaming: the disk fills under a running upload
// (another program wrote to it): 507 noSpace, nothing left behind.
func TestUploadDiskFillsWhileStreaming(t *testing.T) {
	needQemu(t)
	img := spaceImage(t)
	dir := testdisk.Mount(t, "tmpfs", 64)
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom = 1 << 20 })
	url, _ := e.ticket()
	rc := openRaw(t, e.base, putHead(e, url, len(img)))
	rc.send(img[:2<<20], "the first 2 MiB")
	waitFor(t, "the upload to take its first 2 MiB", func() bool { return uploadedBytes(e) == 2<<20 })
	filler := testdisk.Fill(t, dir)
	_ = rc.write(img[2<<20:]) // the server may answer and close before the end
	resp, body := rc.answer("the upload into a full disk")
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), `"noSpace"`) {
		t.Fatalf("upload into a disk that filled: %d %s, want 507 noSpace", resp.StatusCode, body)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
	e.assertTicket(url, true)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
}

// TestTusDiskFull: a PATCH that meets a full disk answers 507 with the
// offset that is durable (the one HEAD gives), the partial is cut back to
// it, and once space is freed the session resumes to the right SHA-256.
func TestTusDiskFull(t *testing.T) {
	needQemu(t)
	img := spaceImage(t)
	dir := testdisk.Mount(t, "tmpfs", 40)
	// Checkpoints every 3 MiB and never by time: after 5 MiB the one
	// checkpoint fell in [3, 4) MiB (reads end where they end), so at
	// least 1 MiB past the durable offset is on the disk, to be cut back.
	e := newEnvAt(t, dir, func(c *Config) {
		c.Headroom, c.CheckpointBytes, c.CheckpointInterval = 1<<20, 3<<20, time.Hour
	})
	up, id := e.ticket()
	resp, body := tusReq(t, http.MethodPost, up, nil, "Upload-Length", strconv.Itoa(len(img)))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	sess := e.sessionOf(up, resp)
	rc := slowPatch(t, e, sess, 0, len(img), img[:5<<20])
	waitFor(t, "the PATCH to take its first 5 MiB", func() bool { return uploadedBytes(e) == 5<<20 })
	if off, _ := headOffset(t, sess); off < 3<<20 || off >= 4<<20 {
		t.Fatalf("durable offset after 5 MiB = %d, want the one checkpoint, in [3, 4) MiB", off)
	}
	filler := testdisk.Fill(t, dir)
	_ = rc.write(img[5<<20:]) // the server may answer before the end
	resp, body = rc.answer("the PATCH into a full disk")
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), `"noSpace"`) {
		t.Fatalf("PATCH into a full disk: %d %s, want 507 noSpace", resp.StatusCode, body)
	}
	answered, err := strconv.Atoi(resp.Header.Get("Upload-Offset"))
	if err != nil {
		t.Fatalf("the 507 carries Upload-Offset %q: %v", resp.Header.Get("Upload-Offset"), err)
	}
	head, _ := headOffset(t, sess)
	if answered != head || head < 3<<20 || head >= 4<<20 {
		t.Fatalf("the 507 says Upload-Offset %d, HEAD says %d; want the same durable offset, in [3, 4) MiB", answered, head)
	}
	e.waitSlotFreed(dirUpload)
	partial, err := os.Stat(filepath.Join(dir, "vm-images", ".partial", id))
	if err != nil || partial.Size() != int64(head) {
		t.Fatalf("partial after the 507: %v, %v; want cut back to %d bytes", partial, err, head)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	resp, body = patch(t, sess, head, img[head:])
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("resumed PATCH: %d %s", resp.StatusCode, body)
	}
	stored, err := e.st.Image(t.Context(), id)
	if err != nil || stored.SHA256 != sha(img) {
		t.Fatalf("stored image: %+v, %v; want sha256 %s", stored, err, sha(img))
	}
	if got := fileSHA256(t, filepath.Join(dir, "vm-images", id+".qcow2")); got != sha(img) {
		t.Errorf("stored file sha256 %s, want %s", got, sha(img))
	}
}

// TestPatchClaimsItsBodyOnly: a PATCH whose Content-Length is less than
// a chunk claims its body, not a chunk: 8 MiB are stored on a disk with
// 10 MiB free, though the session lacks 52 MiB and a chunk is 60.
func TestPatchClaimsItsBodyOnly(t *testing.T) {
	needQemu(t)
	img := qcowImage(t, 52)
	dir := testdisk.Mount(t, "tmpfs", 64)
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom, c.SessionAhead = 1<<20, 60<<20 })
	sess, _ := e.create(len(img))
	filler := make([]byte, testdisk.Free(t, dir)-10<<20)
	if err := os.WriteFile(filepath.Join(dir, "filler"), filler, 0o600); err != nil {
		t.Fatal(err)
	}
	if resp, body := patch(t, sess, 0, img[:8<<20]); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("a PATCH of 8 MiB with 10 MiB free: %d %s, want 204", resp.StatusCode, body)
	}
	wantOffset(t, sess, 8<<20, "after the PATCH")
}

// TestCreationWithUploadStopsAtNoRoom: a creation whose body outgrows the
// free disk stops where its next chunk finds no room, 507 with the
// session's Location and the bytes it kept, and resumes once space is
// freed: the session it made is not left without its address.
func TestCreationWithUploadStopsAtNoRoom(t *testing.T) {
	needQemu(t)
	img := qcowImage(t, 40)
	dir := testdisk.Mount(t, "tmpfs", 64)
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom, c.SessionAhead = 1<<20, 4<<20 })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, testdisk.Free(t, dir)-20<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	up, id := e.ticket()
	resp, body := tusReq(t, http.MethodPost, up, bytes.NewReader(img), "Upload-Length", strconv.Itoa(len(img)),
		"Content-Type", "application/offset+octet-stream")
	if resp.StatusCode != http.StatusInsufficientStorage || resp.Header.Get("Location") == "" {
		t.Fatalf("creation with 40 MiB on 20 MiB free: %d %s, Location %q; want 507 with the session's Location", resp.StatusCode, body, resp.Header.Get("Location"))
	}
	sess := e.sessionOf(up, resp)
	e.waitSlotFreed(dirUpload)
	kept, err := strconv.Atoi(resp.Header.Get("Upload-Offset"))
	if head, _ := headOffset(t, sess); err != nil || kept != head || head < 12<<20 {
		t.Fatalf("the 507 says Upload-Offset %q, HEAD %d: want the same, at least 12 MiB of the 20 free", resp.Header.Get("Upload-Offset"), head)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if resp, body := patch(t, sess, kept, img[kept:]); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the rest once space was freed: %d %s", resp.StatusCode, body)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id)
}
