package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPrometheusScrapesRealTransfers starts Debian's prometheus on loopback,
// lets it scrape the control plane, performs an upload, two fetches and a
// refusal, and asks Prometheus's HTTP API until the vmshelf_ series show
// exactly those counts. It also runs `promtool check metrics` on the
// exposition.
func TestPrometheusScrapesRealTransfers(t *testing.T) {
	needTool(t, "prometheus")
	needTool(t, "promtool")
	needTool(t, "curl")
	needTool(t, "qemu-img")
	needTool(t, "qemu-io")
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "data"), nil)

	// promtool's lint of names, units and help texts.
	resp, err := httpClient.Get(s.ctlBase + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	lintCtx, lintCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lintCancel()
	lint := exec.CommandContext(lintCtx, "promtool", "check", "metrics")
	lint.Stdin = resp.Body
	lint.WaitDelay = 5 * time.Second
	out, err := lint.CombinedOutput()
	resp.Body.Close()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}

	promAddr := freeAddr(t)
	cfg := filepath.Join(work, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: vmshelf
    static_configs:
      - targets: ['%s']
`, s.ctlAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prom := exec.CommandContext(ctx, "prometheus", "--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(work, "tsdb"), "--web.listen-address="+promAddr)
	var promLog syncBuffer
	prom.Stdout, prom.Stderr = &promLog, &promLog
	prom.WaitDelay = 5 * time.Second // Wait after Kill is bounded
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { prom.Process.Kill(); prom.Wait() }()
	api := "http://" + promAddr
	poll(t, 400, 50*time.Millisecond, "prometheus ready", func() bool {
		r, err := httpClient.Get(api + "/-/ready")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})

	// The traffic: one stored image, fetched twice, and one refusal.
	disk, diskBytes := makeImage(t, work, "disk.qcow2")
	img := s.upload(t, s.ticket(t, "scraped"), disk, diskBytes)
	fetch := s.fetchURL(t, img.UploadID)
	for i := 0; i < 2; i++ {
		if code, _ := curl(t, fetch); code != 200 {
			t.Fatalf("fetch: %d", code)
		}
	}
	junk := filepath.Join(work, "junk")
	b := make([]byte, 64<<10)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[0] = 0 // never the QCOW2 magic
	if err := os.WriteFile(junk, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _ := curl(t, "-T", junk, s.ticket(t, "junk").UploadURL); code != 415 {
		t.Fatalf("junk upload: %d, want 415", code)
	}

	want := map[string]float64{
		`vmshelf_transfers_total{direction="upload",outcome="ok"}`:                1,
		`vmshelf_transfers_total{direction="fetch",outcome="ok"}`:                 2,
		`vmshelf_transfer_rejections_total{direction="upload",reason="notQcow2"}`: 1,
		`vmshelf_tickets_issued_total`:                                            2,
		`vmshelf_tickets_consumed_total`:                                          2,
		`vmshelf_images_stored`:                                                   1,
		`vmshelf_images_stored_bytes`:                                             float64(len(diskBytes)),
		`vmshelf_transfer_bytes_total{direction="fetch"}`:                         float64(2 * len(diskBytes)),
		`vmshelf_transfers_in_flight{direction="upload"}`:                         0,
		`sum(vmshelf_transfer_duration_seconds_count{direction="fetch"})`:         2,
	}
	got := map[string]float64{}
	poll(t, 300, 100*time.Millisecond, "prometheus to show the counts", func() bool {
		for q, w := range want {
			v, ok := promQuery(t, api, q)
			got[q] = v
			if !ok || v != w {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("last values %v, want %v\nprometheus log:\n%s", got, want, promLog.String())
	})

	// Every query of the shipped Grafana dashboard is valid PromQL and
	// finds series, and the shipped alert rules pass promtool.
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	raw, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			// rate() needs two scrapes in its window: poll, bounded.
			q := strings.ReplaceAll(tg.Expr, "$__rate_interval", "1m")
			poll(t, 100, 100*time.Millisecond, fmt.Sprintf("dashboard panel %q: %s to find series", p.Title, q),
				func() bool { return promSeries(t, api, q) > 0 })
		}
	}
	if r := runCmd(t, nil, "promtool", "check", "rules", "../../docs/alerts.yml"); r.code != 0 {
		t.Errorf("promtool check rules docs/alerts.yml: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// promSeries runs an instant query and returns how many series it found;
// a query Prometheus refuses fails the test.
func promSeries(t *testing.T, api, q string) int {
	t.Helper()
	r, err := httpClient.Get(api + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Status != "success" {
		t.Fatalf("query %s: %v %s", q, err, body.Error)
	}
	return len(body.Data.Result)
}

// promQuery asks Prometheus for the single value of an instant query.
func promQuery(t *testing.T, api, q string) (float64, bool) {
	t.Helper()
	r, err := httpClient.Get(api + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, false
	}
	defer r.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.StatusCode != http.StatusOK || len(body.Data.Result) != 1 {
		return 0, false
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return v, err == nil
}

// poll checks cond up to n times, d apart; the bounded wait for a state
// that has no event to wait on (Prometheus's next scrape).
func poll(t *testing.T, n int, d time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if cond() {
			return
		}
		time.Sleep(d)
	}
	msg := ""
	for _, f := range detail {
		msg += f()
	}
	t.Fatalf("waited %v for %s; %s", time.Duration(n)*d, what, msg)
}
