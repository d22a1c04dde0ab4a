package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

const controlLua = `-- POST with the tenant's bearer token, as a box does
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN")
wrk.headers["Content-Type"] = "application/json"
local want = tonumber(os.getenv("BENCH_WANT"))
local threads = {}
function setup(thread) table.insert(threads, thread) end
bad = 0
response = function(status, headers, body)
  if status ~= want then bad = bad + 1 end
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

const wrkConns = 8

// openLoopConns bounds the connections of the constant-rate client: at
// 500 req/s they carry the load as long as an answer takes under 128 ms,
// and stay far below the server's connection cap (--control-max-conns,
// 512 by default) however slow the answers get.
const openLoopConns = 64

// tickets at a constant rate come from this many boxes in turn, each its
// own tenant (see phaseControl).
const ticketBoxes = 100

func (b *bench) phaseControl() error {
	rate := b.opt.controlQPS
	cTicketRate := fmt.Sprintf("ticket issue, %d req/s constant", rate)
	cStatusRate := fmt.Sprintf("status, %d req/s constant", rate)
	cTicketSat := fmt.Sprintf("ticket issue, saturated (wrk -c%d)", wrkConns)
	cStatusSat := fmt.Sprintf("status, saturated (wrk -c%d)", wrkConns)
	t := b.rep.table("control", "Control plane under load",
		fmt.Sprintf("`POST /market/vm-images/ticket` (`{\"name\":…,\"efi\":false}`, a new ticket each) and `POST /market/vms/status` (`{}`: reads the tenant's images) "+
			"with the dev tenant's bearer token, over loopback keep-alive connections, for %d s each; except the constant-rate tickets, which come from %d boxes in turn, each its own tenant with its own token "+
			"(a tenant's unused tickets count against its quota, so that one tenant asking for thousands is no edge's load: every new ticket would count them all), and the saturated tickets, which come from one more box of their own "+
			"(so that their thousands of unused tickets slow no other row's tenant). A ticket's write is grouped with the writes waiting beside it into one SQLite transaction (group commit). "+
			"*constant*: an open-loop Go client sends at a fixed rate over at most %d keep-alive connections (a request that finds them all busy waits for one); latency is from the "+
			"request's scheduled time to the end of its answer (no coordinated omission), so that wait counts. *saturated*: `wrk -t1 -c%d`, as fast as the server answers. Every answer is checked "+
			"(201 resp. 200). Server CPU: the vmshelf process over the run.", int(b.opt.loadFor.Seconds()), ticketBoxes, openLoopConns, wrkConns),
		Metric{Key: "rps", Label: "req/s", Unit: "req/s", Better: "higher", digits: 0},
		Metric{Key: "p50", Label: "p50 ms", Unit: "ms", Better: "lower", digits: 2},
		Metric{Key: "p99", Label: "p99 ms", Unit: "ms", Better: "lower", digits: 2},
		Metric{Key: "max", Label: "max ms", Unit: "ms", Better: "lower", digits: 1},
		Metric{Key: "bad", Label: "bad answers", digits: 0},
		Metric{Key: "cpureq", Label: "server CPU µs/req", Unit: "µs", Better: "lower", digits: 0},
	)
	script := filepath.Join(b.dir, "control.lua")
	if err := os.WriteFile(script, []byte(controlLua), 0o644); err != nil {
		return err
	}
	// One more box than the constant-rate rotation: the saturated ticket
	// row's own. Its thousands of unused tickets are counted by every
	// quota check and listed by every status of their tenant, so they must
	// belong to no tenant another row measures (the dev tenant's status
	// slowed to tens of requests a second when they were its).
	if err := b.vm.addBoxes(ticketBoxes + 1); err != nil {
		return err
	}
	rotation, flood := b.vm.boxes[:ticketBoxes], b.vm.boxes[ticketBoxes]
	items := []string{cTicketRate, cStatusRate, cTicketSat, cStatusSat}
	for _, s := range items {
		t.row(s, "vmshelf")
	}
	for r := range b.opt.reps {
		for _, s := range rotate(items, r) {
			logf("  control rep %d: %s", r+1, s)
			path, body, want := "/market/vm-images/ticket", `{"name":"bench ticket","efi":false}`, 201
			if s == cStatusRate || s == cStatusSat {
				path, body, want = "/market/vms/status", `{}`, 200
			}
			settle()
			pr := b.startPerf("control", b.vm.pids())
			m := startMeter(b.vm.pids)
			var lr loadResult
			var err error
			if s == cTicketRate || s == cStatusRate {
				tokens := []string{b.vm.token}
				if s == cTicketRate {
					tokens = rotation
				}
				lr, err = b.openLoop(rate, b.opt.loadFor, path, body, want, tokens)
			} else {
				token := b.vm.token
				if s == cTicketSat {
					token = flood
				}
				var w wrkResult
				w, err = runWrk(script, []string{"BENCH_BODY=" + body, "BENCH_TOKEN=" + token, fmt.Sprintf("BENCH_WANT=%d", want)},
					1, wrkConns, b.opt.loadFor, "http://"+b.vm.ctlAddr+path)
				lr = loadResult{rps: w.rps(), p50: w.P50US / 1000, p99: w.P99US / 1000, max: w.MaxUS / 1000,
					bad: int(w.Bad + w.SocketErrors), n: int(w.Requests)}
			}
			use := m.end()
			pr.stop()
			if err != nil {
				b.fail("control %s rep %d: %v", s, r+1, err)
				lr = loadResult{rps: nan, p50: nan, p99: nan, max: nan, bad: -1, n: 1}
				use.CPU = nan
			}
			logf("    → %.0f req/s, p50 %.2f ms, p99 %.2f ms, %d bad", lr.rps, lr.p50, lr.p99, lr.bad)
			if lr.bad > 0 {
				b.fail("control %s rep %d: %d of %d answers were not %d (first: %v); their latency is in the percentiles", s, r+1, lr.bad, lr.n, want, lr.firstErr)
			}
			t.add(s, "vmshelf", "rps", lr.rps)
			t.add(s, "vmshelf", "p50", lr.p50)
			t.add(s, "vmshelf", "p99", lr.p99)
			t.add(s, "vmshelf", "max", lr.max)
			t.add(s, "vmshelf", "bad", float64(lr.bad))
			t.add(s, "vmshelf", "cpureq", use.CPU/float64(lr.n)*1e6)
		}
	}
	return nil
}

