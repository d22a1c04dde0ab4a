package main

// Tests of claims the docs make about the running binary that no
// functional test shows: constant memory in the image size and the 32 MiB
// soft memory limit (docs/operations.md), and fetches sent with
// sendfile(2) (README).

import (
	"bufio"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The memory test's figures. Measured on this service: a 1 GiB upload and
// fetch peak at about 18 MiB resident. The bound is the 64 MiB the service
// is sized for (serve.go); the image is 8 times that, so a path that holds
// the body (or a good part of it) in memory cannot stay under it.
const (
	rssBound        = 64 << 20
	bigImageVirtual = 512 << 20
)

// serveBinary is the vmshelf binary for measurements of the process: never
// race-instrumented (the race detector's shadow memory would multiply the
// resident size). TestMain's build is not, unless GOFLAGS says -race; then
// a plain one is built for this test.
func serveBinary(t *testing.T) string {
	t.Helper()
	info, err := buildinfo.ReadFile(binPath)
	if err != nil {
		t.Fatalf("build info of %s: %v", binPath, err)
	}
	race := false
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			race = true
		}
	}
	if !race {
		return binPath
	}
	t.Logf("%s is race-instrumented (GOFLAGS=-race?): measuring a plain build", binPath)
	plain := filepath.Join(t.TempDir(), "vmshelf-norace")
	r := runWithin(t, 3*time.Minute, nil, "go", "build", "-race=false", "-o", plain, ".")
	if r.code != 0 {
		t.Fatalf("go build -race=false: %s", r.stderr)
	}
	return plain
}

// peakRSS is the process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("serve's /proc status: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				break
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM line in /proc/%d/status:\n%s", pid, b)
	return 0
}

// resetPeakRSS sets the process's VmHWM back to its current RSS
// (proc(5): writing 5 to clear_refs); false if the kernel refused.
func resetPeakRSS(pid int) bool {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
}

// bigImage makes a QCOW2 whose every cluster is allocated (preallocation
// =metadata: the file is sparse on disk but every byte of it is sent),
// quickly; it returns the path, its size and its SHA-256.
func bigImage(t *testing.T, dir string, virtual int64) (string, int64, string) {
	t.Helper()
	p := filepath.Join(dir, "big.qcow2")
	if r := runCmd(t, nil, "qemu-img", "create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", p, strconv.FormatInt(virtual, 10)); r.code != 0 {
		t.Fatalf("qemu-img create: %s", r.stderr)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	if n < virtual {
		t.Fatalf("%s is %d bytes, want at least its virtual size %d (all clusters allocated)", p, n, virtual)
	}
	return p, n, hex.EncodeToString(h.Sum(nil))
}

// fetchAll GETs url with a bounded client and returns how many bytes came
// and their SHA-256, without holding them.
func fetchAll(t *testing.T, url string, timeout time.Duration) (int64, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		t.Fatalf("fetch: %d %s", resp.StatusCode, b)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		t.Fatalf("fetch: after %d bytes: %v", n, err)
	}
	return n, hex.EncodeToString(h.Sum(nil))
}

// uploadFile PUTs file with curl -T (as README does) and returns the image
// answer; it wants 201 with the file's size and digest.
func (s *server) uploadFile(t *testing.T, tk ticketAnswer, file string, size int64, sum string) imageAnswer {
	t.Helper()
	needTool(t, "curl")
	out := filepath.Join(t.TempDir(), "body")
	r := runWithin(t, 3*time.Minute, nil, "curl", "-sS", "--max-time", "170", "-o", out, "-w", "%{http_code}", "-T", file, tk.UploadURL)
	if r.code != 0 {
		t.Fatalf("curl -T %s: exit %d: %s", file, r.code, r.stderr)
	}
	body, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("curl's output: %v", err)
	}
	if r.stdout != "201" {
		t.Fatalf("upload: %s %s", r.stdout, body)
	}
	var img imageAnswer
	decode(t, body, &img)
	if img.UploadID != tk.UploadID || img.Size != size || img.SHA256 != sum {
		t.Fatalf("upload answered %+v; want id %s, size %d, sha256 %s", img, tk.UploadID, size, sum)
	}
	return img
}

