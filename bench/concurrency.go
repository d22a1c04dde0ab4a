package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmshelf/vmshelf/internal/reason"
)

const (
	idleConns     = 1000
	concUploads   = 4
	concFetches   = 4
	probeUploads  = 4
	probeBusy     = 2        // fetch probes that wait out the queue wait and get 503
	fetchRateEach = 16 << 20 // bytes/s per held fetch: they must last as long as the uploads
	minUpload     = 10 * time.Second
	// headroom is serve's --headroom-mib default: free space an upload
	// must leave beside everything promised.
	headroom = 1 << 30
)

// concCaps are the fetch capabilities of one concurrency phase. A slot is
// held per token (the GETs of one token share one), so the held fetches
// need a token each to take concFetches slots, and each fetch probe its
// own, or it would join a held one's slot instead of probing the cap.
type concCaps struct {
	held   []fetchCap // one per held GET
	busy   []fetchCap // the probes that wait out --fetch-queue-wait
	served fetchCap   // the probe that waits until a held GET ends
}

func (b *bench) mintConcCaps() (concCaps, error) {
	var c concCaps
	mint := func(n int) ([]fetchCap, error) {
		var out []fetchCap
		for range n {
			fc, err := b.vm.mintFetch(b.fetch.id)
			if err != nil {
				return nil, err
			}
			out = append(out, fc)
		}
		return out, nil
	}
	var err error
	if c.held, err = mint(concFetches); err != nil {
		return c, err
	}
	if c.busy, err = mint(probeBusy); err != nil {
		return c, err
	}
	served, err := mint(1)
	if err != nil {
		return c, err
	}
	c.served = served[0]
	return c, nil
}