type loadResult struct {
	rps, p50, p99, max float64
	bad, n             int
	firstErr           error
}

// openLoop sends rate requests per second for d, each at its scheduled
// time whatever the answers before it do, and measures each from its
// scheduled time.
// Request i carries tokens[i % len(tokens)].
func (b *bench) openLoop(rate int, d time.Duration, path, body string, want int, tokens []string) (loadResult, error) {
	// A bounded pool of keep-alive connections, as a client library keeps
	// one (and well below serve's --control-max-conns, 512): beyond the
	// cap the server closes the idle connection that waited longest for a
	// new one, and a POST sent on it just then fails; an unbounded pool
	// opened a connection per request in flight whenever the server fell
	// behind, passed the cap and measured its own resets. A request that
	// finds every connection busy waits in the pool, and that wait is in
	// its latency, which counts from the scheduled time.
	tr := &http.Transport{MaxConnsPerHost: openLoopConns, MaxIdleConnsPerHost: openLoopConns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := "http://" + b.vm.ctlAddr + path
	do := func(i int) error {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokens[i%len(tokens)])
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// Warm the connection pool a little, untimed.
	for i := range 8 {
		_ = do(i)
	}
	n := int(d.Seconds() * float64(rate))
	lat := make([]float64, n)
	var bad int
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now().Add(10 * time.Millisecond)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := do(i)
			lat[i] = time.Since(at).Seconds() * 1000
			if err != nil {
				mu.Lock()
				bad++
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := time.Since(start).Seconds()
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(int(p*float64(n)), n-1)] }
	lr := loadResult{rps: float64(n) / total, p50: pct(0.50), p99: pct(0.99), max: lat[n-1], bad: bad, n: n, firstErr: firstErr}
	if bad == n {
		return lr, fmt.Errorf("all %d requests failed, first: %v", n, firstErr)
	}
	return lr, nil
}
