// Command bench measures vmshelf against the limits of the machine and
// against nginx and tusd, on the same machine and the same file, and writes
// docs/bench.md and docs/bench.json. See bench/README.md.
//
//	go run ./bench [-quick] [-md docs/bench.md] [-json docs/bench.json]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/gobin"
)

type options struct {
	quick      bool
	strict     bool
	reps       int
	sizeMiB    int64 // the test file of the upload and fetch phases
	bigMiB     int64 // concurrency phase, large uploads
	smallMiB   int64 // concurrency phase, small uploads (RSS constant in size?)
	loadFor    time.Duration
	dir        string
	mdOut      string
	jsonOut    string
	keep       bool
	nginx      string
	tusd       string
	phases     string
	controlQPS int
	perfDir    string
	s3HTTP     bool // the S3 phase over plain http instead of https
}

var allPhases = []string{"control", "slowbody", "refusal", "upload", "fetch", "range", "importer", "concurrency", "s3"}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "slowbody" {
		addr, n, err := slowBodyArgs(os.Args[2:])
		if err == nil {
			err = runSlowBody(addr, n)
		}
		log.Fatal(err)
	}
	if len(os.Args) == 3 && os.Args[1] == "discard" {
		if err := runDiscard(os.Args[2]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var o options
	flag.BoolVar(&o.quick, "quick", false, "short run for CI: 256 MiB file, 1 repetition, short load phases (< 3 min)")
	flag.BoolVar(&o.strict, "strict", false, "exit 1 if the run recorded any error (a bad answer, a subject that could not run, a check of the bench that failed), after writing the reports; never because of a figure or a missed target (make bench QUICK=1 sets it: the CI smoke test)")
	flag.IntVar(&o.reps, "reps", 0, "repetitions per measurement (default 5, 1 with -quick)")
	flag.Int64Var(&o.sizeMiB, "size-mib", 0, "test file size in MiB (default 2048, 256 with -quick)")
	flag.Int64Var(&o.bigMiB, "big-mib", 0, "image size of the 4 concurrent uploads (default 4096, 256 with -quick)")
	flag.Int64Var(&o.smallMiB, "small-mib", 0, "the same with small images, to see RSS is constant in size (default 256, 64 with -quick)")
	flag.DurationVar(&o.loadFor, "load-for", 0, "duration of each wrk / constant-rate load (default 10s, 3s with -quick)")
	flag.StringVar(&o.dir, "dir", "", "work directory for the file and the servers' data (default: a new directory in $TMPDIR); must be on the disk to measure")
	flag.StringVar(&o.mdOut, "md", "docs/bench.md", "Markdown report (empty: none)")
	flag.StringVar(&o.jsonOut, "json", "docs/bench.json", "JSON report (empty: none)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.StringVar(&o.nginx, "nginx", "nginx", "nginx binary")
	flag.StringVar(&o.tusd, "tusd", "", "tusd v2 binary (default: $TUSD, /root/go/bin/tusd, $GOPATH/bin/tusd or tusd in PATH)")
	flag.StringVar(&o.phases, "phases", strings.Join(allPhases, ","), "phases to run, comma-separated")
	flag.IntVar(&o.controlQPS, "control-rate", 500, "request rate of the constant-rate control plane load")
	flag.BoolVar(&o.s3HTTP, "s3-http", false, "run the S3 phase's server over plain http (default https with a self-signed certificate, as S3 in production is https)")
	flag.StringVar(&o.perfDir, "perf", "", "record a `perf record -g` profile of vmshelf for each of its upload, range and control runs into this directory (diagnosis only)")
	flag.Parse()
	def := func(v *int64, full, quick int64) {
		if *v == 0 {
			*v = map[bool]int64{false: full, true: quick}[o.quick]
		}
	}
	def(&o.sizeMiB, 2048, 256)
	def(&o.bigMiB, 4096, 256)
	def(&o.smallMiB, 256, 64)
	if o.reps == 0 {
		o.reps = map[bool]int{false: 5, true: 1}[o.quick]
	}
	if o.loadFor == 0 {
		o.loadFor = map[bool]time.Duration{false: 10 * time.Second, true: 3 * time.Second}[o.quick]
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	opt    options
	rep    *Report
	dir    string
	vmBin  string
	vm     *vmshelf
	ngx    *nginx
	tus    *tusd
	disc   *discard
	file   string // the test file
	size   int64
	sha    string
	fetch  fetchTarget
	mu     sync.Mutex
	others map[string]bool
}

// fetchTarget is the image the fetch phases read: stored once by vmshelf,
// served by vmshelf (token URL) and by nginx (the same file, by path).
type fetchTarget struct {
	id, ngxURL, path string
	vm               fetchCap
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func run(o options) (err error) {
	start := time.Now()
	mode := map[bool]string{false: "full", true: "quick"}[o.quick]
	b := &bench{opt: o, rep: &Report{Mode: mode, Started: start, Reps: o.reps}, others: map[string]bool{}}
	if o.tusd == "" {
		o.tusd = findTusd()
		b.opt.tusd = o.tusd
	}
	phases := strings.Split(o.phases, ",")
	for _, p := range phases {
		if !slices.Contains(allPhases, p) {
			return fmt.Errorf("unknown phase %q (have %s)", p, strings.Join(allPhases, ","))
		}
	}

	// Work directory and cleanup, also on Ctrl-C.
	if o.dir == "" {
		b.dir, err = os.MkdirTemp("", "vmshelf-bench-")
	} else {
		b.dir = o.dir
		err = os.MkdirAll(b.dir, 0o755)
	}
	if err != nil {
		return err
	}
	b.dir, _ = filepath.Abs(b.dir)
	if t := fsType(b.dir); t == "tmpfs" || t == "ramfs" {
		return fmt.Errorf("%s is on %s, not a disk: pass -dir on the disk to measure", b.dir, t)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer b.cleanup()
	go b.watchOtherLoad(ctx)
	interrupted := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			logf("interrupted: stopping servers")
			b.cleanup()
			os.Exit(130)
		case <-interrupted:
		}
	}()
	defer close(interrupted)

	logf("bench %s mode, %d rep(s), work dir %s", mode, o.reps, b.dir)
	machine(b.rep, b.dir, o.nginx, o.tusd)
	if err := b.setup(); err != nil {
		return err
	}

	for _, p := range phases {
		syscall.Sync()
		logf("phase %s", p)
		var perr error
		switch p {
		case "control":
			perr = b.phaseControl()
		case "slowbody":
			perr = b.phaseSlowBody()
		case "refusal":
			perr = b.phaseRefusal()
		case "upload":
			perr = b.phaseUpload()
		case "fetch":
			perr = b.phaseFetch()
		case "range":
			perr = b.phaseRange()
		case "importer":
			perr = b.phaseImporter()
		case "concurrency":
			perr = b.phaseConcurrency()
		case "s3":
			perr = b.phaseS3()
		}
		if perr != nil {
			b.fail("phase %s: %v", p, perr)
		}
	}

	b.rep.Seconds = time.Since(start).Seconds()
	b.rep.finish()
	b.mu.Lock()
	b.rep.OtherLoad = []string{}
	for k := range b.others {
		b.rep.OtherLoad = append(b.rep.OtherLoad, k)
	}
	b.mu.Unlock()
	slices.Sort(b.rep.OtherLoad)
	b.targets()
	b.notes()
	if err := writeOutputs(b.rep, o.mdOut, o.jsonOut); err != nil {
		return err
	}
	logf("done in %.0f s: %s %s", b.rep.Seconds, o.mdOut, o.jsonOut)
	printSummary(b.rep)
	if o.strict && len(b.rep.Errors) > 0 {
		return fmt.Errorf("-strict: the run recorded %d error(s), listed above and under Errors in the report", len(b.rep.Errors))
	}
	return nil
}

func findTusd() string {
	if p := os.Getenv("TUSD"); p != "" {
		return p
	}
	if p, _, err := gobin.Find("tusd"); err == nil {
		return p
	}
	return "tusd"
}

// fail records an error of a measurement; the run goes on.
func (b *bench) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	logf("ERROR %s", msg)
	b.mu.Lock()
	b.rep.Errors = append(b.rep.Errors, msg)
	b.mu.Unlock()
}

// watchOtherLoad notes fuzzers, test runs and compilers running at any
// time of the run.
func (b *bench) watchOtherLoad(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		for _, p := range otherLoad() {
			b.mu.Lock()
			if !b.others[p] {
				logf("other load: %s", p)
			}
			b.others[p] = true
			b.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *bench) setup() error {
	// vmshelf from this tree.
	b.vmBin = filepath.Join(b.dir, "vmshelf")
	logf("building vmshelf from the tree")
	if out, err := exec.Command("go", "build", "-o", b.vmBin, "./cmd/vmshelf").CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/vmshelf (run from the module root): %v\n%s", err, out)
	}
	rev := strings.TrimSpace(cmdOut("git", "rev-parse", "--short", "HEAD"))
	if cmdOut("git", "status", "--porcelain", "--untracked-files=no", "--", "gateway", "cmd", "imagestore", "market", "internal") != "" {
		rev += " + uncommitted changes"
	}
	b.rep.setMachine("vmshelf", "built from the tree at "+rev)

	b.size = b.opt.sizeMiB << 20
	b.file = filepath.Join(b.dir, "test.qcow2")
	logf("making the %d MiB test image", b.opt.sizeMiB)
	if err := makeImage(b.file, b.size, 1); err != nil {
		return err
	}
	sha, n, err := sha256File(b.file)
	if err != nil {
		return err
	}
	b.sha, b.size = sha, n
	b.rep.setSetup("test file", fmt.Sprintf("`%s`: QCOW2, %d MiB virtual, fully allocated with pseudo-random data (qemu-img convert from a seeded random raw file), %d bytes, sha256 %s…", b.file, b.opt.sizeMiB, n, sha[:16]))
	b.rep.setSetup("same disk", "the test file, every server's data directory and nginx's client_body_temp_path are under "+b.dir+" (one filesystem, see Machine)")

	if b.vm, err = startVmshelf(b.vmBin, b.dir, 8); err != nil {
		return err
	}
	b.rep.setSetup("vmshelf", "`vmshelf "+strings.Join(b.vm.args, " ")+"` (data plane fasthttp, control plane net/http)")

	// The image the fetch phases read, stored by vmshelf itself.
	if ph := strings.Split(b.opt.phases, ","); slices.Contains(ph, "fetch") || slices.Contains(ph, "range") || slices.Contains(ph, "importer") || slices.Contains(ph, "concurrency") {
		tk, err := b.vm.ticket("bench fetch image")
		if err != nil {
			return err
		}
		res, err := curlPut(b.file, tk.UploadURL)
		if err != nil || res.Code != 201 {
			return fmt.Errorf("storing the fetch image: %v %d %s", err, res.Code, res.Body)
		}
		b.fetch.id = tk.UploadID
		b.fetch.path = b.vm.imagePath(tk.UploadID)
		if b.fetch.vm, err = b.vm.mintFetch(tk.UploadID); err != nil {
			return err
		}
	}
	// A peer that cannot start is reported and its measurements are
	// missing; vmshelf's own are still made.
	if b.ngx, err = startNginx(b.opt.nginx, b.dir, filepath.Join(b.vm.dataDir, "vm-images")); err != nil {
		b.fail("nginx: %v", err)
		b.ngx = nil
	} else {
		if b.fetch.id != "" {
			b.fetch.ngxURL = "http://" + b.ngx.addr + "/img/" + b.fetch.id + ".qcow2"
		}
		b.rep.setSetup("nginx", "`nginx -p … -c "+b.ngx.conf+"`: daemon off, master_process on, worker_processes 2, user root, sendfile on, tcp_nopush on, access_log off; `location /up/ { dav_methods PUT; }` with client_body_temp_path on the same disk and client_max_body_size 0; `location /img/` aliases vmshelf's vm-images directory, so both serve the very same file")
	}
	if b.tus, err = startTusd(b.opt.tusd, b.dir); err != nil {
		b.fail("tusd: %v", err)
		b.tus = nil
	} else {
		b.rep.setSetup("tusd", "`tusd -host 127.0.0.1 -port … -upload-dir <dir> -base-path /files/ -behind-proxy=false -expose-metrics=false -show-greeting=false -verbose=false -network-timeout 5m` (filestore): creation POST untimed, then one PATCH of the whole file")
	}
	if b.disc, err = startDiscard(b.dir); err != nil {
		b.fail("discard server: %v", err)
		b.disc = nil
	}
	b.rep.setSetup("client", "curl for every upload (`curl -T file`, streamed from the file, Expect: 100-continue) and whole-file fetch (`curl -o /dev/null`); wrk for range reads (`-t2 -c8`) and saturated control-plane load; nbdkit-curl + qemu-img, and a Go model with 4 parallel readers, for the importer; a Go open-loop client (at most 64 keep-alive connections) for constant-rate control-plane load; raw TCP for the refusals and idle connections. URLs and tokens reach curl on stdin, wrk by env, nbdkit from a file: never on a command line")
	return nil
}

func (b *bench) cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range []*proc{procOf(b.vm), procOf(b.ngx), procOf(b.tus), procOf(b.disc)} {
		if p != nil {
			p.stop()
		}
	}
	b.vm, b.ngx, b.tus, b.disc = nil, nil, nil, nil
	if !b.opt.keep && b.dir != "" && b.opt.dir == "" {
		os.RemoveAll(b.dir)
		b.dir = ""
	}
}

func procOf(s interface{ procPtr() *proc }) *proc {
	if s == nil {
		return nil
	}
	return s.procPtr()
}

func (v *vmshelf) procPtr() *proc {
	if v == nil {
		return nil
	}
	return v.proc
}
func (n *nginx) procPtr() *proc {
	if n == nil {
		return nil
	}
	return n.proc
}
func (t *tusd) procPtr() *proc {
	if t == nil {
		return nil
	}
	return t.proc
}
func (d *discard) procPtr() *proc {
	if d == nil {
		return nil
	}
	return d.proc
}

// rotate is the order of repetition r: ABC, BCA, CAB, …
func rotate[T any](xs []T, r int) []T {
	out := make([]T, len(xs))
	for i := range xs {
		out[i] = xs[(i+r)%len(xs)]
	}
	return out
}

// settle lets the disk finish what earlier steps left dirty, so that a
// measurement does not pay for the one before it.
func settle() {
	syscall.Sync()
	time.Sleep(300 * time.Millisecond)
}

const (
	gib = float64(1 << 30)
	mb  = 1e6
	mib = float64(1 << 20)
)

var nan = math.NaN()

func printSummary(r *Report) {
	fmt.Fprintln(os.Stderr)
	for _, t := range r.Targets {
		mark := "MISS"
		switch {
		case t.Missing:
			mark = "n/a "
		case t.Met:
			mark = "ok  "
		}
		fmt.Fprintf(os.Stderr, "  %s %-70s %s %s (target %s %s)\n", mark, t.Name, fmtNum(t.Measured, 2), t.Unit, t.Op, fmtNum(t.Threshold, 2))
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(os.Stderr, "  %d error(s): %s\n", len(r.Errors), strings.Join(r.Errors, "; "))
	}
}