func (b *bench) phaseConcurrency() error {
	if b.fetch.id == "" {
		return fmt.Errorf("no fetch image")
	}
	wait := fetchQueueWait.Seconds()
	t := b.rep.table("concurrency", "Concurrency: 4 uploads + 4 fetches + 1 000 idle keep-alive connections",
		fmt.Sprintf("vmshelf with --max-transfers %d and --fetch-queue-wait %gs. First %d keep-alive connections each make one HEAD of the fetch URL and then stay idle; then %d `curl -T` uploads "+
			"(each its own ticket, held by `--limit-rate` to last at least 10 s, which only slows images under a few GiB) and %d GETs of the stored %d MiB image, each with its own fetch token "+
			"(a slot is held per token: GETs of one token share one), run at once (each GET read at %d MiB/s so that it holds its slot as long as the uploads run). "+
			"Once /metrics shows %d uploads and %d fetches in flight (every slot taken), probes check what the service promises beyond the cap: "+
			"%d uploads (Go client, Expect: 100-continue, announcing the %d MiB image, so that only the cap can refuse them, never the free space) must get 503 `busy` with Retry-After at once; "+
			"%d GETs with new tokens must wait and get 503 `busy` with Retry-After after the queue wait; one more GET with a new token must wait until the bench ends one held GET, and then be served (200); "+
			"and a range read with a held GET's token must be answered 206 at once, in that token's slot. "+
			"The phase first checks that the data directory has room for the %d uploads and the 1 GiB headroom. "+
			"Peak RSS of the vmshelf process from the transfers' start to their end (VmHWM reset at the start, and VmRSS sampled every 50 ms). "+
			"Each run starts a fresh vmshelf process (same data directory), so that runs do not inherit each other's heap, except the *no restart* row, which runs in the process "+
			"as the run before it (or the phase before) left it: what a long-running server sees. *RSS at start* is VmRSS then, *RSS with idle conns* "+
			"with the idle connections open, before the transfers; Go heap in use, stacks and goroutines are read from /metrics while all 8 transfers run. At the end every idle connection makes another HEAD: *alive* counts the ones that still answer. "+
			"Run at two image sizes to show that memory does not grow with the image.",
			maxTransfers, wait, idleConns, concUploads, concFetches, b.size>>20, fetchRateEach>>20, concUploads, concFetches,
			probeUploads, b.opt.smallMiB, probeBusy, concUploads),
		Metric{Key: "rss", Label: "peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		Metric{Key: "rss_base", Label: "RSS at start MiB", Unit: "MiB", digits: 1},
		Metric{Key: "rss_idle", Label: "RSS with idle conns MiB", Unit: "MiB", Better: "lower", digits: 1},
		Metric{Key: "heap", Label: "Go heap in use MiB", Unit: "MiB", digits: 1},
		Metric{Key: "stack", Label: "Go stacks MiB", Unit: "MiB", digits: 1},
		Metric{Key: "gor", Label: "goroutines", digits: 0},
		Metric{Key: "up_mbps", Label: "uploads, aggregate MB/s", Unit: "MB/s", Better: "higher", digits: 0},
		Metric{Key: "ok", Label: "uploads 201", digits: 0},
		Metric{Key: "held", Label: "fetches held (200)", digits: 0},
		Metric{Key: "up_busy", Label: fmt.Sprintf("upload probes 503 busy (of %d)", probeUploads), digits: 0},
		Metric{Key: "fe_busy", Label: fmt.Sprintf("fetch probes 503 busy after the wait (of %d)", probeBusy), digits: 0},
		Metric{Key: "retry", Label: fmt.Sprintf("503s with Retry-After (of %d)", probeUploads+probeBusy), digits: 0},
		Metric{Key: "busy_s", Label: fmt.Sprintf("s until a fetch probe's 503 (wait %gs)", wait), Unit: "s", digits: 2},
		Metric{Key: "served", Label: "fetch probe served once a slot freed (of 1)", digits: 0},
		Metric{Key: "served_ms", Label: "ms from the freed slot to its 200", Unit: "ms", Better: "lower", digits: 0},
		Metric{Key: "shared", Label: "range in a held token's slot 206 (of 1)", digits: 0},
		Metric{Key: "in_cap_refused", Label: "in-cap transfers refused", Better: "lower", digits: 0},
		Metric{Key: "alive", Label: fmt.Sprintf("idle conns alive (of %d)", idleConns), digits: 0},
		Metric{Key: "cpu", Label: "server CPU s per GiB uploaded (fetches' CPU included)", Unit: "s/GiB", Better: "lower", digits: 2},
	)
	caps, err := b.mintConcCaps()
	if err != nil {
		return fmt.Errorf("minting fetch tokens: %w", err)
	}
	type variant struct {
		label   string
		file    string
		size    int64
		restart bool
	}
	var vs []variant
	for _, mibs := range []int64{b.opt.smallMiB, b.opt.bigMiB} {
		file := b.file
		if mibs<<20 != b.opt.sizeMiB<<20 {
			file = filepath.Join(b.dir, fmt.Sprintf("conc-%d.qcow2", mibs))
			logf("  making the %d MiB image", mibs)
			if err := makeImage(file, mibs<<20, uint64(mibs)); err != nil {
				return err
			}
			defer os.Remove(file)
		}
		st, err := os.Stat(file)
		if err != nil {
			return err
		}
		vs = append(vs, variant{label: fmt.Sprintf("vmshelf, 4 × %d MiB uploads", mibs), file: file, size: st.Size(), restart: true})
	}
	// The same as the first, in the process as the run before it left it
	// (heap grown and not yet given back): what a long-running server sees.
	vs = append(vs, variant{label: fmt.Sprintf("vmshelf, 4 × %d MiB uploads, no restart", b.opt.smallMiB), file: vs[0].file, size: vs[0].size})
	for _, v := range vs {
		t.row(v.label, "vmshelf")
	}
	// The upload probes announce the small image: refused before the body
	// by the cap, they claim no space; and one that got in by mistake
	// writes little.
	probe := vs[0]
	for r := range b.opt.reps {
		for _, v := range rotate(vs, r) {
			logf("  concurrency rep %d: %s", r+1, v.label)
			var c concResult
			err := b.roomFor(concUploads * v.size)
			if err == nil {
				c, err = b.concurrencyOnce(v.file, v.size, v.restart, caps, probe.file, probe.size)
			}
			if err != nil {
				b.fail("concurrency %s rep %d: %v", v.label, r+1, err)
			}
			if c.rss == 0 { // nothing was measured
				c = concResult{rss: nan, rssIdle: nan, rssBase: nan, heap: nan, stack: nan, gor: nan, mbps: nan, cpu: nan, busySecs: nan, servedMS: nan}
			}
			logf("    → peak RSS %.1f MiB (idle %.1f), %d×201, probes: %d/%d upload 503, %d/%d fetch 503 after %.2f s, %d served, %d shared; %d alive",
				c.rss, c.rssIdle, c.ok, c.upBusy, probeUploads, c.feBusy, probeBusy, c.busySecs, c.served, c.shared, c.alive)
			t.add(v.label, "vmshelf", "rss", c.rss)
			t.add(v.label, "vmshelf", "rss_base", c.rssBase)
			t.add(v.label, "vmshelf", "rss_idle", c.rssIdle)
			t.add(v.label, "vmshelf", "heap", c.heap)
			t.add(v.label, "vmshelf", "stack", c.stack)
			t.add(v.label, "vmshelf", "gor", c.gor)
			t.add(v.label, "vmshelf", "up_mbps", c.mbps)
			t.add(v.label, "vmshelf", "ok", float64(c.ok))
			t.add(v.label, "vmshelf", "held", float64(c.held))
			t.add(v.label, "vmshelf", "up_busy", float64(c.upBusy))
			t.add(v.label, "vmshelf", "fe_busy", float64(c.feBusy))
			t.add(v.label, "vmshelf", "retry", float64(c.retry))
			t.add(v.label, "vmshelf", "busy_s", c.busySecs)
			t.add(v.label, "vmshelf", "served", float64(c.served))
			t.add(v.label, "vmshelf", "served_ms", c.servedMS)
			t.add(v.label, "vmshelf", "shared", float64(c.shared))
			t.add(v.label, "vmshelf", "in_cap_refused", float64(c.inCapRefused))
			t.add(v.label, "vmshelf", "alive", float64(c.alive))
			t.add(v.label, "vmshelf", "cpu", c.cpu)
		}
	}
	return nil
}

// roomFor checks that vmshelf's data directory can take n more bytes of
// uploads beside the headroom serve keeps free, so that an in-cap upload
// is not refused 507 noSpace and the phase measures the cap, not the disk.
func (b *bench) roomFor(n int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.vm.dataDir, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", b.vm.dataDir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if need := n + headroom + 256<<20; free < need {
		return fmt.Errorf("%s has %d MiB free; the %d uploads need %d MiB beside the 1 GiB headroom (pass -dir on a larger disk, or -big-mib smaller)",
			b.vm.dataDir, free>>20, concUploads, (n+256<<20)>>20)
	}
	return nil
}

