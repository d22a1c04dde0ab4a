package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a server process the bench started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	// tree: the server's processes are the started one and its children
	// (nginx: master and workers).
	tree bool
}

func startProc(name, logPath string, tree bool, argv ...string) (*proc, error) {
	return startProcEnv(nil, name, logPath, tree, argv...)
}

// startProcEnv is startProc with env added to the bench's environment.
func startProcEnv(env []string, name, logPath string, tree bool, argv ...string) (*proc, error) {
	// Appended, not truncated: a restart (s3ConcurrentRSS, the
	// concurrency phase) must not erase the log of the run that failed.
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(cleanEnv(), env...)
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	lf.Close()
	return &proc{name: name, cmd: cmd, log: logPath, tree: tree}, nil
}

// cleanEnv drops VMSHELF_* so that only the bench's flags configure the
// server.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VMSHELF_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) pids() []int {
	if p.tree {
		return descendants(p.pid())
	}
	return []int{p.pid()}
}

// stop ends the process with SIGTERM (SIGQUIT for nginx's graceful stop is
// not needed), then SIGKILL after a bound. Only the process group the bench
// started is signalled.
func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-done
	}
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// waitHTTP waits until url answers with any HTTP status.
func waitHTTP(url string, p *proc, within time.Duration) error {
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		if p.cmd.ProcessState != nil {
			break
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer at %s within %v; log:\n%s", p.name, url, within, p.logTail())
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ---- vmshelf ----

type vmshelf struct {
	*proc
	bin      string
	dataDir  string
	dataAddr string
	ctlAddr  string
	token    string
	args     []string
	env      []string // added to the environment of serve and the CLI
	boxes    []string // tokens of the box tenants made by addBoxes
}

func startVmshelf(bin, dir string, uploadMaxGiB int) (*vmshelf, error) {
	return startVmshelfWith(bin, dir, "vmshelf-data", uploadMaxGiB, nil, nil)
}

// startVmshelfWith is startVmshelf in the data dir dir/sub, with extra
// serve flags and environment (the S3 phase's --blobs and AWS_*).
func startVmshelfWith(bin, dir, sub string, uploadMaxGiB int, extra, env []string) (*vmshelf, error) {
	dp, err := freePort()
	if err != nil {
		return nil, err
	}
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	v := &vmshelf{bin: bin, dataDir: filepath.Join(dir, sub), env: env,
		dataAddr: fmt.Sprintf("127.0.0.1:%d", dp), ctlAddr: fmt.Sprintf("127.0.0.1:%d", cp)}
	v.args = []string{"serve", "--dev", "--data-dir", v.dataDir, "--data-addr", v.dataAddr, "--control-addr", v.ctlAddr,
		"--upload-max-gib", strconv.Itoa(uploadMaxGiB), "--max-transfers", strconv.Itoa(maxTransfers),
		"--images-per-tenant", "100000", "--idle-timeout", "5m",
		// One tenant runs all the concurrent uploads: its share of the
		// disk's promises is lifted to all of them.
		"--tenant-reserve-gib", strconv.Itoa(8 * uploadMaxGiB),
		"--fetch-queue-wait", fetchQueueWait.String(),
		// One tenant asks for all the benchmark's tickets: its rate limit
		// (1 a second by default) is lifted so that the control phase
		// measures a ticket's cost, not the 429 of a limit.
		"--ticket-rate", "1e9", "--ticket-burst", "1000000000",
		// The control phase issues thousands of tickets it never uses.
		// Unused live tickets count against the tenant's quota, and with
		// the quota lifted to 100000 each new ticket counts them all: a
		// real tenant, at its quota of a few, never holds that many. An
		// hour's TTL would leave every earlier run's tickets alive; a
		// minute covers the longest wait between a ticket and its use in
		// the other phases (the concurrency probes).
		"--ticket-ttl", "1m"}
	v.args = append(v.args, extra...)
	v.proc, err = startProcEnv(env, "vmshelf", filepath.Join(dir, sub+".log"), false, append([]string{bin}, v.args...)...)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP("http://"+v.ctlAddr+"/healthz", v.proc, 30*time.Second); err != nil {
		v.stop()
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(v.dataDir, "dev-token"))
	if err != nil {
		v.stop()
		return nil, err
	}
	v.token = strings.TrimSpace(string(b))
	return v, nil
}

// restart stops vmshelf and starts it again on the same data directory and
// addresses: a fresh process, for memory measurements that must not carry
// what earlier phases left in the heap.
func (v *vmshelf) restart() error {
	v.stop()
	p, err := startProcEnv(v.env, "vmshelf", v.log, false, append([]string{v.bin}, v.args...)...)
	if err != nil {
		return err
	}
	v.proc = p
	return waitHTTP("http://"+v.ctlAddr+"/healthz", v.proc, 30*time.Second)
}

// maxTransfers is the server's --max-transfers in every phase: room for
// the 4 uploads + 4 fetches of the concurrency phase, so that only the
// probes beyond them are refused.
const maxTransfers = 8

// fetchQueueWait is serve's --fetch-queue-wait in the bench: how long a
// GET beyond the cap waits for a slot before 503 busy. Short (the default
// is 30 s), so that the concurrency phase can wait one out and check the
// 503 within the few seconds its uploads run. No other phase goes beyond
// the cap: their GETs share one token's slot.
const fetchQueueWait = 2 * time.Second

var ctlClient = &http.Client{Timeout: 30 * time.Second}

func (v *vmshelf) post(path, body string, out any) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+v.ctlAddr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+v.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ctlClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: %w: %s", path, err, b)
		}
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return resp.StatusCode, nil
}

