package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The importer phase reads the fetch image the way CDI's importer does
// with an http source: a HEAD for the size, a GET of the whole image that
// it reads the format from and then keeps open (untouched) while it
// converts, and range reads of the whole image. Two readers, one table
// each:
//   - nbdkit: the real thing, what CDI runs today: nbdkit's curl plugin
//     with CDI's arguments and filters (readahead, retry) on a Unix
//     socket, and `qemu-img info` + `qemu-img convert` on that socket, into
//     a target that discards (null-co), so that no copy is written. The
//     nbdkit of Debian 12 (1.32) serialises the curl plugin's requests:
//     one range at a time over one keep-alive connection.
//   - model: the same HEAD and held GET, then 4 goroutines reading the
//     image in 256 KiB ranges over 4 keep-alive connections, every answer
//     compared with the file. A model of an importer whose nbdkit reads in
//     parallel (newer nbdkit keeps a pool of curl connections), not the
//     importer. qemu-img's own http driver (what CDI ran before nbdkit,
//     several connections) would be the real parallel reader, but here
//     (qemu 7.2, libcurl 7.88) it hung in the middle of a convert, its
//     connections closed by the server after 60 s of not reading.
//
// vmshelf is read by the form the provisioner hands to CDI (…/fetch/<id>,
// the token as basic-auth password, for nbdkit read from a file so that
// it is on no command line); nginx serves the same file by path and gets
// the same requests (it ignores the credentials).

const (
	impNbdkit = "nbdkit"
	impModel  = "model"
	// impPeek is what the held GET reads before it sits: the format
	// detection's look at the header.
	impPeek = 64 << 10
	// The model's readers and their range size.
	impReaders = 4
	impRange   = 256 << 10
)

func importerTableID(reader string) string { return "importer_" + reader }