type concResult struct {
	rss, rssIdle, rssBase       float64
	heap, stack, gor, mbps, cpu float64
	ok, held                    int
	upBusy, feBusy, retry       int
	busySecs, servedMS          float64
	served, shared              int
	inCapRefused, alive         int
}

type idleConn struct {
	c  net.Conn
	br *bufio.Reader
}

func headOn(ic *idleConn, host, path string) error {
	_ = ic.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(ic.c, "HEAD "+path+" HTTP/1.1\r\nHost: "+host+"\r\nUser-Agent: vmshelf-bench-idle\r\n\r\n"); err != nil {
		return err
	}
	req := &http.Request{Method: http.MethodHead}
	resp, err := http.ReadResponse(ic.br, req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		return fmt.Errorf("HEAD answered %d (close %v)", resp.StatusCode, resp.Close)
	}
	return ic.c.SetDeadline(time.Time{})
}

// probeAnswer is what one probe beyond the cap got.
type probeAnswer struct {
	status     int
	reason     string // the error body's reason
	retryAfter bool
	secs       float64 // from sending to the answer's headers
	err        error
}

func (p probeAnswer) String() string {
	if p.err != nil {
		return p.err.Error()
	}
	return fmt.Sprintf("%d %s after %.2f s", p.status, p.reason, p.secs)
}

// busy reports whether p is the documented refusal: 503 busy with
// Retry-After.
func (p probeAnswer) busy() bool {
	return p.err == nil && p.status == http.StatusServiceUnavailable && p.reason == reason.Busy.Name() && p.retryAfter
}

