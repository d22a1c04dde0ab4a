package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	fDD      = "dd → /dev/null"
	fVmshelf = "vmshelf GET"
	fNginx   = "nginx GET"
)

func (b *bench) phaseFetch() error {
	if b.fetch.id == "" {
		return fmt.Errorf("no fetch image")
	}
	for _, cold := range []bool{true, false} {
		state, how := "warm", "the file read through before each run (in the page cache)"
		if cold {
			state, how = "cold", "`sync; echo 3 > /proc/sys/vm/drop_caches` before each run (from the disk)"
		}
		t := b.rep.table("fetch_"+state, fmt.Sprintf("Whole-file fetch of the %d MiB image, %s cache", b.size>>20, state),
			"One GET of the whole image with `curl -o /dev/null`; vmshelf and nginx serve the very same file (vmshelf's stored image; nginx aliases its directory), "+how+". "+
				"dd reads the same file with bs=1M: the limit of the storage (cold) or the page cache (warm).",
			Metric{Key: "mbps", Label: "MB/s", Unit: "MB/s", Better: "higher", digits: 0},
			Metric{Key: "cpu", Label: "server CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 3},
			Metric{Key: "mcpu", Label: "machine CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 2},
			Metric{Key: "rss", Label: "server peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		)
		roles := map[string]string{fDD: "limit", fVmshelf: "vmshelf", fNginx: "peer"}
		subjects := []string{fDD, fVmshelf, fNginx}
		for _, s := range subjects {
			t.row(s, roles[s])
		}
		for r := range b.opt.reps {
			for _, s := range rotate(subjects, r) {
				logf("  fetch %s rep %d: %s", state, r+1, s)
				secs, use, err := b.fetchOnce(s, cold)
				if err != nil {
					b.fail("fetch %s %s rep %d: %v", state, s, r+1, err)
					secs, use = nan, usage{CPU: nan, MachineCPU: nan, PeakRSS: -1}
				}
				sz := float64(b.size)
				t.add(s, roles[s], "mbps", sz/secs/mb)
				t.add(s, roles[s], "cpu", use.CPU/(sz/gib))
				t.add(s, roles[s], "mcpu", use.MachineCPU/(sz/gib))
				rss := float64(use.PeakRSS) / mib
				if use.PeakRSS < 0 {
					rss = nan
				}
				t.add(s, roles[s], "rss", rss)
			}
		}
		t.ratio("mbps", fVmshelf, fNginx, "mbps")
		t.ratio("mbps", fVmshelf, fDD, "mbps")
		t.ratio("cpu", fVmshelf, fNginx, "cpu")
		t.ratio("rss", fVmshelf, fNginx, "rss")
	}
	return nil
}

func (b *bench) fetchOnce(subject string, cold bool) (float64, usage, error) {
	if cold {
		if err := dropCaches(); err != nil {
			return 0, usage{}, err
		}
	} else {
		syscall.Sync()
		if err := warm(b.fetch.path); err != nil {
			return 0, usage{}, err
		}
	}
	time.Sleep(200 * time.Millisecond)
	switch subject {
	case fDD:
		mc0 := machineCPU()
		wall, cpu, rss, err := runTimed("dd", "if="+b.fetch.path, "of=/dev/null", "bs=1M", "status=none")
		return wall, usage{Wall: wall, CPU: cpu, MachineCPU: machineCPU() - mc0, PeakRSS: rss}, err
	case fVmshelf, fNginx:
		url, pids := b.fetch.vm.byID, b.vm.pids
		if subject == fNginx && b.ngx == nil {
			return 0, usage{}, fmt.Errorf("nginx not running")
		}
		if subject == fNginx {
			url, pids = b.fetch.ngxURL, b.ngx.pids
		}
		var pr *perfRec
		if !cold {
			pr = b.startPerf("fetch-warm-"+subject, pids())
		}
		m := startMeter(pids)
		// The same request to both: nginx ignores the header.
		res, err := curlGet(url, []string{b.fetch.vm.auth()})
		use := m.end()
		pr.stop()
		if err != nil {
			return 0, use, err
		}
		if res.Code != 200 || res.Download != b.size {
			return 0, use, fmt.Errorf("answered %d with %d bytes", res.Code, res.Download)
		}
		return res.Total, use, nil
	}
	return 0, usage{}, fmt.Errorf("unknown subject %q", subject)
}

// ---- random range reads ----

const rangeLua = `-- random aligned ranges of an image, as qemu's curl driver / nbdkit-curl read
local size = tonumber(os.getenv("BENCH_SIZE"))
local block = tonumber(os.getenv("BENCH_BLOCK"))
local auth = os.getenv("BENCH_AUTH")
local blocks = math.floor(size / block)
local counter = 0
local threads = {}
function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
  table.insert(threads, thread)
end
function init(args)
  math.randomseed(seed * 7919 + 17)
end
request = function()
  local off = math.random(0, blocks - 1) * block
  return wrk.format("GET", nil, {["Range"] = "bytes=" .. off .. "-" .. (off + block - 1), ["Authorization"] = auth})
end
bad = 0
response = function(status, headers, body)
  if status ~= 206 or #body ~= block then bad = bad + 1 end
end
function done(summary, latency, requests)
  local bad_total = 0
  for _, t in ipairs(threads) do bad_total = bad_total + (t:get("bad") or 0) end
  io.write(string.format("WRKJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"status_errors\":%d,\"socket_errors\":%d,\"p50_us\":%d,\"p99_us\":%d,\"max_us\":%d,\"bad\":%d}\n",
    summary.requests, summary.duration, summary.bytes, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max, bad_total))
end
`

// fixedLua is the cheapest client wrk has: one fixed range of a path
// from the environment (never the command line: vmshelf's path carries
// its token), a static request built once (no request()) and no
// response() (wrk parses no body per answer). done() reports as rangeLua's
// does; a body that is not the range is seen in bytes per request.
const fixedLua = `-- one fixed range, static request: the cheapest client wrk has: "wrk -t1 -c8, token in the path"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["Range"] = "bytes=0-" .. (tonumber(os.getenv("BENCH_BLOCK")) - 1)
function done(summary, latency, requests)
  io.write(string.format("WRKJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"status_errors\":%d,\"socket_errors\":%d,\"p50_us\":%d,\"p99_us\":%d,\"max_us\":%d,\"bad\":0}\n",
    summary.requests, summary.duration, summary.bytes, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
`

// wrkResult is the WRKJSON line of the scripts' done().
type wrkResult struct {
	Requests     int64   `json:"requests"`
	DurationUS   int64   `json:"duration_us"`
	Bytes        int64   `json:"bytes"`
	StatusErrors int64   `json:"status_errors"`
	SocketErrors int64   `json:"socket_errors"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	MaxUS        float64 `json:"max_us"`
	// Bad counts every answer the script's response() found wrong, the
	// ones wrk also counts in StatusErrors (status >= 400) included: a
	// count of bad answers is Bad + SocketErrors, never + StatusErrors.
	Bad int64 `json:"bad"`
}

func (w wrkResult) rps() float64 { return float64(w.Requests) / (float64(w.DurationUS) / 1e6) }

// runWrk runs wrk with threads event loops over conns keep-alive
// connections for d. The script reads what it needs (a token too) from
// env, not from its command line.
func runWrk(script string, env []string, threads, conns int, d time.Duration, url string) (wrkResult, error) {
	cmd := exec.Command("wrk", fmt.Sprintf("-t%d", threads), fmt.Sprintf("-c%d", conns), fmt.Sprintf("-d%ds", int(d.Seconds())),
		"--timeout", "10s", "-s", script, url)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(l, "WRKJSON "); ok {
			var r wrkResult
			if err := json.Unmarshal([]byte(j), &r); err != nil {
				return r, fmt.Errorf("wrk output %q: %v", j, err)
			}
			return r, nil
		}
	}
	return wrkResult{}, fmt.Errorf("wrk printed no result: %s", out)
}

const (
	// rangeConns keep-alive connections read ranges at once: what an
	// importer with several readers (qemu's curl driver keeps up to 8
	// requests in flight) puts on one image.
	rangeConns = 8
	// rangeThreads: wrk runs one event loop per thread, and one loop (Lua
	// builds every request) saturates a core near nginx's rate on this
	// machine: with -t1 the bench would measure wrk. Two loops, one per
	// core of the 2-core box, 4 connections each; the server shares the
	// cores with them, as it does with any local client.
	rangeThreads = 2
)

// rangeSizes are the range reads measured: 4 KiB (qemu-img info, nbdkit
// reading metadata) and 64 KiB (a QCOW2 cluster, the unit of the image's
// data).
var rangeSizes = []int64{4 << 10, 64 << 10}

// wrkRun runs one wrk load against url while metering pids (and, for
// vmshelf, recording perfName's profile): the common part of every
// range measurement. A failed run answers a result no figure is taken
// from (CPU NaN).
func (b *bench) wrkRun(perfName string, pids func() []int, script string, env []string, threads int, url string) (wrkResult, usage, error) {
	settle()
	var pr *perfRec
	if perfName != "" {
		pr = b.startPerf(perfName, pids())
	}
	m := startMeter(pids)
	w, err := runWrk(script, env, threads, rangeConns, b.opt.loadFor, url)
	use := m.end()
	pr.stop()
	if err != nil {
		w = wrkResult{DurationUS: 1}
		use.CPU = nan
	}
	return w, use, err
}

// rangeTableID is the table of the range reads of block bytes.
func rangeTableID(block int64) string { return fmt.Sprintf("range_%dk", block>>10) }

// The fixed-range setup: one wrk thread (its static request leaves the
// client cheap enough for one core), 8 connections, one 4 KiB range, the
// token in the path. It is the other client the issue measured with: a
// client-bound run cannot hide server cost in either, since both report
// server CPU per request beside req/s.
const (
	fixedTableID = "range_4k_fixed"
	fixedThreads = 1
	fixedBlock   = 4 << 10
)

func (b *bench) phaseRange() error {
	if b.fetch.id == "" {
		return fmt.Errorf("no fetch image")
	}
	script := filepath.Join(b.dir, "range.lua")
	if err := os.WriteFile(script, []byte(rangeLua), 0o644); err != nil {
		return err
	}
	subjects := []string{fVmshelf, fNginx}
	roles := map[string]string{fVmshelf: "vmshelf", fNginx: "peer"}
	tables := map[int64]*Table{}
	for _, block := range rangeSizes {
		kib := block >> 10
		t := b.rep.table(rangeTableID(block), fmt.Sprintf("%d KiB random range reads, %d connections", kib, rangeConns),
			fmt.Sprintf("`wrk -t%d -c%d -d%ds` (%d keep-alive connections, %d per wrk thread, one thread per core), each request `Range: bytes=<%d KiB-aligned random offset>+%d` of the %d MiB image "+
				"(what qemu's curl driver and nbdkit-curl send), file in the page cache; vmshelf by the Authorization-header form of its fetch URL, nginx the same file by path, with the same header. "+
				"Every answer is checked to be a 206 with %d bytes. CPU: server CPU over the run; payload GiB = requests × %d KiB.",
				rangeThreads, rangeConns, int(b.opt.loadFor.Seconds()), rangeConns, rangeConns/rangeThreads, kib, block-1, b.size>>20, block, kib),
			Metric{Key: "rps", Label: "req/s", Unit: "req/s", Better: "higher", digits: 0},
			Metric{Key: "mbps", Label: "payload MB/s", Unit: "MB/s", Better: "higher", digits: 1},
			Metric{Key: "p50", Label: "p50 ms", Unit: "ms", Better: "lower", digits: 3},
			Metric{Key: "p99", Label: "p99 ms", Unit: "ms", Better: "lower", digits: 3},
			Metric{Key: "cpureq", Label: "server CPU µs/req", Unit: "µs", Better: "lower", digits: 1},
			Metric{Key: "cpu", Label: "server CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 1},
			Metric{Key: "bad", Label: "bad answers", Unit: "", digits: 0},
			Metric{Key: "rss", Label: "server peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		)
		for _, s := range subjects {
			t.row(s, roles[s])
		}
		tables[block] = t
	}
	if err := warm(b.fetch.path); err != nil {
		return err
	}
	for r := range b.opt.reps {
		for _, block := range rangeSizes {
			t := tables[block]
			for _, s := range rotate(subjects, r) {
				logf("  range %d KiB rep %d: %s", block>>10, r+1, s)
				url, pids := b.fetch.vm.byID, b.vm.pids
				if s == fNginx {
					if b.ngx == nil {
						b.fail("range nginx: not running")
						continue
					}
					url, pids = b.fetch.ngxURL, b.ngx.pids
				}
				perfName := ""
				if s == fVmshelf {
					perfName = fmt.Sprintf("range-%dk", block>>10)
				}
				env := []string{fmt.Sprintf("BENCH_SIZE=%d", b.size), fmt.Sprintf("BENCH_BLOCK=%d", block), "BENCH_AUTH=Bearer " + b.fetch.vm.token}
				w, use, err := b.wrkRun(perfName, pids, script, env, rangeThreads, url)
				if err != nil {
					b.fail("range %d KiB %s rep %d: %v", block>>10, s, r+1, err)
				}
				if bad := w.Bad + w.SocketErrors; bad > 0 {
					b.fail("range %d KiB %s rep %d: %d of %d answers were not a 206 of %d bytes (or the connection failed)", block>>10, s, r+1, bad, w.Requests, block)
				}
				rps := w.rps()
				logf("    → %.0f req/s, p99 %.2f ms, %.1f µs CPU/req", rps, w.P99US/1000, use.CPU/float64(w.Requests)*1e6)
				t.add(s, roles[s], "rps", rps)
				t.add(s, roles[s], "mbps", rps*float64(block)/mb)
				t.add(s, roles[s], "p50", w.P50US/1000)
				t.add(s, roles[s], "p99", w.P99US/1000)
				t.add(s, roles[s], "cpureq", use.CPU/float64(w.Requests)*1e6)
				t.add(s, roles[s], "cpu", use.CPU/(float64(w.Requests)*float64(block)/gib))
				t.add(s, roles[s], "bad", float64(w.Bad+w.SocketErrors))
				t.add(s, roles[s], "rss", float64(use.PeakRSS)/mib)
			}
		}
	}
	fixed, err := b.rangeFixed(subjects, roles)
	if err != nil {
		return err
	}
	all := []*Table{fixed}
	for _, t := range tables {
		all = append(all, t)
	}
	for _, t := range all {
		t.ratio("rps", fVmshelf, fNginx, "rps")
		t.ratio("p99", fVmshelf, fNginx, "p99")
		t.ratio("cpureq", fVmshelf, fNginx, "cpureq")
	}
	return nil
}

// rangeFixed measures the fixed-range setup (fixedLua) for each subject.
func (b *bench) rangeFixed(subjects []string, roles map[string]string) (*Table, error) {
	script := filepath.Join(b.dir, "fixed.lua")
	if err := os.WriteFile(script, []byte(fixedLua), 0o644); err != nil {
		return nil, err
	}
	t := b.rep.table(fixedTableID, fmt.Sprintf("4 KiB fixed range, %d connections, one wrk thread, token in the path", rangeConns),
		fmt.Sprintf("`wrk -t%d -c%d -d%ds` with a static request (built once, no Lua per request or answer): `Range: bytes=0-%d` of the image; vmshelf by its path-token fetch URL "+
			"(`…/fetch/<token>`, the path given to wrk in the environment), nginx the same file by path. The cheaper client leaves more of the 2 cores to the server than the random-range setup above. "+
			"Checked: no status ≥ 400 and %d–%d bytes per answer (a whole file instead of the range would show). CPU: server CPU over the run.",
			fixedThreads, rangeConns, int(b.opt.loadFor.Seconds()), fixedBlock-1, fixedBlock, fixedBlock+1024),
		Metric{Key: "rps", Label: "req/s", Unit: "req/s", Better: "higher", digits: 0},
		Metric{Key: "p50", Label: "p50 ms", Unit: "ms", Better: "lower", digits: 3},
		Metric{Key: "p99", Label: "p99 ms", Unit: "ms", Better: "lower", digits: 3},
		Metric{Key: "cpureq", Label: "server CPU µs/req", Unit: "µs", Better: "lower", digits: 1},
		Metric{Key: "bad", Label: "bad answers", Unit: "", digits: 0},
	)
	for _, s := range subjects {
		t.row(s, roles[s])
	}
	for r := range b.opt.reps {
		for _, s := range rotate(subjects, r) {
			logf("  range 4 KiB fixed rep %d: %s", r+1, s)
			full, pids := b.fetch.vm.url, b.vm.pids
			if s == fNginx {
				if b.ngx == nil {
					b.fail("range fixed nginx: not running")
					continue
				}
				full, pids = b.fetch.ngxURL, b.ngx.pids
			}
			u, err := url.Parse(full)
			if err != nil {
				b.fail("range fixed %s: the fetch URL does not parse", s)
				continue
			}
			perfName := ""
			if s == fVmshelf {
				perfName = "range-4k-fixed"
			}
			env := []string{"BENCH_PATH=" + u.EscapedPath(), fmt.Sprintf("BENCH_BLOCK=%d", fixedBlock)}
			w, use, err := b.wrkRun(perfName, pids, script, env, fixedThreads, u.Scheme+"://"+u.Host+"/")
			if err != nil {
				b.fail("range fixed %s rep %d: %v", s, r+1, err)
			}
			bad := w.StatusErrors + w.SocketErrors
			if per := float64(w.Bytes) / float64(max(w.Requests, 1)); per < fixedBlock || per > fixedBlock+1024 {
				bad = w.Requests
			}
			if bad > 0 {
				b.fail("range fixed %s rep %d: %d of %d answers were not the %d-byte range (%d bytes in all)", s, r+1, bad, w.Requests, fixedBlock, w.Bytes)
			}
			rps := w.rps()
			logf("    → %.0f req/s, p99 %.2f ms, %.1f µs CPU/req", rps, w.P99US/1000, use.CPU/float64(w.Requests)*1e6)
			t.add(s, roles[s], "rps", rps)
			t.add(s, roles[s], "p50", w.P50US/1000)
			t.add(s, roles[s], "p99", w.P99US/1000)
			t.add(s, roles[s], "cpureq", use.CPU/float64(w.Requests)*1e6)
			t.add(s, roles[s], "bad", float64(bad))
		}
	}
	return t, nil
}