func (b *bench) phaseImporter() error {
	if b.fetch.id == "" {
		return fmt.Errorf("no fetch image")
	}
	for _, tool := range []string{"qemu-img", "nbdkit"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian: qemu-utils, nbdkit): %w", tool, err)
		}
	}
	virt, err := virtualSize(b.file)
	if err != nil {
		return err
	}
	pass := filepath.Join(b.dir, "importer-token")
	if err := os.WriteFile(pass, []byte(b.fetch.vm.token), 0o600); err != nil {
		return err
	}
	defer os.Remove(pass)

	subjects := []string{fVmshelf, fNginx}
	roles := map[string]string{fVmshelf: "vmshelf", fNginx: "peer"}
	readers := []string{impNbdkit, impModel}
	tables := map[string]*Table{}
	for _, rd := range readers {
		title, how := "Importer: nbdkit curl + qemu-img convert, as CDI runs it",
			"`nbdkit --readonly -U <socket> --filter=readahead --filter=retry -r curl url=… user=… password=+<file> retry-exponential=no` (CDI's arguments; nbdkit 1.32, whose curl plugin serialises its requests: one range at a time on one keep-alive connection), "+
				"started untimed; then `qemu-img info` and `qemu-img convert -t writeback -p -n nbd+unix:///?socket=<socket> --target-image-opts driver=null-co,size=<virtual size>` (the target discards). "+
				"In the first repetition `qemu-img compare` of the served image against the local file checks every byte (untimed)"
		if rd == impModel {
			title, how = fmt.Sprintf("Importer model: %d parallel readers of %d KiB ranges (a Go client, not the importer)", impReaders, impRange>>10),
				fmt.Sprintf("%d goroutines, each on its own keep-alive connection, read the image in %d KiB ranges (taken in order from a shared counter, as qemu-img convert's parallel requests go through an image), "+
					"every answer checked to be a 206 with the right Content-Range and compared byte for byte with the file. A model of an importer whose nbdkit reads in parallel, not CDI's importer: "+
					"qemu-img's own http driver, the real parallel reader, hung here in the middle of a convert (qemu 7.2, libcurl 7.88)", impReaders, impRange>>10)
		}
		t := b.rep.table(importerTableID(rd), title,
			fmt.Sprintf("What CDI's importer sends to a fetch URL: a HEAD, a GET of the whole image that reads %d KiB (the format) and then stays open unread until the end, and, while it is open, range reads of the whole image: %s. "+
				"The %d MiB image is in the page cache. vmshelf: its Authorization form (…/fetch/<upload_id>, the token as basic-auth password); nginx: the same file by path, the same requests. "+
				"*MB/s*: the image size over the time from the HEAD to the last range read. *bad answers*: a HEAD or GET not answered 200, a range read answered wrong, a qemu-img that failed. "+
				"*bytes served ÷ image*: vmshelf's `vmshelf_transfer_bytes_total{direction=\"fetch\"}` over the run (readahead overlap and the held GET's buffered bytes included): at least 1 when every byte was read.",
				impPeek>>10, how, b.size>>20),
			Metric{Key: "mbps", Label: "MB/s", Unit: "MB/s", Better: "higher", digits: 0},
			Metric{Key: "convert_s", Label: "range reads s", Unit: "s", Better: "lower", digits: 2},
			Metric{Key: "cpu", Label: "server CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 3},
			Metric{Key: "served", Label: "bytes served ÷ image", digits: 2},
			Metric{Key: "bad", Label: "bad answers", digits: 0},
			Metric{Key: "rss", Label: "server peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		)
		for _, s := range subjects {
			t.row(s, roles[s])
		}
		tables[rd] = t
	}
	if err := warm(b.fetch.path); err != nil {
		return err
	}
	for r := range b.opt.reps {
		for _, rd := range readers {
			t := tables[rd]
			for _, s := range rotate(subjects, r) {
				if s == fNginx && b.ngx == nil {
					b.fail("importer nginx: not running")
					continue
				}
				logf("  importer %s rep %d: %s", rd, r+1, s)
				settle()
				res, err := b.importOnce(rd, s, virt, pass, r == 0)
				if err != nil {
					b.fail("importer %s %s rep %d: %v", rd, s, r+1, err)
				}
				if res.bad > 0 {
					b.fail("importer %s %s rep %d: %d bad answer(s): %s", rd, s, r+1, res.bad, res.why)
				}
				logf("    → %.0f MB/s, %.3f s CPU/GiB, %.2f × the image served, %d bad", res.mbps, res.cpu, res.served, res.bad)
				t.add(s, roles[s], "mbps", res.mbps)
				t.add(s, roles[s], "convert_s", res.convert)
				t.add(s, roles[s], "cpu", res.cpu)
				t.add(s, roles[s], "served", res.served)
				t.add(s, roles[s], "bad", float64(res.bad))
				t.add(s, roles[s], "rss", res.rss)
			}
		}
	}
	for _, t := range tables {
		t.ratio("mbps", fVmshelf, fNginx, "mbps")
		t.ratio("cpu", fVmshelf, fNginx, "cpu")
	}
	return nil
}

type importResult struct {
	mbps, convert, cpu, served, rss float64
	bad                             int
	why                             string
}

// importOnce imports the fetch image from subject with reader once; check
// adds the untimed qemu-img compare.
func (b *bench) importOnce(reader, subject string, virt int64, pass string, check bool) (importResult, error) {
	res := importResult{mbps: nan, convert: nan, cpu: nan, served: nan, rss: nan}
	url, pids := b.fetch.vm.byID, b.vm.pids
	if subject == fNginx {
		url, pids = b.fetch.ngxURL, b.ngx.pids
	}
	bad := func(format string, a ...any) {
		res.bad++
		if res.why != "" {
			res.why += "; "
		}
		res.why += fmt.Sprintf(format, a...)
	}

	// nbdkit is started untimed, as CDI starts it before the convert.
	var src string
	if reader == impNbdkit {
		nb, sock, err := b.startNbdkit(url, pass)
		if err != nil {
			return res, err
		}
		defer nb.stop()
		src = "nbd+unix:///?socket=" + sock
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	qemu := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "qemu-img", args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("qemu-img %s: %v: %.300s", args[0], err, bytes.TrimSpace(out.Bytes()))
		}
		return nil
	}
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer hc.Transport.(*http.Transport).CloseIdleConnections()
	req := func(method string) *http.Request {
		r, _ := http.NewRequestWithContext(ctx, method, url, nil)
		r.SetBasicAuth("importer", b.fetch.vm.token)
		r.Header.Set("User-Agent", "cdi-golang-importer")
		return r
	}

	served0, _ := b.vm.metric(`vmshelf_transfer_bytes_total{direction="fetch"}`)
	m := startMeter(pids)
	t0 := time.Now()
	if resp, err := hc.Do(req(http.MethodHead)); err != nil {
		bad("HEAD: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != b.size {
			bad("HEAD answered %d with Content-Length %d", resp.StatusCode, resp.ContentLength)
		}
	}
	held, err := hc.Do(req(http.MethodGet))
	if err != nil {
		bad("GET: %v", err)
	} else {
		if held.StatusCode != 200 {
			bad("GET answered %d", held.StatusCode)
		} else if _, err := io.CopyN(io.Discard, held.Body, impPeek); err != nil {
			bad("GET's first %d bytes: %v", impPeek, err)
		}
		defer held.Body.Close()
	}
	tc := time.Now()
	if reader == impNbdkit {
		if err := qemu("info", "--output=json", src); err != nil {
			bad("%v", err)
		}
		if err := qemu("convert", "-t", "writeback", "-p", "-n", src, "--target-image-opts", "driver=null-co,size="+strconv.FormatInt(virt, 10)); err != nil {
			bad("%v", err)
		}
	} else if n, why := b.readRanges(ctx, req); n > 0 {
		res.bad += n - 1
		bad("%s", why)
	}
	res.convert = time.Since(tc).Seconds()
	if held != nil {
		held.Body.Close()
	}
	wall := time.Since(t0).Seconds()
	use := m.end()
	if res.bad == 0 {
		res.mbps = float64(b.size) / wall / mb
	}
	res.cpu = use.CPU / (float64(b.size) / gib)
	res.rss = float64(use.PeakRSS) / mib
	if subject == fVmshelf {
		served1, _ := b.vm.metric(`vmshelf_transfer_bytes_total{direction="fetch"}`)
		res.served = (served1 - served0) / float64(b.size)
		if res.bad == 0 && res.served < 1 {
			bad("vmshelf served %.0f bytes of the %d-byte image: not every byte was read", served1-served0, b.size)
		}
	}
	if check && reader == impNbdkit {
		// Every byte as served against the file: exit 0 identical, 1 differ.
		if err := qemu("compare", "-f", "qcow2", "-F", "qcow2", src, b.fetch.path); err != nil {
			bad("served image differs from the file, or could not be compared: %v", err)
		}
	}
	return res, nil
}

// readRanges reads the whole image in impRange ranges with impReaders
// goroutines, each on its own keep-alive connection, and compares every
// answer with the file. It returns the number of bad answers and the
// first of them.
func (b *bench) readRanges(ctx context.Context, req func(string) *http.Request) (int, string) {
	f, err := os.Open(b.fetch.path)
	if err != nil {
		return 1, err.Error()
	}
	defer f.Close()
	ranges := (b.size + impRange - 1) / impRange
	var next atomic.Int64
	var nbad atomic.Int64
	var mu sync.Mutex
	first := ""
	fail := func(format string, a ...any) {
		if nbad.Add(1) == 1 {
			mu.Lock()
			first = fmt.Sprintf(format, a...)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for range impReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{DisableCompression: true, MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			got, want := make([]byte, impRange), make([]byte, impRange)
			for {
				i := next.Add(1) - 1
				if i >= ranges || ctx.Err() != nil {
					return
				}
				off := i * impRange
				n := min(int64(impRange), b.size-off)
				r := req(http.MethodGet)
				r.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
				resp, err := c.Do(r)
				if err != nil {
					fail("range at %d: %v", off, err)
					return
				}
				cr := resp.Header.Get("Content-Range")
				m, rerr := io.ReadFull(resp.Body, got[:n])
				extra, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_, ferr := f.ReadAt(want[:n], off)
				switch {
				case resp.StatusCode != http.StatusPartialContent:
					fail("range at %d answered %d", off, resp.StatusCode)
				case cr != fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, b.size):
					fail("range at %d answered Content-Range %q", off, cr)
				case rerr != nil || extra != 0:
					fail("range at %d: %d bytes and %d more (%v), want %d", off, m, extra, rerr, n)
				case ferr != nil:
					fail("reading the file at %d: %v", off, ferr)
				case !bytes.Equal(got[:n], want[:n]):
					fail("range at %d: the bytes differ from the file", off)
				}
			}
		}()
	}
	wg.Wait()
	return int(nbad.Load()), first
}

// startNbdkit starts nbdkit's curl plugin on url as CDI does and waits for
// its pid file; the token is read from the file pass.
func (b *bench) startNbdkit(url, pass string) (*proc, string, error) {
	sock := filepath.Join(b.dir, "nbdkit.sock")
	pid := filepath.Join(b.dir, "nbdkit.pid")
	_ = os.Remove(sock)
	_ = os.Remove(pid)
	p, err := startProc("nbdkit", filepath.Join(b.dir, "nbdkit.log"), false, "nbdkit",
		"--foreground", "--readonly", "--exit-with-parent", "-U", sock, "--pidfile", pid,
		"--filter=readahead", "--filter=retry", "-r", "curl",
		"header=User-Agent: cdi-nbdkit-importer", "retry-exponential=no",
		"user=importer", "password=+"+pass, "url="+url)
	if err != nil {
		return nil, "", err
	}
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(pid); err == nil {
			return p, sock, nil
		}
	}
	p.stop()
	return nil, "", fmt.Errorf("nbdkit wrote no pid file within 15 s; log:\n%s", p.logTail())
}

// virtualSize is the QCOW2 image's virtual disk size.
func virtualSize(file string) (int64, error) {
	out, err := exec.Command("qemu-img", "info", "--output=json", file).Output()
	if err != nil {
		return 0, fmt.Errorf("qemu-img info %s: %w", file, err)
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return 0, fmt.Errorf("qemu-img info %s: %w", file, err)
	}
	return info.VirtualSize, nil
}