// ask sends req and reads the answer's head and, for a refusal, its reason.
// A 2xx body is left to the caller (keep, when it is to be read on, as the
// served probe's is); otherwise it is closed.
func ask(c *http.Client, req *http.Request, keep bool) (probeAnswer, *http.Response) {
	t0 := time.Now()
	resp, err := c.Do(req)
	a := probeAnswer{secs: time.Since(t0).Seconds(), err: err}
	if err != nil {
		return a, nil
	}
	a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After") != ""
	if resp.StatusCode >= 400 {
		var e struct {
			Reason string `json:"reason"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&e)
		a.reason = e.Reason
	}
	if keep && resp.StatusCode/100 == 2 {
		return a, resp
	}
	resp.Body.Close()
	return a, nil
}

func (b *bench) concurrencyOnce(file string, size int64, restart bool, caps concCaps, probeFile string, probeSize int64) (concResult, error) {
	res := concResult{busySecs: nan, servedMS: nan}
	u, err := url.Parse(caps.held[0].url)
	if err != nil {
		return res, fmt.Errorf("the fetch URL does not parse")
	}
	if restart {
		if err := b.vm.restart(); err != nil {
			return res, err
		}
		time.Sleep(time.Second)
	}
	res.rssBase = float64(sumKiB(b.vm.pids(), "VmRSS")) / mib
	// 1. The idle keep-alive connections.
	conns := make([]*idleConn, idleConns)
	defer func() {
		for _, ic := range conns {
			if ic != nil {
				ic.c.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	var openErr atomic.Value
	sem := make(chan struct{}, 32)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.Dial("tcp", u.Host)
			if err != nil {
				openErr.Store(err)
				return
			}
			ic := &idleConn{c: c, br: bufio.NewReaderSize(c, 512)}
			if err := headOn(ic, u.Host, u.Path); err != nil {
				c.Close()
				openErr.Store(err)
				return
			}
			conns[i] = ic
		}()
	}
	wg.Wait()
	if e := openErr.Load(); e != nil {
		return res, fmt.Errorf("opening idle connections: %v", e)
	}
	settle()
	if err := warm(file); err != nil {
		return res, err
	}
	if err := warm(b.fetch.path); err != nil {
		return res, err
	}
	res.rssIdle = float64(sumKiB(b.vm.pids(), "VmRSS")) / mib

	// 2. Tickets first, so that the control plane is quiet while measuring.
	var tks, probes []ticket
	for range concUploads {
		tk, err := b.vm.ticket("bench concurrent")
		if err != nil {
			return res, err
		}
		tks = append(tks, tk)
	}
	for range probeUploads {
		tk, err := b.vm.ticket("bench probe")
		if err != nil {
			return res, err
		}
		probes = append(probes, tk)
	}
	defer func() {
		for _, tk := range probes { // a probe that got in stored an image
			_ = b.vm.remove(tk.UploadID)
		}
	}()

	// 3. The transfers. Each upload is held to last at least minUpload,
	// so that small images are still running when the cap is probed (big
	// ones are slower than that limit anyway: the disk is).
	rate := max(size/int64(minUpload/time.Second), 1<<20)
	m := startMeter(b.vm.pids)
	t0 := time.Now()
	upRes := make([]curlResult, concUploads)
	upErr := make([]error, concUploads)
	var upWG sync.WaitGroup
	for i, tk := range tks {
		upWG.Add(1)
		go func() {
			defer upWG.Done()
			upRes[i], upErr[i] = curlPut(file, tk.UploadURL, "--limit-rate", strconv.FormatInt(rate, 10))
		}()
	}
	// The held GETs, a token each; each can be ended on its own (end[i])
	// to free its slot for a waiting probe, or all at once (stopFetch).
	stopFetch := make(chan struct{})
	end := make([]chan struct{}, concFetches)
	var fetchWG sync.WaitGroup
	var held, refused atomic.Int32
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: concFetches + 2}
	defer tr.CloseIdleConnections()
	fc := &http.Client{Transport: tr}
	for i := range concFetches {
		end[i] = make(chan struct{})
		fetchWG.Add(1)
		go func() {
			defer fetchWG.Done()
			stop := anyOf(stopFetch, end[i])
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := fc.Do(caps.held[i].request(http.MethodGet))
				if err != nil {
					return
				}
				if resp.StatusCode != 200 {
					refused.Add(1)
					resp.Body.Close()
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				held.Add(1)
				if throttledRead(resp.Body, fetchRateEach, stop) {
					resp.Body.Close()
					return
				}
				resp.Body.Close()
			}
		}()
	}

	// 4. Probe the cap once every slot is taken.
	inFlight := func() (up, fe float64) {
		up, _ = b.vm.metric(`vmshelf_transfers_in_flight{direction="upload"}`)
		fe, _ = b.vm.metric(`vmshelf_transfers_in_flight{direction="fetch"}`)
		return up, fe
	}
	full := false
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if up, fe := inFlight(); up == concUploads && fe == concFetches {
			full = true
			break
		}
	}
	res.heap, _ = b.vm.metric("go_memstats_heap_inuse_bytes")
	res.stack, _ = b.vm.metric("go_memstats_stack_inuse_bytes")
	res.gor, _ = b.vm.metric("go_goroutines")
	res.heap /= mib
	res.stack /= mib
	var probeErr error
	if !full {
		probeErr = fmt.Errorf("the %d uploads and %d fetches were never all in flight at once", concUploads, concFetches)
	} else {
		probeErr = b.probeCap(&res, caps, probes, probeFile, probeSize, end, stopFetch, inFlight)
	}

	// 5. Wait for the uploads, then stop the fetches.
	upWG.Wait()
	upSecs := time.Since(t0).Seconds()
	close(stopFetch)
	fetchWG.Wait()
	use := m.end()
	res.rss = float64(use.PeakRSS) / mib
	res.cpu = use.CPU / (float64(concUploads*size) / gib)
	res.mbps = float64(concUploads*size) / upSecs / mb
	res.held, res.inCapRefused = int(held.Load()), int(refused.Load())
	for i := range upRes {
		if upErr[i] == nil && upRes[i].Code == 201 {
			res.ok++
		} else if upRes[i].Code != 0 && upRes[i].Code != 201 {
			res.inCapRefused++
		}
	}
	for _, tk := range tks {
		_ = b.vm.remove(tk.UploadID)
	}

	// 6. Are the idle connections still there?
	var alive atomic.Int32
	for i := range conns {
		if conns[i] == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if headOn(conns[i], u.Host, u.Path) == nil {
				alive.Add(1)
			}
		}()
	}
	wg.Wait()
	res.alive = int(alive.Load())
	if probeErr != nil {
		return res, probeErr
	}
	for i, err := range upErr {
		if err != nil {
			return res, fmt.Errorf("upload %d: %w", i, err)
		}
		if upRes[i].Code != 201 {
			return res, fmt.Errorf("in-cap upload %d answered %d: %.200s", i, upRes[i].Code, upRes[i].Body)
		}
	}
	if res.inCapRefused > 0 {
		return res, fmt.Errorf("%d in-cap transfers were refused", res.inCapRefused)
	}
	return res, nil
}

// probeCap sends the probes beyond the cap while every slot is taken and
// checks each answer against what docs/api.md promises at the cap: an
// upload 503 busy with Retry-After before its body, a fetch 503 busy after
// --fetch-queue-wait, or served once a slot frees (see the table's note).
// end[0] ends the first held GET, to free a slot for the served probe.
func (b *bench) probeCap(res *concResult, caps concCaps, tickets []ticket, file string, size int64,
	end []chan struct{}, stopFetch chan struct{}, inFlight func() (float64, float64)) error {
	var problems []string
	stillFull := func(when string) bool {
		if up, fe := inFlight(); up != concUploads || fe < concFetches {
			problems = append(problems, fmt.Sprintf("%s, %v uploads and %v fetches were in flight, not %d and %d: the probes are inconclusive", when, up, fe, concUploads, concFetches))
			return false
		}
		return true
	}
	pc := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 10 * time.Second, DisableKeepAlives: true}, Timeout: fetchQueueWait + 30*time.Second}

	// Uploads: 503 busy with Retry-After, before the body.
	for _, tk := range tickets {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		req, _ := http.NewRequest(http.MethodPut, tk.UploadURL, f)
		req.ContentLength = size
		req.Header.Set("Expect", "100-continue")
		a, _ := ask(pc, req, false)
		f.Close()
		if a.err != nil { // the error names the ticket's URL: say less
			a.err = errors.New("the request failed")
		}
		if a.busy() {
			res.upBusy++
			res.retry++
		} else {
			problems = append(problems, "an upload probe beyond the cap got "+a.String()+", not 503 busy with Retry-After")
		}
	}

	// Fetches with new tokens: they wait --fetch-queue-wait, then 503 busy
	// with Retry-After. Sent together, so the phase pays the wait once.
	if stillFull("before the fetch probes") {
		answers := make([]probeAnswer, len(caps.busy))
		var wg sync.WaitGroup
		for i, c := range caps.busy {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i], _ = ask(pc, c.request(http.MethodGet), false)
			}()
		}
		wg.Wait()
		var waited []float64
		for _, a := range answers {
			switch {
			case !a.busy():
				problems = append(problems, "a fetch probe beyond the cap got "+a.String()+", not 503 busy with Retry-After after the queue wait")
			case a.secs < fetchQueueWait.Seconds()-0.05:
				problems = append(problems, fmt.Sprintf("a fetch probe got its 503 after %.2f s, before the queue wait of %v", a.secs, fetchQueueWait))
			default:
				res.feBusy++
				res.retry++
			}
			if a.err == nil {
				waited = append(waited, a.secs)
			}
		}
		if len(waited) > 0 {
			slices.Sort(waited)
			res.busySecs = waited[len(waited)/2]
		}
		stillFull("after the fetch probes")
	}

	// A fetch that waits is served as soon as a slot frees: end one held
	// GET while the probe waits.
	if stillFull("before the served probe") {
		type answer struct {
			a     probeAnswer
			resp  *http.Response
			at    time.Time
			freed time.Time
		}
		got := make(chan answer, 1)
		go func() {
			a, resp := ask(&http.Client{Transport: &http.Transport{DisableCompression: true}}, caps.served.request(http.MethodGet), true)
			got <- answer{a: a, resp: resp, at: time.Now()}
		}()
		queued := false
		for end := time.Now().Add(fetchQueueWait / 2); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if q, _ := b.vm.metric("vmshelf_fetches_queued"); q >= 1 {
				queued = true
				break
			}
		}
		freed := time.Now()
		close(end[0])
		ans := <-got
		switch {
		case !queued:
			problems = append(problems, fmt.Sprintf("the served probe never showed in vmshelf_fetches_queued within %v (answered %s)", fetchQueueWait/2, ans.a))
		case ans.a.err != nil || ans.a.status != http.StatusOK:
			problems = append(problems, "a waiting fetch probe got "+ans.a.String()+" after a slot was freed, not 200")
		default:
			res.served = 1
			res.servedMS = ans.at.Sub(freed).Seconds() * 1000
		}
		if ans.resp != nil { // it holds the freed slot until the end, as the GET it replaced
			go func() {
				throttledRead(ans.resp.Body, fetchRateEach, stopFetch)
				ans.resp.Body.Close()
			}()
		}
	}

	// A range read of a token that holds a slot shares it: 206 at once.
	if stillFull("before the shared-slot probe") {
		req := caps.held[1].request(http.MethodGet)
		req.Header.Set("Range", "bytes=0-4095")
		a, _ := ask(pc, req, false)
		if a.err != nil || a.status != http.StatusPartialContent || a.secs > fetchQueueWait.Seconds()/2 {
			problems = append(problems, "a range read with a held GET's token got "+a.String()+", not 206 at once")
		} else {
			res.shared = 1
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("probes beyond the cap: %s", strings.Join(problems, "; "))
	}
	return nil
}

// anyOf is closed once a or b is.
func anyOf(a, b <-chan struct{}) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		select {
		case <-a:
		case <-b:
		}
		close(c)
	}()
	return c
}

// throttledRead reads r at about rate bytes/s until EOF (false) or stop
// (true).
func throttledRead(r io.Reader, rate int, stop <-chan struct{}) bool {
	buf := make([]byte, 256<<10)
	start := time.Now()
	var n int64
	for {
		select {
		case <-stop:
			return true
		default:
		}
		m, err := r.Read(buf)
		n += int64(m)
		if err != nil {
			return false
		}
		if ahead := time.Duration(float64(n)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
			select {
			case <-stop:
				return true
			case <-time.After(ahead):
			}
		}
	}
}
