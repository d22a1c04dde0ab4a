package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/testdisk"
)

// onSmallDisks runs test on each kind of real small file system.
func onSmallDisks(t *testing.T, sizeMiB int, test func(t *testing.T, mnt string)) {
	for _, kind := range testdisk.Kinds {
		t.Run(kind, func(t *testing.T) { test(t, testdisk.Mount(t, kind, sizeMiB)) })
	}
}

// TestE2EFullDisk: serve on a disk filled to the last block. A remove
// still works and frees the space; tickets are 507 noSpace, never 500;
// /readyz is 503 noSpace until the remove, 200 after it.
func TestE2EFullDisk(t *testing.T) {
	onSmallDisks(t, 512, testFullDisk)
}

func testFullDisk(t *testing.T, mnt string) {
	data := filepath.Join(mnt, "data")
	s := startServe(t, data, []string{"--headroom-mib", "8"})
	disk, diskBytes := makeImageData(t, t.TempDir(), "big.qcow2", 60)
	img := s.upload(t, s.ticket(t, "big"), disk, diskBytes)
	s.upload(t, s.ticket(t, "second"), disk, diskBytes)
	if code, body := curl(t, s.ctlBase+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the disk filled: %d %s", code, body)
	}

	testdisk.Fill(t, mnt)
	if free := testdisk.Free(t, mnt); free > 1<<20 {
		t.Fatalf("%d bytes still free after filling", free)
	}
	code, body := curl(t, s.ctlBase+"/readyz")
	wantError(t, "/readyz on a full disk", code, body, http.StatusServiceUnavailable, "noSpace")
	code, body = s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"no room"}`)
	wantError(t, "a ticket on a full disk", code, body, http.StatusInsufficientStorage, "noSpace")

	code, body = s.ctl(t, "/market/vm-images/remove", s.token, `{"upload_id":"`+img.UploadID+`"}`)
	if code != http.StatusOK {
		t.Fatalf("remove on a full disk: %d %s", code, body)
	}
	// The remove released the store's reserve and took it back from the
	// space the image freed: what is free is the image's size, give or
	// take the pages the db grew by.
	if free := testdisk.Free(t, mnt); free < int64(len(diskBytes))-1<<20 {
		t.Errorf("after the remove %d bytes are free, want about the image's %d", free, len(diskBytes))
	}
	if info, err := os.Stat(filepath.Join(data, dbFile+"-reserve")); err != nil || info.Size() != storeReserve {
		t.Errorf("the store's reserve after the remove: %v %v, want taken back (%d bytes)", info, err, storeReserve)
	}
	if _, err := os.Stat(filepath.Join(data, imagesDir, img.UploadID+".qcow2")); !os.IsNotExist(err) {
		t.Errorf("the removed image's file: %v", err)
	}
	if code, body := curl(t, s.ctlBase+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the remove freed space: %d %s", code, body)
	}
	if n := len(s.status(t, s.token).Images); n != 1 {
		t.Errorf("status lists %d images, want 1", n)
	}
	s.ticket(t, "room again") // 201, or the helper fails the test
}

// TestE2EAdmissionReservesSpace: four curl uploads at once on a disk that
// fits three (beside the store and its reserve): three are stored, the
// fourth is refused 507 noSpace, and none of its bytes is taken.
func TestE2EAdmissionReservesSpace(t *testing.T) {
	needTool(t, "curl")
	onSmallDisks(t, 96, testAdmissionReservesSpace)
}

func testAdmissionReservesSpace(t *testing.T, mnt string) {
	s := startServe(t, filepath.Join(mnt, "data"), []string{"--headroom-mib", "1", "--max-transfers", "5", "--images-per-tenant", "10"})
	// Images sized from what is free now (the store and its reserve
	// took theirs): three fit with the headroom, four do not.
	free := testdisk.Free(t, mnt)
	disk, diskBytes := makeImageData(t, t.TempDir(), "disk.qcow2", int((free-1<<20)*2/7)>>20)
	if size := int64(len(diskBytes)); 3*size+1<<20 > free || 4*size+1<<20 <= free {
		t.Fatalf("setup: %d bytes free, images of %d: want three to fit and four not", free, size)
	}
	tickets := make([]ticketAnswer, 4)
	for i := range tickets {
		tickets[i] = s.ticket(t, "disk "+strconv.Itoa(i))
	}
	type answer struct {
		code int
		body []byte
	}
	answers := make(chan answer, 4)
	for _, tk := range tickets {
		go func() { // no t.Fatal here: the answer, or -1, goes to the test
			// curl's own Expect: 100-continue, as a user's curl sends it.
			cmd := exec.Command("curl", "-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}", "-T", disk, tk.UploadURL)
			cmd.Env = cleanEnv()
			out, err := cmd.Output()
			i := bytes.LastIndexByte(out, '\n')
			code, cerr := strconv.Atoi(string(out[i+1:]))
			if err != nil || cerr != nil {
				answers <- answer{-1, append(out, fmt.Sprint(err)...)}
				return
			}
			answers <- answer{code, out[:max(i, 0)]}
		}()
	}
	var stored, refused int
	for range 4 {
		select {
		case a := <-answers:
			switch a.code {
			case http.StatusCreated:
				stored++
			case http.StatusInsufficientStorage:
				wantError(t, "the upload that did not fit", a.code, a.body, http.StatusInsufficientStorage, "noSpace")
				refused++
			default:
				t.Errorf("an upload answered %d %s", a.code, a.body)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("four curl uploads did not all end within 90s")
		}
	}
	if stored != 3 || refused != 1 {
		t.Fatalf("%d stored and %d refused, want 3 and 1", stored, refused)
	}
	mfs := s.scrape(t)
	if v := mustMetric(t, mfs, "vmshelf_transfer_bytes_total", map[string]string{"direction": "upload"}); v != float64(3*len(diskBytes)) {
		t.Errorf("upload bytes taken = %v, want exactly three images' %d (none of the refused one's)", v, 3*len(diskBytes))
	}
	if v := mustMetric(t, mfs, "vmshelf_transfer_rejections_total", map[string]string{"direction": "upload", "reason": "noSpace"}); v != 1 {
		t.Errorf("noSpace rejections = %v, want 1", v)
	}
	if n := len(s.status(t, s.token).Images); n != 3 {
		t.Errorf("status lists %d images, want 3", n)
	}
}

// TestE2ETusDiskFull: a resumable upload whose disk fills mid-PATCH gets
// 507 with the durable offset HEAD also gives, its partial cut back to it;
// once space is freed it resumes to the right SHA-256.
func TestE2ETusDiskFull(t *testing.T) {
	onSmallDisks(t, 96, testTusDiskFull)
}

func testTusDiskFull(t *testing.T, mnt string) {
	data := filepath.Join(mnt, "data")
	// A checkpoint every 3 MiB: after the first 5 MiB the one checkpoint
	// fell in [3, 4) MiB, and what lies past it must be cut back.
	s := startServe(t, data, []string{"--headroom-mib", "1", "--tus-checkpoint-mib", "3"})
	_, img := makeImageData(t, t.TempDir(), "disk.qcow2", 16)
	tk := s.ticket(t, "resumable")
	resp := tusDo(t, http.MethodPost, tk.UploadURL, nil, 0, "Upload-Length", strconv.Itoa(len(img)))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	sess := resp.Header.Get("Location")
	s.secret(sess[strings.LastIndexByte(sess, '/')+1:])
	head := func() int {
		t.Helper()
		r := tusDo(t, http.MethodHead, sess, nil, 0)
		off, err := strconv.Atoi(r.Header.Get("Upload-Offset"))
		if r.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("HEAD: %d, Upload-Offset %q", r.StatusCode, r.Header.Get("Upload-Offset"))
		}
		return off
	}

	pr, pw := io.Pipe()
	done := make(chan *http.Response, 1)
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodPatch, sess, pr)
		req.ContentLength = int64(len(img))
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Content-Type", "application/offset+octet-stream")
		req.Header.Set("Upload-Offset", "0")
		if r, err := (&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 60 * time.Second}).Do(req); err == nil {
			r.Body.Close()
			done <- r
		}
	}()
	writeDone := make(chan error, 1)
	go func() { _, err := pw.Write(img[:5<<20]); writeDone <- err }()
	select {
	case err := <-writeDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first 5 MiB of the PATCH were not taken within 30s")
	}
	poll(t, 400, 25*time.Millisecond, "the PATCH to take its first 5 MiB", func() bool {
		v, ok := metricValue(s.scrape(t), "vmshelf_transfer_bytes_total", map[string]string{"direction": "upload"})
		return ok && v == 5<<20
	})
	if off := head(); off < 3<<20 || off >= 4<<20 {
		t.Fatalf("durable offset after 5 MiB = %d, want the one checkpoint, in [3, 4) MiB", off)
	}
	testdisk.Fill(t, mnt)
	go func() { _, err := pw.Write(img[5<<20:]); pw.CloseWithError(err) }()
	var r *http.Response
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("no answer to the PATCH into a full disk within 60s")
	}
	if r == nil || r.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("PATCH into a full disk: %v, want 507", r)
	}
	answered, err := strconv.Atoi(r.Header.Get("Upload-Offset"))
	durable := head()
	if err != nil || answered != durable || durable < 3<<20 || durable >= 4<<20 {
		t.Fatalf("the 507 says Upload-Offset %q, HEAD %d; want the same durable offset, in [3, 4) MiB", r.Header.Get("Upload-Offset"), durable)
	}
	sessions, err := os.ReadDir(filepath.Join(data, imagesDir, ".partial"))
	if err != nil || len(sessions) != 1 {
		t.Fatalf(".partial holds %v (%v), want the one session's file", sessions, err)
	}
	if info, err := sessions[0].Info(); err != nil || info.Size() != int64(durable) {
		t.Fatalf("the partial after the 507: %v %v, want cut back to %d bytes", info, err, durable)
	}

	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	resp = tusDo(t, http.MethodPatch, sess, bytes.NewReader(img[durable:]), int64(len(img)-durable),
		"Content-Type", "application/offset+octet-stream", "Upload-Offset", strconv.Itoa(durable))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the resumed PATCH: %d", resp.StatusCode)
	}
	st := s.status(t, s.token)
	if len(st.Images) != 1 || st.Images[0].UploadID != tk.UploadID || st.Images[0].SHA256 != sha256hex(img) {
		t.Fatalf("status after the resume: %+v, want %s with sha256 %s", st.Images, tk.UploadID, sha256hex(img))
	}
}

// TestE2ERemovesInARow: on a disk that is full again after each remove
// (another program took the space it freed), the second and third
// removes still commit at once: the store's emergency space is taken back
// as soon as a remove freed room, not a minute later.
func TestE2ERemovesInARow(t *testing.T) {
	onSmallDisks(t, 128, testRemovesInARow)
}

func testRemovesInARow(t *testing.T, mnt string) {
	data := filepath.Join(mnt, "data")
	s := startServe(t, data, []string{"--headroom-mib", "1"})
	disk, diskBytes := makeImageData(t, t.TempDir(), "disk.qcow2", 8)
	var ids []string
	for i := range 3 {
		ids = append(ids, s.upload(t, s.ticket(t, "disk "+strconv.Itoa(i)), disk, diskBytes).UploadID)
	}
	for i, id := range ids {
		// A filler of its own each time: what the last remove freed is
		// taken again, to the last block.
		dir := filepath.Join(mnt, "fill"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		testdisk.Fill(t, dir)
		if free := testdisk.Free(t, mnt); free > 1<<20 {
			t.Fatalf("%d bytes still free after filling", free)
		}
		code, body := s.ctl(t, "/market/vm-images/remove", s.token, `{"upload_id":"`+id+`"}`)
		if code != http.StatusOK {
			t.Fatalf("remove %d on a full disk: %d %s", i+1, code, body)
		}
		if _, err := os.Stat(filepath.Join(data, imagesDir, id+".qcow2")); !os.IsNotExist(err) {
			t.Errorf("remove %d: the image's file: %v", i+1, err)
		}
	}
	if n := len(s.status(t, s.token).Images); n != 0 {
		t.Errorf("status lists %d images, want none", n)
	}
}