type ticket struct {
	Ticket    string `json:"ticket"`
	UploadID  string `json:"upload_id"`
	UploadURL string `json:"upload_url"`
}

func (v *vmshelf) ticket(name string) (ticket, error) {
	var t ticket
	_, err := v.post("/market/vm-images/ticket", `{"name":"`+name+`","efi":false}`, &t)
	return t, err
}

func (v *vmshelf) remove(uploadID string) error {
	_, err := v.post("/market/vm-images/remove", `{"upload_id":"`+uploadID+`"}`, nil)
	return err
}

func (v *vmshelf) imagePath(uploadID string) string {
	return filepath.Join(v.dataDir, "vm-images", uploadID+".qcow2")
}

// fetchCap is one fetch capability of an image, minted by `vmshelf
// fetch-url`. Each one is its own transfer slot on the server (the slot is
// keyed by token), as each CDI import is.
type fetchCap struct {
	// url is the path form, …/fetch/<token>. The token is a secret: url is
	// never logged, put in an error or on a command line.
	url   string
	token string
	// byID is the form the provisioner hands to CDI, …/fetch/<upload_id>
	// with the token in the Authorization header (auth), so that a Go
	// error naming the URL names no secret.
	byID string
}

// auth is the header that carries the token with byID.
func (c fetchCap) auth() string { return "Authorization: Bearer " + c.token }

// mintFetch mints a new fetch capability for uploadID.
func (v *vmshelf) mintFetch(uploadID string) (fetchCap, error) {
	u, err := v.fetchURL(uploadID)
	if err != nil {
		return fetchCap{}, err
	}
	i := strings.LastIndexByte(u, '/')
	if i < 0 || len(u)-i-1 != 64 {
		return fetchCap{}, fmt.Errorf("fetch-url printed no fetch URL (%d characters)", len(u))
	}
	return fetchCap{url: u, token: u[i+1:], byID: u[:i+1] + uploadID}, nil
}

