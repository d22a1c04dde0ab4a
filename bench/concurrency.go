package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	idleConns     = 1000
	concUploads   = 4
	concFetches   = 4
	probeUploads  = 4
	probeFetches  = 4
	fetchRateEach = 16 << 20 // bytes/s per held fetch: they must last as long as the uploads
	minUpload     = 10 * time.Second
)

func (b *bench) phaseConcurrency() error {
	if b.fetch.id == "" {
		return fmt.Errorf("no fetch image")
	}
	t := b.rep.table("concurrency", "Concurrency: 4 uploads + 4 fetches + 1 000 idle keep-alive connections",
		fmt.Sprintf("vmshelf with --max-transfers %d. First %d keep-alive connections each make one HEAD of the fetch URL and then stay idle; then %d `curl -T` uploads "+
			"(each its own ticket, held by `--limit-rate` to last at least 10 s, which only slows images under a few GiB) and %d GETs of the stored %d MiB image run at once (each GET read at %d MiB/s so that it holds its slot as long as the uploads run). "+
			"Once /metrics shows %d uploads and %d fetches in flight, %d more uploads (Go client, Expect: 100-continue) and %d more GETs probe the cap. "+
			"Peak RSS of the vmshelf process from the transfers' start to their end (VmHWM reset at the start, and VmRSS sampled every 50 ms). "+
			"Each run starts a fresh vmshelf process (same data directory), so that runs do not inherit each other's heap, except the *no restart* row, which runs in the process "+
			"as the run before it (or the phase before) left it: what a long-running server sees. *RSS at start* is VmRSS then, *RSS with idle conns* "+
			"with the idle connections open, before the transfers; Go heap in use, stacks and goroutines are read from /metrics while all 8 transfers run. At the end every idle connection makes another HEAD: *alive* counts the ones that still answer. "+
			"Run at two image sizes to show that memory does not grow with the image.",
			maxTransfers, idleConns, concUploads, concFetches, b.size>>20, fetchRateEach>>20, concUploads, concFetches, probeUploads, probeFetches),
		Metric{Key: "rss", Label: "peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		Metric{Key: "rss_base", Label: "RSS at start MiB", Unit: "MiB", digits: 1},
		Metric{Key: "rss_idle", Label: "RSS with idle conns MiB", Unit: "MiB", Better: "lower", digits: 1},
		Metric{Key: "heap", Label: "Go heap in use MiB", Unit: "MiB", digits: 1},
		Metric{Key: "stack", Label: "Go stacks MiB", Unit: "MiB", digits: 1},
		Metric{Key: "gor", Label: "goroutines", digits: 0},
		Metric{Key: "up_mbps", Label: "uploads, aggregate MB/s", Unit: "MB/s", Better: "higher", digits: 0},
		Metric{Key: "ok", Label: "uploads 201", digits: 0},
		Metric{Key: "held", Label: "fetches held (200)", digits: 0},
		Metric{Key: "p503", Label: fmt.Sprintf("probe 503s (of %d)", probeUploads+probeFetches), digits: 0},
		Metric{Key: "retry", Label: "503s with Retry-After", digits: 0},
		Metric{Key: "in_cap_refused", Label: "in-cap transfers refused", Better: "lower", digits: 0},
		Metric{Key: "alive", Label: fmt.Sprintf("idle conns alive (of %d)", idleConns), digits: 0},
		Metric{Key: "cpu", Label: "server CPU s per GiB uploaded (fetches' CPU included)", Unit: "s/GiB", Better: "lower", digits: 2},
	)
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
	for r := range b.opt.reps {
		for _, v := range rotate(vs, r) {
			logf("  concurrency rep %d: %s", r+1, v.label)
			c, err := b.concurrencyOnce(v.file, v.size, v.restart)
			if err != nil {
				b.fail("concurrency %s rep %d: %v", v.label, r+1, err)
			}
			if c.rss == 0 { // nothing was measured
				c = concResult{rss: nan, rssIdle: nan, rssBase: nan, heap: nan, stack: nan, gor: nan, mbps: nan, cpu: nan}
			}
			logf("    → peak RSS %.1f MiB (idle %.1f), %d×201, %d/%d probe 503, %d alive", c.rss, c.rssIdle, c.ok, c.p503, probeUploads+probeFetches, c.alive)
			t.add(v.label, "vmshelf", "rss", c.rss)
			t.add(v.label, "vmshelf", "rss_base", c.rssBase)
			t.add(v.label, "vmshelf", "rss_idle", c.rssIdle)
			t.add(v.label, "vmshelf", "heap", c.heap)
			t.add(v.label, "vmshelf", "stack", c.stack)
			t.add(v.label, "vmshelf", "gor", c.gor)
			t.add(v.label, "vmshelf", "up_mbps", c.mbps)
			t.add(v.label, "vmshelf", "ok", float64(c.ok))
			t.add(v.label, "vmshelf", "held", float64(c.held))
			t.add(v.label, "vmshelf", "p503", float64(c.p503))
			t.add(v.label, "vmshelf", "retry", float64(c.retry))
			t.add(v.label, "vmshelf", "in_cap_refused", float64(c.inCapRefused))
			t.add(v.label, "vmshelf", "alive", float64(c.alive))
			t.add(v.label, "vmshelf", "cpu", c.cpu)
		}
	}
	return nil
}

type concResult struct {
	rss, rssIdle, rssBase       float64
	heap, stack, gor, mbps, cpu float64
	ok, held, p503, retry       int
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

func (b *bench) concurrencyOnce(file string, size int64, restart bool) (concResult, error) {
	var res concResult
	u, err := url.Parse(b.fetch.vm.url)
	if err != nil {
		return res, err
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
	stopFetch := make(chan struct{})
	var fetchWG sync.WaitGroup
	var held, refused atomic.Int32
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: concFetches}
	defer tr.CloseIdleConnections()
	fc := &http.Client{Transport: tr}
	for range concFetches {
		fetchWG.Add(1)
		go func() {
			defer fetchWG.Done()
			for {
				select {
				case <-stopFetch:
					return
				default:
				}
				resp, err := fc.Do(b.fetch.vm.request(http.MethodGet))
				if err != nil {
					return
				}
				if resp.StatusCode != 200 {
					refused.Add(1)
					resp.Body.Close()
					time.Sleep(100 * time.Millisecond)
					continue
				}
				held.Add(1)
				if throttledRead(resp.Body, fetchRateEach, stopFetch) {
					resp.Body.Close()
					return
				}
				resp.Body.Close()
			}
		}()
	}

	// 4. Probe the cap once every slot is taken.
	full := false
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		up, _ := b.vm.metric(`vmshelf_transfers_in_flight{direction="upload"}`)
		fe, _ := b.vm.metric(`vmshelf_transfers_in_flight{direction="fetch"}`)
		if up == concUploads && fe == concFetches {
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
		pc := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 10 * time.Second, DisableKeepAlives: true}, Timeout: time.Minute}
		var statuses []int
		count := func(resp *http.Response, err error) {
			if err != nil {
				probeErr = err
				return
			}
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
			if resp.StatusCode == http.StatusServiceUnavailable {
				res.p503++
				if resp.Header.Get("Retry-After") != "" {
					res.retry++
				}
			}
		}
		defer func() {
			for _, tk := range probes { // a probe that got in stored an image
				_ = b.vm.remove(tk.UploadID)
			}
		}()
		for _, tk := range probes {
			f, err := os.Open(file)
			if err != nil {
				return res, err
			}
			req, _ := http.NewRequest(http.MethodPut, tk.UploadURL, f)
			req.ContentLength = size
			req.Header.Set("Expect", "100-continue")
			count(pc.Do(req))
			f.Close()
		}
		for range probeFetches {
			count(pc.Do(b.fetch.vm.request(http.MethodGet)))
		}
		if probeErr == nil && res.p503 != probeUploads+probeFetches {
			probeErr = fmt.Errorf("probes beyond the cap were answered %v, not all 503", statuses)
		}
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
	}
	return res, nil
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