// TestE2EConstantMemory: "the data plane streams, so its memory is constant
// in the image size" and "serve sets a 32 MiB soft memory limit for the Go
// runtime unless GOMEMLIMIT is set" (docs/operations.md). The real binary
// takes and serves an image 8 times the 64 MiB bound; its peak resident
// size (VmHWM, read while it runs) stays under the bound after the upload
// and after the fetch.
func TestE2EConstantMemory(t *testing.T) {
	needTool(t, "curl")
	needTool(t, "qemu-img")
	work := t.TempDir()
	bin := serveBinary(t)
	s := startServeWith(t, bin, filepath.Join(work, "data"), nil, nil)
	pid := s.cmd.Process.Pid

	// The limit the runtime runs with, as the Go collector reports it
	// (runtime/metrics /gc/gomemlimit:bytes). cleanEnv keeps GOMEMLIMIT
	// out of the child's environment.
	if v := mustMetric(t, s.scrape(t), "go_gc_gomemlimit_bytes", nil); v != 32<<20 {
		t.Errorf("go_gc_gomemlimit_bytes = %v without GOMEMLIMIT, want %d (32 MiB)", v, 32<<20)
	}

	disk, size, sum := bigImage(t, work, bigImageVirtual)
	if size < 4*rssBound {
		t.Fatalf("the image (%d bytes) is not 4 times the bound %d", size, rssBound)
	}
	before := peakRSS(t, pid)
	img := s.uploadFile(t, s.ticket(t, "big"), disk, size, sum)
	afterUpload := peakRSS(t, pid)
	t.Logf("peak RSS: %d MiB at start, %d MiB after a %d MiB upload", before>>20, afterUpload>>20, size>>20)
	if afterUpload > rssBound {
		t.Errorf("serve's peak RSS reached %d MiB during a %d MiB upload, over the %d MiB bound: the upload is not streamed",
			afterUpload>>20, size>>20, rssBound>>20)
	}

	// The fetch's own peak: reset VmHWM to the current RSS first (a
	// kernel that refuses leaves the peak of the whole run, which must be
	// under the bound all the same).
	fetch := s.fetchURL(t, img.UploadID)
	reset := resetPeakRSS(pid)
	n, got := fetchAll(t, fetch, 3*time.Minute)
	if n != size || got != sum {
		t.Fatalf("fetch returned %d bytes with sha256 %s, want %d, %s", n, got, size, sum)
	}
	afterFetch := peakRSS(t, pid)
	t.Logf("peak RSS of the fetch: %d MiB (peak reset before it: %v)", afterFetch>>20, reset)
	if afterFetch > rssBound {
		t.Errorf("serve's peak RSS reached %d MiB during a %d MiB fetch, over the %d MiB bound: the fetch is not streamed",
			afterFetch>>20, size>>20, rssBound>>20)
	}
}

// TestE2EMemoryLimitFromEnv: GOMEMLIMIT, when set, wins over serve's own
// 32 MiB (docs/operations.md).
func TestE2EMemoryLimitFromEnv(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil, "GOMEMLIMIT=96MiB")
	if v := mustMetric(t, s.scrape(t), "go_gc_gomemlimit_bytes", nil); v != 96<<20 {
		t.Errorf("go_gc_gomemlimit_bytes = %v with GOMEMLIMIT=96MiB, want %d", v, 96<<20)
	}
}

// sendfileDone is a completed sendfile(2) line of strace and what it
// returned (a byte count; failures such as EAGAIN do not match).
var sendfileDone = regexp.MustCompile(`(?:\bsendfile\(|<\.\.\. sendfile resumed>).*\)\s+=\s+(\d+)\s*$`)

// TestE2EFetchUsesSendfile: "fetch with ranges and sendfile" (README). strace
// attached to the running serve records every sendfile(2) while a whole
// image is fetched: together they carried every byte of it.
func TestE2EFetchUsesSendfile(t *testing.T) {
	needTool(t, "strace")
	needTool(t, "curl")
	needTool(t, "qemu-img")
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "data"), nil)
	disk, size, sum := bigImage(t, work, 64<<20)
	img := s.uploadFile(t, s.ticket(t, "sendfile"), disk, size, sum)
	fetch := s.fetchURL(t, img.UploadID)

	// Attach to every thread of serve (-f with -p); strace says so on
	// stderr once it is attached.
	trace := filepath.Join(work, "strace.out")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := exec.CommandContext(ctx, "strace", "-f", "-e", "trace=sendfile", "-o", trace, "-p", strconv.Itoa(s.cmd.Process.Pid))
	st.Env = cleanEnv()
	var stderr syncBuffer
	st.Stderr = &stderr
	st.WaitDelay = 5 * time.Second
	if err := st.Start(); err != nil {
		t.Fatalf("strace: %v", err)
	}
	stDone := make(chan error, 1)
	go func() { stDone <- st.Wait() }()
	detached := false
	detach := func() {
		if detached {
			return
		}
		detached = true
		// SIGINT: strace detaches and serve runs on untraced.
		if err := st.Process.Signal(os.Interrupt); err != nil {
			t.Errorf("SIGINT to strace: %v", err)
		}
		select {
		case <-stDone:
		case <-time.After(20 * time.Second):
			_ = st.Process.Kill()
			t.Fatalf("strace did not detach within 20s of SIGINT; stderr:\n%s", stderr.String())
		}
	}
	defer detach()
	poll(t, 400, 25*time.Millisecond, "strace to attach to serve", func() bool {
		select {
		case err := <-stDone:
			stDone <- err
			t.Fatalf("strace exited before it attached (%v; ptrace refused?):\n%s", err, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), "attached")
	}, func() string { return "strace's stderr:\n" + stderr.String() })

	n, got := fetchAll(t, fetch, time.Minute)
	if n != size || got != sum {
		t.Fatalf("fetch returned %d bytes with sha256 %s, want %d, %s", n, got, size, sum)
	}
	// The fetch is counted after its last sendfile returned; from then on
	// strace has written every line of it.
	poll(t, 400, 25*time.Millisecond, "vmshelf_transfers_total{fetch,ok} to count the fetch", func() bool {
		v, ok := metricValue(s.scrape(t), "vmshelf_transfers_total", map[string]string{"direction": "fetch", "outcome": "ok"})
		return ok && v == 1
	})
	detach()

	f, err := os.Open(trace)
	if err != nil {
		t.Fatalf("strace's output: %v", err)
	}
	defer f.Close()
	var sent int64
	calls := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := sendfileDone.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseInt(m[1], 10, 64)
			if err != nil {
				t.Fatalf("strace line %q: %v", sc.Text(), err)
			}
			sent += v
			calls++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sendfile calls carried %d of %d bytes", calls, sent, size)
	if sent != size {
		t.Errorf("sendfile(2) carried %d bytes of a %d-byte fetch (%d calls), want all of them", sent, size, calls)
	}
}