// request is a request of c.byID with the token in its header.
func (c fetchCap) request(method string) *http.Request {
	req, _ := http.NewRequest(method, c.byID, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	return req
}

func (v *vmshelf) fetchURL(uploadID string) (string, error) {
	return v.cli("fetch-url", uploadID, "--ttl", "12h", "--data-dir", v.dataDir, "--data-addr", v.dataAddr)
}

// addBoxes adds n sharing mesh boxes (vmshelf tenant add, beside the running
// serve, as an operator does) and keeps their tokens, which tenant add
// prints once on stdout.
func (v *vmshelf) addBoxes(n int) error {
	for i := len(v.boxes); i < n; i++ {
		token, err := v.cli("tenant", "add", fmt.Sprintf("bench-box-%d", i), "--in-mesh", "--sharing", "--data-dir", v.dataDir)
		if err != nil {
			return err
		}
		if len(token) != 64 {
			return fmt.Errorf("tenant add printed no token (%d characters)", len(token))
		}
		v.boxes = append(v.boxes, token)
	}
	return nil
}

// cli runs a vmshelf command beside the running serve and returns what it
// printed on stdout, trimmed (a URL or a token: never logged here).
func (v *vmshelf) cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, v.bin, args...)
	cmd.Env = append(cleanEnv(), v.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// metric reads one sample of the data plane's /metrics, e.g.
// `vmshelf_transfer_bytes_total{direction="upload"}`.
func (v *vmshelf) metric(series string) (float64, error) {
	resp, err := ctlClient.Get("http://" + v.ctlAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, nil // a labelled series that never moved is absent
}

// ---- nginx ----

type nginx struct {
	*proc
	addr    string
	davRoot string // PUT /up/<name> stores <davRoot>/up/<name>
	conf    string
}

func startNginx(bin, dir, imagesDir string) (*nginx, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &nginx{addr: fmt.Sprintf("127.0.0.1:%d", port), davRoot: filepath.Join(dir, "nginx-dav")}
	prefix := filepath.Join(dir, "nginx")
	for _, d := range []string{prefix, filepath.Join(n.davRoot, "up"), filepath.Join(prefix, "body")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	conf := fmt.Sprintf(`# generated by vmshelf bench
daemon off;
master_process on;
worker_processes 2;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    default_type application/octet-stream;
    server {
        listen %[2]s;
        client_max_body_size 0;
        location /up/ {
            root %[3]s;
            dav_methods PUT;
            create_full_put_path on;
        }
        location /img/ {
            alias %[4]s/;
        }
    }
}
`, prefix, n.addr, n.davRoot, imagesDir)
	n.conf = filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	n.proc, err = startProc("nginx", filepath.Join(dir, "nginx.log"), true,
		bin, "-p", prefix, "-c", n.conf, "-e", filepath.Join(prefix, "error.log"))
	if err != nil {
		return nil, err
	}
	if err := waitHTTP("http://"+n.addr+"/", n.proc, 15*time.Second); err != nil {
		n.stop()
		return nil, err
	}
	// Wait for both workers, so the CPU and RSS sums see them from the start.
	for range 100 {
		if len(n.pids()) >= 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n, nil
}

// ---- tusd ----

type tusd struct {
	*proc
	addr string
	dir  string
}

func startTusd(bin, dir string) (*tusd, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	t := &tusd{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: filepath.Join(dir, "tusd-data")}
	if err := os.MkdirAll(t.dir, 0o755); err != nil {
		return nil, err
	}
	t.proc, err = startProc("tusd", filepath.Join(dir, "tusd.log"), false, bin,
		"-host", "127.0.0.1", "-port", strconv.Itoa(port), "-upload-dir", t.dir, "-base-path", "/files/",
		"-behind-proxy=false", "-expose-metrics=false", "-show-greeting=false", "-verbose=false", "-network-timeout", "5m")
	if err != nil {
		return nil, err
	}
	if err := waitHTTP("http://"+t.addr+"/files/", t.proc, 15*time.Second); err != nil {
		t.stop()
		return nil, err
	}
	return t, nil
}

// create makes an upload of size bytes and returns its URL and file.
func (t *tusd) create(size int64) (url, file string, err error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+t.addr+"/files/", nil)
	req.Header.Set("Tus-Resumable", "1.0.0")
	req.Header.Set("Upload-Length", strconv.FormatInt(size, 10))
	resp, err := ctlClient.Do(req)
	if err != nil {
		return "", "", err
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusCreated || loc == "" {
		return "", "", fmt.Errorf("tusd create: %s", resp.Status)
	}
	if !strings.HasPrefix(loc, "http") {
		loc = "http://" + t.addr + loc
	}
	id := loc[strings.LastIndexByte(loc, '/')+1:]
	return loc, filepath.Join(t.dir, id), nil
}

// ---- discard server (the loopback limit) ----

// runDiscard is the "discard" subcommand: an HTTP/1.1 server that reads
// every request body into nothing and answers 201, as a separate process
// so that its CPU and RSS are measured like a server's.
func runDiscard(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	buf := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.CopyBuffer(io.Discard, r.Body, buf)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%d\n", n)
	})}
	return srv.Serve(ln)
}

type discard struct {
	*proc
	addr string
}

func startDiscard(dir string) (*discard, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d := &discard{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	d.proc, err = startProc("discard", filepath.Join(dir, "discard.log"), false, self, "discard", d.addr)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP("http://"+d.addr+"/", d.proc, 15*time.Second); err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// ---- helpers ----

// fsyncPath makes path and its directory durable and returns how long it
// took: what a peer that answers before its bytes are durable still owes.
func fsyncPath(path string) (float64, error) {
	t0 := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return 0, err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return 0, err
	}
	err = d.Sync()
	d.Close()
	return time.Since(t0).Seconds(), err
}

// warm reads path through so that it is in the page cache.
func warm(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for {
		_, err := f.Read(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// dropCaches syncs and empties the page cache (we are root).
func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}
