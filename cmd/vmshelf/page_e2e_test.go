package main

// End-to-end tests of the Machines page (GET /machines) in a real browser:
// Debian's headless Chromium driven by playwright-core from npm
// (testdata/browser), against the real `vmshelf serve`, over loopback only.
// The Go test starts everything (serve, a throttling proxy or nginx in
// front of the data plane, the fake Stripe) and acts mid-way (restarts
// serve, pays a checkout) while one Node script per scenario works the
// page; a script asks the test for such an action through a small
// loopback control server and ends with a JSON report the test checks.
//
// VMSHELF_SCREENSHOTS=1 makes the scenarios write docs/screenshots/*.png.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// browserDir is testdata/browser, absolute; with it, what the scripts
// need is there: node, Chromium, playwright-core. A missing one skips the
// test loudly, or fails it in CI.
func browserDir(t *testing.T) string {
	t.Helper()
	skipShort(t, "it drives Chromium")
	needTool(t, "node")
	needTool(t, "chromium")
	dir, err := filepath.Abs(filepath.Join("testdata", "browser"))
	if err != nil {
		t.Fatal(err)
	}
	// playwright-core 1.65 needs Node 20 (Debian 12's own nodejs is 18).
	if r := runCmd(t, nil, "node", "-e", "process.exit(+process.versions.node.split('.')[0] >= 20 ? 0 : 1)"); r.code != 0 {
		msg := "playwright-core needs Node.js 20 or later; node --version: " + strings.TrimSpace(runCmd(t, nil, "node", "--version").stdout)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core", "package.json")); err != nil {
		msg := "playwright-core is not installed (npm ci --prefix cmd/vmshelf/testdata/browser)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// shotsDir is where the scripts write screenshots: docs/screenshots under
// VMSHELF_SCREENSHOTS=1, else nowhere (normal runs never rewrite docs).
func shotsDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("VMSHELF_SCREENSHOTS") != "1" {
		return ""
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "docs", "screenshots"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// randomQcow2 converts mib MiB of random bytes to a QCOW2 (as large as
// its data: random bytes leave no cluster out) and returns its path and
// bytes. Its first sector reads as bootable (see bootable), so that an
// order of it is not refused. The test has called needTool(t, "qemu-img").
func randomQcow2(t *testing.T, dir, name string, mib int) (string, []byte) {
	t.Helper()
	raw := filepath.Join(dir, name+".raw")
	b := make([]byte, mib<<20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	bootable(b)
	if err := os.WriteFile(raw, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if r := runCmd(t, nil, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, p); r.code != 0 {
		t.Fatalf("qemu-img convert: %s", r.stderr)
	}
	if err := os.Remove(raw); err != nil {
		t.Fatal(err)
	}
	q, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, q
}

// bootable makes the first sector of disk what the edge's boot check
// takes for a boot loader both firmware kinds could start: boot code and
// the 0x55AA signature (a BIOS's), laid out as a FAT boot sector (a jump,
// 512 bytes a sector, 4 sectors a cluster: UEFI's).
func bootable(disk []byte) {
	copy(disk, []byte{0xeb, 0x3c, 0x90})
	binary.LittleEndian.PutUint16(disk[11:], 512)
	disk[13] = 4
	disk[510], disk[511] = 0x55, 0xaa
}

// controlCall is a script's request to the test: which action, its body,
// where the answer goes.
type controlCall struct {
	name  string
	body  []byte
	reply chan controlReply
}

type controlReply struct {
	status int
	body   []byte
}

// action is what the test does when a script asks: it runs on the test's
// goroutine (so it may t.Fatal) and its result is the JSON answer.
type action func(body []byte) any

// pageRun is one scenario script running: the node process, and the
// control server it calls.
type pageRun struct {
	t        *testing.T
	scenario string
	cmd      *exec.Cmd
	stdout   *syncBuffer
	stderr   *syncBuffer
	exited   chan struct{}
	waitErr  error
	calls    chan controlCall
	actions  map[string]action
	deadline time.Time
	extra    func() string // more to show when the run fails (serve's log)
	secrets  []string      // never shown in the test's output
}

// redact hides the run's secrets (the token, user data) in text the test
// logs.
func (pr *pageRun) redact(s string) string {
	for _, v := range pr.secrets {
		s = strings.ReplaceAll(s, v, "<redacted>")
	}
	return s
}

// startPage runs testdata/browser/<scenario>.mjs with env (PAGE_* names),
// a fresh profile dir and the control server; the script must end within
// d. actions are what the script may ask for.
func startPage(t *testing.T, scenario string, d time.Duration, env map[string]string, actions map[string]action) *pageRun {
	t.Helper()
	dir := browserDir(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	pr := &pageRun{
		t: t, scenario: scenario, stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{}),
		calls: make(chan controlCall), actions: actions, deadline: time.Now().Add(d),
	}
	done := make(chan struct{})
	ctl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c := controlCall{name: strings.TrimPrefix(r.URL.Path, "/"), body: body, reply: make(chan controlReply, 1)}
		select {
		case pr.calls <- c:
		case <-done:
			http.Error(w, "the test is over", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			return
		}
		select {
		case rep := <-c.reply:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rep.status)
			_, _ = w.Write(rep.body)
		case <-done:
			http.Error(w, "the test is over", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(done); ctl.Close() })

	vars := []string{
		"PAGE_CONTROL=" + ctl.URL, "PAGE_PROFILE=" + t.TempDir(), "PAGE_CHROMIUM=" + chromium,
		"PAGE_SHOTS=" + shotsDir(t),
	}
	for k, v := range env {
		vars = append(vars, k+"="+v)
		if k == "PAGE_TOKEN" || k == "PAGE_USER_DATA" {
			pr.secrets = append(pr.secrets, v)
		}
	}
	pr.cmd = exec.Command("node", filepath.Join(dir, scenario+".mjs"))
	pr.cmd.Dir = dir
	pr.cmd.Env = cleanEnv(vars...)
	pr.cmd.Stdout, pr.cmd.Stderr = pr.stdout, pr.stderr
	// If the test binary dies, so does node (and with it, playwright's
	// Chromium); at cleanup SIGTERM lets playwright close Chromium first.
	pr.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr.cmd.WaitDelay = 5 * time.Second
	if err := pr.cmd.Start(); err != nil {
		t.Fatalf("node %s.mjs: %v", scenario, err)
	}
	go func() { pr.waitErr = pr.cmd.Wait(); close(pr.exited) }()
	t.Cleanup(func() {
		select {
		case <-pr.exited:
			return
		default:
		}
		_ = pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.exited:
		case <-time.After(15 * time.Second):
			_ = pr.cmd.Process.Kill()
			<-pr.exited
		}
		t.Logf("%s.mjs was stopped at cleanup; its stderr:\n%s", scenario, pr.stderr)
	})
	return pr
}

// failf fails the test with the script's log (and serve's, if set).
func (pr *pageRun) failf(format string, args ...any) {
	pr.t.Helper()
	msg := fmt.Sprintf(format, args...)
	more := ""
	if pr.extra != nil {
		more = "\n--- more:\n" + pr.extra()
	}
	pr.t.Fatalf("%s\n--- %s.mjs stderr:\n%s%s", pr.redact(msg), pr.scenario, pr.redact(pr.stderr.String()), more)
}

// serve answers the script's control calls until ch is closed; the script
// ending first, or the deadline, fails the test.
func (pr *pageRun) until(ch <-chan struct{}, what string) {
	pr.t.Helper()
	timer := time.NewTimer(time.Until(pr.deadline))
	defer timer.Stop()
	for {
		select {
		case <-ch:
			return
		case c := <-pr.calls:
			pr.answer(c)
		case <-pr.exited:
			pr.failf("%s.mjs ended (%v) while the test waited for %s", pr.scenario, pr.waitErr, what)
		case <-timer.C:
			pr.failf("%s.mjs: no %s by the deadline", pr.scenario, what)
		}
	}
}

func (pr *pageRun) answer(c controlCall) {
	pr.t.Helper()
	f := pr.actions[c.name]
	if f == nil {
		c.reply <- controlReply{http.StatusNotFound, []byte(`{"error":"no such action"}`)}
		pr.failf("%s.mjs asked for the unknown action %q", pr.scenario, c.name)
	}
	b, err := json.Marshal(f(c.body))
	if err != nil {
		pr.t.Fatal(err)
	}
	c.reply <- controlReply{http.StatusOK, b}
}

// wait answers control calls until the script exits, wants exit 0, decodes
// its report (the last stdout line) into report and checks that the page
// had no uncaught exception and broke no CSP rule.
func (pr *pageRun) wait(report any) {
	pr.t.Helper()
	pr.untilExit()
	out := strings.TrimRight(pr.stdout.String(), "\n")
	last := out[strings.LastIndex(out, "\n")+1:]
	var common struct {
		PageErrors []string    `json:"pageErrors"`
		Events     []pageEvent `json:"events"`
	}
	if err := json.Unmarshal([]byte(last), &common); err != nil {
		pr.failf("%s.mjs's last line is not its JSON report (%v): %q", pr.scenario, err, last)
	}
	if os.Getenv("VMSHELF_PAGE_REPORT") == "1" {
		pr.t.Logf("%s.mjs's report: %s", pr.scenario, pr.redact(last))
	}
	if len(common.PageErrors) > 0 {
		pr.t.Errorf("the page had errors: %q", common.PageErrors)
	}
	if err := json.Unmarshal([]byte(last), report); err != nil {
		pr.failf("%s.mjs's report: %v", pr.scenario, err)
	}
	pr.t.Logf("%s.mjs:\n%s", pr.scenario, pr.redact(pr.stderr.String()))
}

// untilExit serves control calls until the script exits with 0.
func (pr *pageRun) untilExit() {
	pr.t.Helper()
	timer := time.NewTimer(time.Until(pr.deadline))
	defer timer.Stop()
	for {
		select {
		case c := <-pr.calls:
			pr.answer(c)
		case <-pr.exited:
			if pr.waitErr != nil {
				pr.failf("%s.mjs failed: %v", pr.scenario, pr.waitErr)
			}
			return
		case <-timer.C:
			pr.failf("%s.mjs did not finish by its deadline", pr.scenario)
		}
	}
}

// pageEvent is what the page's recorder saw: a change of an upload row or
// an announcement of the live region.
type pageEvent struct {
	At       int    `json:"at"`
	Kind     string `json:"kind"`
	Batch    int    `json:"batch"` // the recorder's scan: one task's changes
	File     string `json:"file"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Resumed  bool   `json:"resumed"`
	UploadID string `json:"uploadId"`
	Value    int    `json:"value"`
	Status   string `json:"status"`
	Text     string `json:"text"`
}

// uploadRow is an upload row as a script read it.
type uploadRow struct {
	File     string `json:"file"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Resumed  bool   `json:"resumed"`
	UploadID string `json:"uploadId"`
	Value    int    `json:"value"`
	Max      int    `json:"max"`
	Percent  string `json:"percent"`
	Speed    string `json:"speed"`
	ETA      string `json:"eta"`
	Status   string `json:"status"`
}

type pageImages struct {
	Quota *struct {
		Text  string `json:"text"`
		Used  string `json:"used"`
		Limit string `json:"limit"`
	} `json:"quota"`
	List []struct {
		UploadID     string `json:"uploadId"`
		Name         string `json:"name"`
		SHA256       string `json:"sha256"`
		Size         string `json:"size"`
		RemoveButton bool   `json:"removeButton"`
		Boot         string `json:"boot"` // the notice of a disk no machine can start from
	} `json:"list"`
}

type pageStorage struct {
	Session map[string]string `json:"session"`
	Local   map[string]string `json:"local"`
}

// pageLayout is lib.mjs's layout: where the sections start, the page's
// height, the catalogue's cards and the not-offered list.
type pageLayout struct {
	Tops     map[string]*int `json:"tops"`
	Height   int             `json:"height"`
	Viewport int             `json:"viewport"`
	Cards    []struct {
		Top        int `json:"top"`
		Left       int `json:"left"`
		Height     int `json:"height"`
		LastBottom int `json:"lastBottom"`
	} `json:"cards"`
	NotOffered struct {
		Details   string `json:"details"`
		Open      bool   `json:"open"`
		Summary   string `json:"summary"`
		Items     int    `json:"items"`
		ItemShown bool   `json:"itemShown"`
	} `json:"notOffered"`
}

// above checks that section a is shown and starts above section b (or b
// is not shown).
func (l pageLayout) above(t *testing.T, what, a, b string) {
	t.Helper()
	ta, tb := l.Tops[a], l.Tops[b]
	if ta == nil || (tb != nil && *ta >= *tb) {
		t.Errorf("%s: #%s starts at %s, #%s at %s; want #%s shown, above", what, a, topOf(ta), b, topOf(tb), a)
	}
}

func topOf(p *int) string {
	if p == nil {
		return "(not shown)"
	}
	return strconv.Itoa(*p) + " px"
}

// wantEvenCatalogue checks the systems' grid: every card as tall as the
// others, cards side by side in rows that start level, and each card's
// last line at the same distance from its bottom.
func wantEvenCatalogue(t *testing.T, l pageLayout) {
	t.Helper()
	if len(l.Cards) < 4 {
		t.Fatalf("the catalogue shows %d cards", len(l.Cards))
	}
	rows := map[int]int{}
	for _, c := range l.Cards {
		rows[c.Top]++
		if d := c.Height - l.Cards[0].Height; d < -1 || d > 1 || c.LastBottom != l.Cards[0].LastBottom {
			t.Errorf("catalogue card %+v beside %+v: heights or last lines differ (ragged)", c, l.Cards[0])
		}
	}
	if len(rows) >= len(l.Cards) {
		t.Errorf("the catalogue's %d cards are in %d rows: not a grid", len(l.Cards), len(rows))
	}
	if first := rows[l.Cards[0].Top]; first < 2 {
		t.Errorf("the catalogue's first row has %d card(s)", first)
	}
}

// wantFolded checks that the not-offered list is a closed <details> whose
// summary counts its n entries.
func wantFolded(t *testing.T, l pageLayout, n int) {
	t.Helper()
	no := l.NotOffered
	if no.Details != "details" || no.Open || no.ItemShown || no.Items != n || !strings.Contains(no.Summary, strconv.Itoa(n)) {
		t.Errorf("the not-offered list is %+v; want a closed <details> of its %d entries, the count in its summary", no, n)
	}
}

// pageUTC is how the page writes an instant: the CLI's utcMinute, with
// the zone named.
func pageUTC(tm time.Time) string { return utcMinute(tm) + " UTC" }

// commonReport is in every report.
type commonReport struct {
	Events     []pageEvent `json:"events"`
	PageErrors []string    `json:"pageErrors"`
}

// wantListed checks that the page lists exactly the image with the bytes'
// SHA-256, under the file's name without .qcow2.
func wantListed(t *testing.T, got pageImages, file string, b []byte, uploadID string) {
	t.Helper()
	name := strings.TrimSuffix(filepath.Base(file), ".qcow2")
	if len(got.List) != 1 {
		t.Fatalf("the page lists %d images, want 1: %+v", len(got.List), got.List)
	}
	img := got.List[0]
	if img.SHA256 != sha256hex(b) || img.Name != name || (uploadID != "" && img.UploadID != uploadID) || !img.RemoveButton {
		t.Errorf("the page lists %+v; want %s named %q with SHA-256 %s and a remove button", img, uploadID, name, sha256hex(b))
	}
}

// wantDone checks a finished upload row: done, the bar at 100 of 100.
func wantDone(t *testing.T, r uploadRow) {
	t.Helper()
	if r.State != "done" || r.Value != 100 || r.Max != 100 || !strings.Contains(r.Percent, "100") || r.Reason != "" {
		t.Errorf("the finished upload's row is %+v; want done, the bar at 100 of 100, 100 %%", r)
	}
}

// rowEvents are the recorded changes of one file's row.
func rowEvents(evs []pageEvent, file string) []pageEvent {
	var out []pageEvent
	for _, e := range evs {
		if e.Kind == "row" && e.File == file {
			out = append(out, e)
		}
	}
	return out
}

// liveTexts are the live region's announcements.
func liveTexts(evs []pageEvent) []string {
	var out []string
	for _, e := range evs {
		if e.Kind == "live" {
			out = append(out, e.Text)
		}
	}
	return out
}

// noToken checks that the token is kept only in sessionStorage: never in
// localStorage, never in the URL.
func noToken(t *testing.T, st pageStorage, pageURL, token string) {
	t.Helper()
	for k, v := range st.Local {
		if strings.Contains(k+v, token) {
			t.Errorf("localStorage[%q] holds the token", k)
		}
	}
	if strings.Contains(pageURL, token) {
		t.Errorf("the page's URL holds the token")
	}
}

// startPageServe starts serve for the page on fresh ports with the data
// plane behind p when p is set (--public-url). No --cors-origin: by
// default the data plane lets the page's own origin upload.
func startPageServe(t *testing.T, data string, p *tcpProxy, args []string, env ...string) *server {
	t.Helper()
	ctl := freeAddr(t)
	dataAddr := freeAddr(t)
	if p != nil {
		args = append(args, "--public-url", p.base())
		dataAddr = p.target
	}
	return startServeAt(t, data, dataAddr, ctl, args, env...)
}

// TestPageUpload: sign in on /machines, upload a QCOW2, see the bar reach
// 100 % and the image listed with the SHA-256 of its bytes.
func TestPageUpload(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, nil)
	disk, b := randomQcow2(t, work, "first-disk.qcow2", 6)

	pr := startPage(t, "upload", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk,
	}, nil)
	pr.extra = s.logs
	var rep struct {
		commonReport
		Before struct {
			TokenLabel struct {
				Type  string `json:"type"`
				Label string `json:"label"`
			} `json:"tokenLabel"`
			UploadVisible bool `json:"uploadVisible"`
		} `json:"before"`
		Empty       pageImages  `json:"empty"`
		Done        uploadRow   `json:"done"`
		Listed      pageImages  `json:"listed"`
		AfterReload pageImages  `json:"afterReload"`
		Store       pageStorage `json:"store"`
		URL         string      `json:"url"`
	}
	pr.wait(&rep)

	if rep.Before.TokenLabel.Type != "password" || !strings.Contains(strings.ToLower(rep.Before.TokenLabel.Label), "token") {
		t.Errorf("#token is %+v; want a password field labelled Tenant token", rep.Before.TokenLabel)
	}
	if rep.Before.UploadVisible {
		t.Error("without a token the upload form shows")
	}
	if len(rep.Empty.List) != 0 || rep.Empty.Quota == nil || rep.Empty.Quota.Used != "0" {
		t.Errorf("before the upload the page shows %+v; want no images, quota used 0", rep.Empty)
	}
	wantDone(t, rep.Done)
	imgs := s.status(t, s.token).Images
	if len(imgs) != 1 {
		t.Fatalf("status lists %d images, want 1", len(imgs))
	}
	wantImage(t, s, imgs[0].UploadID, b)
	if rep.Done.UploadID != imgs[0].UploadID {
		t.Errorf("the row's data-upload-id is %q, the image is %s", rep.Done.UploadID, imgs[0].UploadID)
	}
	wantListed(t, rep.Listed, disk, b, imgs[0].UploadID)
	wantListed(t, rep.AfterReload, disk, b, imgs[0].UploadID)
	if rep.Listed.Quota == nil || rep.Listed.Quota.Used != "1" {
		t.Errorf("after the upload #image-quota is %+v; want data-used 1", rep.Listed.Quota)
	}
	if got := rep.Store.Session["vmshelf.token"]; got != s.token {
		t.Errorf("sessionStorage[vmshelf.token] is %q…, want the token", got[:min(len(got), 8)])
	}
	noToken(t, rep.Store, rep.URL, s.token)
	// The session URL is a capability kept only until the upload is done
	// (removeFingerprintOnSuccess).
	for k, v := range rep.Store.Local {
		if strings.Contains(v, "/upload-sessions/") {
			t.Errorf("localStorage[%q] still holds the finished upload's session URL", k)
		}
	}
	// Progress went up to 100 and was announced, but not on every event.
	evs := rowEvents(rep.Events, filepath.Base(disk))
	last := -1
	for _, e := range evs {
		if e.Value >= 0 && e.Value < last && e.State == "uploading" {
			t.Errorf("the bar went back from %d to %d during a straight upload", last, e.Value)
		}
		last = max(last, e.Value)
	}
	lives := liveTexts(rep.Events)
	if len(lives) == 0 || len(lives) > 20 {
		t.Errorf("#upload-live announced %d times during one upload (%q); want a few (every 10 %% and each state)", len(lives), lives)
	}
}

// TestPageUploadServeRestart: serve restarts (same data dir and ports)
// while the page uploads; the page retries, resumes the same session from
// what the edge kept and finishes with the right SHA-256.
func TestPageUploadServeRestart(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	data := filepath.Join(work, "data")
	p := startProxy(t, freeAddr(t))
	p.rate.Store(4 << 20)
	disk, b := randomQcow2(t, work, "restarted.qcow2", 24)
	size := int64(len(b))
	s := startPageServe(t, data, p, nil)
	args := []string{"--public-url", p.base()}

	pr := startPage(t, "restart", 150*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk,
	}, nil)
	pr.extra = s.logs
	pr.until(p.reached(size/2), "half the bytes at the edge")

	// No connection reaches the edge until the test has seen what the
	// first serve kept; the page retries meanwhile.
	p.refuse.Store(true)
	s.terminate(t)
	locs := p.sessionLocations()
	if len(locs) != 1 {
		t.Fatalf("before the restart the edge created %d upload sessions, want 1", len(locs))
	}
	noteSession(t, s, locs[0])
	s.assertNoSecrets()
	s2 := startServeAt(t, data, s.dataAddr, s.ctlAddr, args)
	noteSession(t, s2, locs[0])
	pr.extra = s2.logs
	saved := s2.waitSaved(t, locs[0], size/4, size-1, nil)
	before := p.up.Load()
	p.refuse.Store(false)

	var rep struct {
		commonReport
		Done   uploadRow  `json:"done"`
		Listed pageImages `json:"listed"`
	}
	pr.wait(&rep)
	wantDone(t, rep.Done)
	if locs := p.sessionLocations(); len(locs) != 1 {
		t.Errorf("the edges created %d upload sessions, want 1: the page started over", len(locs))
	}
	if code, off := s2.head(t, locs[0]); code != http.StatusOK || off != size {
		t.Errorf("HEAD on the session: %d, offset %d; want 200 and all %d bytes", code, off, size)
	}
	imgs := s2.status(t, s2.token).Images
	if len(imgs) != 1 {
		t.Fatalf("status lists %d images, want 1", len(imgs))
	}
	wantImage(t, s2, imgs[0].UploadID, b)
	wantListed(t, rep.Listed, disk, b, imgs[0].UploadID)
	after := p.up.Load() - before
	if after < size-saved || after > size-saved+resumeMargin {
		t.Errorf("the page sent %d bytes after the restart; the edge had %d of %d, so %d to %d were due: not resumed",
			after, saved, size, size-saved, size-saved+resumeMargin)
	}
	// The row said it was retrying, and its bar never fell back to the
	// start: after the restart it goes on from what the edge kept.
	evs := rowEvents(rep.Events, filepath.Base(disk))
	retried, low := false, 100
	for _, e := range evs {
		retried = retried || e.State == "retrying"
		if retried && e.Value >= 0 {
			low = min(low, e.Value)
		}
	}
	if !retried {
		t.Errorf("the row never showed data-state=retrying while serve was down; its changes: %+v", evs)
	}
	if low < int(saved*100/size)-1 {
		t.Errorf("after the restart the bar went down to %d %%; the edge had kept %d %%", low, saved*100/size)
	}
	t.Logf("the edge kept %d of %d; the page sent %d after the restart, %d in all", saved, size, after, p.up.Load())
}

// noteSession notes the session id of a session URL as a secret of s.
func noteSession(t *testing.T, s *server, loc string) {
	t.Helper()
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatalf("the session's Location: %v", err)
	}
	id, ok := strings.CutPrefix(u.Path, "/market/vm-images/upload-sessions/")
	if !ok || !hex64.MatchString(id) {
		t.Fatalf("the session's Location has path %q", u.Path)
	}
	s.secret(id)
}

// TestPageUploadReload: the page is reloaded mid-upload and the same file
// chosen again: the upload resumes its session, not from 0; then the
// browser is closed mid-upload and launched again on the same profile: it
// resumes again and finishes. One ticket, one session, each byte sent
// about once.
func TestPageUploadReload(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	p.rate.Store(3 << 20)
	disk, b := randomQcow2(t, work, "reloaded.qcow2", 24)
	size := int64(len(b))
	s := startPageServe(t, filepath.Join(work, "data"), p, nil)

	pr := startPage(t, "reload", 150*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk,
	}, nil)
	pr.extra = s.logs
	var rep struct {
		commonReport
		BeforeReload   uploadRow   `json:"beforeReload"`
		Waiting        sessionRow  `json:"waiting"`
		StoreMid       pageStorage `json:"storeMid"`
		AfterReload    uploadRow   `json:"afterReload"`
		BeforeClose    pageStorage `json:"storeBeforeClose"`
		AfterRestart   pageStorage `json:"storeAfterRestart"`
		TokenForgotten bool        `json:"tokenForgotten"`
		WaitingAgain   sessionRow  `json:"waitingAgain"`
		Done           uploadRow   `json:"done"`
		Listed         pageImages  `json:"listed"`
		StoreEnd       pageStorage `json:"storeEnd"`
	}
	pr.wait(&rep)
	locs := p.sessionLocations()
	for _, l := range locs {
		noteSession(t, s, l)
	}
	if len(locs) != 1 {
		// Which localStorage held the session's address (keys only: the
		// values are capabilities): lost at the close, or never written?
		t.Errorf("the edge created %d upload sessions, want 1: the page started over; localStorage keys after the reload %q, before the browser closed %q, after its restart %q",
			len(locs), slices.Sorted(maps.Keys(rep.StoreMid.Local)), slices.Sorted(maps.Keys(rep.BeforeClose.Local)), slices.Sorted(maps.Keys(rep.AfterRestart.Local)))
	}
	if n := s.ticketsIssued(t); n != 1 {
		t.Errorf("%v tickets were issued, want 1: a resume takes no new ticket", n)
	}
	for what, w := range map[string]sessionRow{"after the reload": rep.Waiting, "after the browser restart": rep.WaitingAgain} {
		lower := strings.ToLower(w.Text)
		if w.State != "waiting" || !strings.Contains(lower, "resume") ||
			!(strings.Contains(lower, "same file") || strings.Contains(w.Text, filepath.Base(disk))) {
			t.Errorf("%s the unfinished upload's row is %+v; want waiting, saying to choose the same file to resume", what, w)
		}
		// The row waits for the user, not the user for the row: its
		// first word says what to do.
		if !strings.Contains(strings.ToLower(w.Word), "choose") {
			t.Errorf("%s the unfinished upload's row starts %q; want words that say to choose the file again", what, w.Word)
		}
	}
	if !rep.AfterReload.Resumed || !rep.Done.Resumed {
		t.Errorf("data-resumed: %v after the reload, %v at the end; want true (it continued from an offset > 0)", rep.AfterReload.Resumed, rep.Done.Resumed)
	}
	if !rep.TokenForgotten {
		t.Error("after a browser restart the page did not ask for the token again (sessionStorage only)")
	}
	wantDone(t, rep.Done)
	imgs := s.status(t, s.token).Images
	if len(imgs) != 1 {
		t.Fatalf("status lists %d images, want 1", len(imgs))
	}
	wantImage(t, s, imgs[0].UploadID, b)
	wantListed(t, rep.Listed, disk, b, imgs[0].UploadID)
	// Every byte about once: starting over at the reload (past 20 %) or at
	// the restart would have sent at least a fifth more.
	if up := p.up.Load(); up < size || up > size+size/10 {
		t.Errorf("%d bytes reached the edge for an image of %d: want about one image's worth (resumed, not restarted)", up, size)
	}
	// The bar after each interruption started where the edge was, not at 0.
	evs := rowEvents(rep.Events, filepath.Base(disk))
	for i, e := range evs {
		if e.State == "uploading" && e.Value == 0 && i > 0 && evs[i-1].Value > 0 {
			t.Errorf("the bar fell back to 0 after %d %%: %+v", evs[i-1].Value, evs)
			break
		}
	}
	noToken(t, rep.StoreEnd, "", s.token)
	for k, v := range rep.StoreEnd.Local {
		if strings.Contains(v, "/upload-sessions/") {
			t.Errorf("localStorage[%q] still holds the finished upload's session URL", k)
		}
	}
	t.Logf("%d bytes reached the edge for %d", p.up.Load(), size)
}

// sessionRow is the row of an unfinished session, as a script read it.
type sessionRow struct {
	State string `json:"state"`
	File  string `json:"file"`
	Text  string `json:"text"`
	Word  string `json:"word"` // the state's word, first on the row
}

// TestPageUploadCancel: Cancel in the middle of an upload ends it at the
// edge too (tus DELETE): no session left, no image, nothing offered for
// resuming after a reload, no session URL kept in the browser.
func TestPageUploadCancel(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	p.rate.Store(2 << 20)
	disk, _ := randomQcow2(t, work, "cancelled.qcow2", 16)
	s := startPageServe(t, filepath.Join(work, "data"), p, nil)

	var sessionsLeft []json.RawMessage
	headCode := 0
	pr := startPage(t, "cancel", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk,
	}, map[string]action{
		"cancelled": func([]byte) any {
			locs := p.sessionLocations()
			if len(locs) != 1 {
				t.Fatalf("the edge created %d sessions before the cancel, want 1", len(locs))
			}
			noteSession(t, s, locs[0])
			// The DELETE may still be on its way when the row says cancelled.
			poll(t, 400, 25*time.Millisecond, "the edge to end the cancelled session", func() bool {
				headCode, _ = s.head(t, locs[0])
				var st struct {
					Sessions []json.RawMessage `json:"sessions"`
				}
				code, body := s.ctl(t, "/market/vms/status", s.token, "")
				if code != http.StatusOK {
					t.Fatalf("status: %d %s", code, body)
				}
				if err := json.Unmarshal(body, &st); err != nil {
					t.Fatal(err)
				}
				sessionsLeft = st.Sessions
				return headCode == http.StatusNotFound && len(st.Sessions) == 0
			}, func() string { return fmt.Sprintf("HEAD %d, sessions %s", headCode, sessionsLeft) })
			return map[string]int{"head": headCode}
		},
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		Mid       uploadRow   `json:"mid"`
		Cancelled uploadRow   `json:"cancelled"`
		Rows      []string    `json:"rows"`
		Store     pageStorage `json:"store"`
	}
	pr.wait(&rep)
	if rep.Cancelled.State != "cancelled" || rep.Cancelled.Status == "" {
		t.Errorf("the cancelled row is %+v; want cancelled, in words", rep.Cancelled)
	}
	for _, st := range rep.Rows {
		if st == "waiting" {
			t.Errorf("after a reload the page offers the cancelled upload for resuming: rows %q", rep.Rows)
		}
	}
	for k, v := range rep.Store.Local {
		if strings.Contains(v, "/upload-sessions/") {
			t.Errorf("localStorage[%q] keeps the cancelled upload's session URL", k)
		}
	}
	if imgs := s.status(t, s.token).Images; len(imgs) != 0 {
		t.Errorf("status lists %d images after the cancel, want none", len(imgs))
	}
}

// nginxProxy is Debian's nginx in front of both planes on one loopback
// origin, with a body limit, request buffering off for the data plane.
type nginxProxy struct {
	addr, dir string
	access    string // the access log: method status request_length probe
}

// startNginx runs nginx (master_process off: one process of this user, no
// root paths) until the test ends.
func startNginx(t *testing.T, ctlAddr, dataAddr, bodyLimit string) *nginxProxy {
	t.Helper()
	dir := t.TempDir()
	n := &nginxProxy{addr: freeAddr(t), dir: dir, access: filepath.Join(dir, "access.log")}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 64; }
http {
    # No URI in the log: session URLs are capabilities. The test's own
    # probe marks itself with a header instead.
    log_format sizes '$request_method $status $request_length $http_x_test_probe';
    access_log %[2]s sizes;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    client_max_body_size %[3]s;
    server {
        listen %[4]s;
        # The data plane: uploads (tus creation and its sessions), streamed.
        location /market/vm-images/upload {
            proxy_pass http://%[5]s;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering off;
        }
        location / {
            proxy_pass http://%[6]s;
        }
    }
}
`, dir, n.access, bodyLimit, n.addr, dataAddr, ctlAddr)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCmd(t, nil, "nginx", "-t", "-q", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath); r.code != 0 {
		t.Fatalf("nginx -t: %s", r.stderr)
	}
	c := startChild(t, "nginx", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	poll(t, 400, 25*time.Millisecond, "nginx to answer", func() bool {
		select {
		case <-c.exited:
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited (%v): %s\n%s", c.waitErr, c.stderr, b)
		default:
		}
		// Any answer will do: serve may not run yet (nginx says 502).
		resp, err := httpClient.Get("http://" + n.addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return n
}

func (n *nginxProxy) base() string { return "http://" + n.addr }

// requests is the access log: method, status, request length, leaving
// out the test's own probes (marked with X-Test-Probe). nginx writes a
// line only once it has freed the request, which after a 413 is after
// the client already has its answer, so a probe's line may come late:
// counting lines before and after would race with it.
func (n *nginxProxy) requests(t *testing.T) [][3]string {
	t.Helper()
	b, err := os.ReadFile(n.access)
	if err != nil {
		t.Fatal(err)
	}
	var out [][3]string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[3] == "-" {
			out = append(out, [3]string{f[0], f[1], f[2]})
		}
	}
	return out
}

// TestPageUploadNginx: the page and its uploads through nginx. With a
// 16 MiB body limit an image larger than that finishes, every PATCH under
// the limit; with a 3 MiB limit the page halves its chunks after nginx's
// 413 and still finishes; with 512 KiB it gives up and says a proxy
// refuses requests over that size.
func TestPageUploadNginx(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	needTool(t, "nginx")
	needTool(t, "curl")
	for _, tc := range []struct {
		name, limit string
		maxPatch    int64  // no PATCH passed with more
		want        string // done, or the reason
		some413     bool
	}{
		{"16m", "16m", 8<<20 + 64<<10, "done", false},
		{"3m halves its chunks", "3m", 2<<20 + 64<<10, "done", true},
		{"512k refuses", "512k", 0, "proxyTooLarge", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := t.TempDir()
			ctl, dataAddr := freeAddr(t), freeAddr(t)
			ng := startNginx(t, ctl, dataAddr, tc.limit)
			s := startServeAt(t, filepath.Join(work, "data"), dataAddr, ctl, []string{"--public-url", ng.base()})
			mib := 20
			if tc.want != "done" {
				mib = 2
			}
			disk, b := randomQcow2(t, work, "behind-nginx.qcow2", mib)

			// The limit is in force: one request over it is refused by nginx.
			big := filepath.Join(work, "big.body")
			if err := os.WriteFile(big, make([]byte, 17<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, _ := curl(t, "-X", "PATCH", "-H", "X-Test-Probe: yes", "--data-binary", "@"+big, ng.base()+"/market/vm-images/upload-sessions/probe"); code != http.StatusRequestEntityTooLarge {
				t.Fatalf("a 17 MiB PATCH through nginx got %d, want nginx's 413", code)
			}

			pr := startPage(t, "nginx", 120*time.Second, map[string]string{
				"PAGE_URL": ng.base() + "/machines", "PAGE_TOKEN": s.token, "PAGE_FILE": disk, "PAGE_WANT": tc.want,
			}, nil)
			pr.extra = s.logs
			var rep struct {
				commonReport
				Done    uploadRow  `json:"done"`
				Listed  pageImages `json:"listed"`
				Refused uploadRow  `json:"refused"`
				Message string     `json:"message"`
			}
			pr.wait(&rep)
			reqs := ng.requests(t)
			var patches, refused int
			for _, r := range reqs {
				if r[0] != "PATCH" {
					continue
				}
				patches++
				n, err := strconv.ParseInt(r[2], 10, 64)
				if err != nil {
					t.Fatalf("access log: %q", r)
				}
				switch {
				case r[1] == "413":
					refused++
				case r[1] != "204" && r[1] != "201" && r[1] != "200":
					t.Errorf("a PATCH through nginx got %s", r[1])
				case n > tc.maxPatch:
					t.Errorf("a PATCH of %d bytes passed nginx with limit %s, want at most %d", n, tc.limit, tc.maxPatch)
				}
			}
			if (refused > 0) != tc.some413 {
				t.Errorf("nginx refused %d of %d PATCHes with 413; want some: %v", refused, patches, tc.some413)
			}
			if tc.want == "done" {
				wantDone(t, rep.Done)
				imgs := s.status(t, s.token).Images
				if len(imgs) != 1 {
					t.Fatalf("status lists %d images, want 1", len(imgs))
				}
				wantImage(t, s, imgs[0].UploadID, b)
				wantListed(t, rep.Listed, disk, b, imgs[0].UploadID)
				if patches-refused < int(int64(len(b))/(tc.maxPatch)) {
					t.Errorf("%d PATCHes passed for %d bytes with at most %d each", patches-refused, len(b), tc.maxPatch)
				}
				return
			}
			if rep.Refused.State != "refused" || rep.Refused.Reason != tc.want || !strings.Contains(rep.Refused.Status, "MiB") ||
				!strings.Contains(strings.ToLower(rep.Refused.Status), "proxy") {
				t.Errorf("the row is %+v; want refused %s saying a proxy refuses requests over N MiB", rep.Refused, tc.want)
			}
		})
	}
}

// TestPageRefusals: refusals are shown in words with their reason. A file
// that is not a QCOW2 and one with a backing file are refused in the
// browser before any ticket; with a quota of one image, of two files
// chosen at once one is stored and the other refused with imageQuota.
func TestPageRefusals(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, []string{"--images-per-tenant", "1"})
	junk := filepath.Join(work, "holiday-photos.bin")
	jb := make([]byte, 1<<20)
	if _, err := rand.Read(jb); err != nil {
		t.Fatal(err)
	}
	jb[0] = 0 // never the QCOW2 magic
	if err := os.WriteFile(junk, jb, 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := randomQcow2(t, work, "base.qcow2", 1)
	backed := filepath.Join(work, "overlay.qcow2")
	if r := runCmd(t, nil, "qemu-img", "create", "-f", "qcow2", "-b", base, "-F", "qcow2", backed); r.code != 0 {
		t.Fatalf("qemu-img create -b: %s", r.stderr)
	}
	one, b1 := randomQcow2(t, work, "one.qcow2", 2)
	two, b2 := randomQcow2(t, work, "two.qcow2", 2)

	var ticketsAtCheck float64 = -1
	pr := startPage(t, "refusals", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
		"PAGE_JUNK": junk, "PAGE_BACKED": backed, "PAGE_FILE": one, "PAGE_FILE2": two,
	}, map[string]action{
		"tickets": func([]byte) any {
			ticketsAtCheck = s.ticketsIssued(t)
			return map[string]float64{"issued": ticketsAtCheck}
		},
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		NotQcow2   uploadRow       `json:"notQcow2"`
		Backed     uploadRow       `json:"backed"`
		RefusedRow map[string]bool `json:"refusedRow"`
		Dismissed  struct {
			Tabs int      `json:"tabs"`
			Left []string `json:"left"`
		} `json:"dismissed"`
		Rows   []uploadRow `json:"rows"`
		Listed pageImages  `json:"listed"`
		Full   struct {
			InputDisabled bool   `json:"inputDisabled"`
			StartDisabled bool   `json:"startDisabled"`
			Sentence      string `json:"sentence"`
			DescribedBy   string `json:"describedBy"`
		} `json:"full"`
	}
	pr.wait(&rep)
	if r := rep.RefusedRow; r["bar"] || r["numbers"] || !r["dismiss"] {
		t.Errorf("a row refused before any byte shows %v; want no bar, no numbers, a Dismiss button", r)
	}
	if d := rep.Dismissed; d.Tabs == 0 || slices.Contains(d.Left, filepath.Base(junk)) || !slices.Contains(d.Left, filepath.Base(backed)) {
		t.Errorf("after Enter on Dismiss (reached with %d Tabs) the rows are %q; want %s gone, %s kept", d.Tabs, d.Left, filepath.Base(junk), filepath.Base(backed))
	}
	// At the quota the page closes the file input before any file is
	// chosen, and says why and what frees a place.
	if f := rep.Full; !f.InputDisabled || !f.StartDisabled || !strings.Contains(f.Sentence, "1 of 1") ||
		!strings.Contains(f.Sentence, "remove an image") || !strings.Contains(f.DescribedBy, "upload-full") {
		t.Errorf("at 1 of 1 images the upload form is %+v; want the input and Upload disabled, a sentence (described-by) saying 1 of 1 and to remove an image", f)
	}
	if ticketsAtCheck != 0 {
		t.Errorf("%v tickets were issued for files the browser can tell are no upload, want 0", ticketsAtCheck)
	}
	for _, tc := range []struct {
		row          uploadRow
		reason, word string
	}{{rep.NotQcow2, "notQcow2", "qcow2"}, {rep.Backed, "backingFile", "backing"}} {
		if tc.row.State != "refused" || tc.row.Reason != tc.reason || tc.row.UploadID != "" ||
			!strings.Contains(strings.ToLower(tc.row.Status), tc.word) || strings.TrimSpace(tc.row.Status) == tc.reason {
			t.Errorf("the row is %+v; want refused %s, no upload id, in words mentioning %q", tc.row, tc.reason, tc.word)
		}
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("report has %d rows, want 2", len(rep.Rows))
	}
	var stored uploadRow
	var storedBytes []byte
	var storedFile string
	quota := 0
	for i, r := range rep.Rows {
		switch {
		case r.State == "done":
			stored, storedBytes, storedFile = r, [][]byte{b1, b2}[i], []string{one, two}[i]
		case r.State == "refused" && r.Reason == "imageQuota" && r.Status != "" && r.Status != "imageQuota":
			quota++
		default:
			t.Errorf("row %+v; want one done and one refused imageQuota in words", r)
		}
	}
	if stored.State != "done" || quota != 1 {
		t.Fatalf("of two files with a quota of one, %+v; want one done, one imageQuota", rep.Rows)
	}
	wantDone(t, stored)
	wantImage(t, s, stored.UploadID, storedBytes)
	wantListed(t, rep.Listed, storedFile, storedBytes, stored.UploadID)
	if q := rep.Listed.Quota; q == nil || q.Used != "1" || q.Limit != "1" || !strings.Contains(q.Text, "1 of 1") {
		t.Errorf("#image-quota is %+v; want 1 of 1 (data-used 1, data-limit 1)", rep.Listed.Quota)
	}
	if st := s.status(t, s.token); len(st.Images) != 1 {
		t.Errorf("status lists %d images, want 1", len(st.Images))
	}
}

// TestPageOrder: the dev box orders two replicas of a catalogue system
// from a host's offer on the page; Stripe Checkout (the fake's URL) opens
// in a new tab; the test pays it at the fake and posts the signed webhook;
// after #refresh the machine is listed paid with its two replicas and its
// address; the fake cluster (kubeFake) runs one replica and imports the
// other's disk, and after #refresh the page shows running and importing
// with CDI's progress.
func TestPageOrder(t *testing.T) {
	t.Parallel()
	browserDir(t)
	const account = "acct_pageHost1"
	// serve's default --checkout-return-url is this very page.
	m := startKubeMarket(t, account, "--vms-domain", "vms.example.org")
	s, kube, fake := m.s, m.kube, m.stripe
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	userMark := "page-user-data-" + rand.Text()
	s.secret(userMark)

	var sessionID, orderID string
	pr := startPage(t, "order", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_LISTING": l.ListingID,
		"PAGE_IMAGE": "debian-13", "PAGE_USER_DATA": "# " + userMark,
	}, map[string]action{
		// Paid at Stripe: the fake marks the session paid and signs the
		// event Stripe would post.
		"pay": func(body []byte) any {
			var req struct {
				CheckoutURL string `json:"checkout_url"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			id, ok := strings.CutPrefix(req.CheckoutURL, "https://checkout.stripe.test/c/pay/")
			cs, found := fake.Session(id)
			if !ok || !found {
				t.Fatalf("the tab opened %q, not the checkout of a session of the fake Stripe", req.CheckoutURL)
			}
			sessionID, orderID = cs.ID, cs.OrderID
			// KubeVirt and CDI, played by the fake cluster: the first
			// replica runs, the second's disk is being imported. Arranged
			// before the payment, whose provisioning pass reads them.
			kube.setVMStatus("", "vm-"+orderID+"-0", "Running")
			kube.setVMStatus("", "vm-"+orderID+"-1", "Provisioning")
			kube.putDataVolume("", "vm-"+orderID+"-1-disk", "ImportInProgress", "42.5%")
			m.pay(t, orderID, "evt_page_paid")
			return map[string]string{"order_id": cs.OrderID}
		},
		// The page has seen the order paid: the test waits (bounded) until
		// the provisioner has read the cluster, and tells the script
		// what #refresh must show.
		"kube": func([]byte) any {
			want := map[string]string{"vm-" + orderID + "-0": "running", "vm-" + orderID + "-1": "importing"}
			var got []string
			poll(t, 400, 25*time.Millisecond, "the provisioner to report the cluster's states", func() bool {
				st := marketStatusOf(t, s, &answers{}, s.token)
				got = got[:0]
				n := 0
				for _, o := range st.Orders {
					for _, r := range o.Replicas {
						got = append(got, r.Name+"="+r.State)
						if want[r.Name] == r.State {
							n++
						}
					}
				}
				return n == len(want)
			}, func() string { return fmt.Sprint(got) })
			return map[string]any{"replicas": want}
		},
	})
	pr.extra = s.logs
	type orderRow struct {
		State     string `json:"state"`
		Name      string `json:"name"`
		StateText string `json:"stateText"`
		Address   string `json:"address"`
		Expires   string `json:"expires"`
		Note      string `json:"note"`
		Meta      string `json:"meta"`
		Replicas  []struct {
			Replica   string   `json:"replica"`
			State     string   `json:"state"`
			Name      string   `json:"name"`
			StateText string   `json:"stateText"`
			Consoles  []string `json:"consoles"`
		} `json:"replicas"`
	}
	var rep struct {
		commonReport
		Offer       *string  `json:"offer"`
		Catalogue   []string `json:"catalogue"`
		CheckoutTab string   `json:"checkoutTab"`
		Link        struct {
			Href   string `json:"href"`
			Target string `json:"target"`
			Rel    string `json:"rel"`
		} `json:"link"`
		BeforePay struct {
			Order     string `json:"order"`
			State     string `json:"state"`
			StateText string `json:"stateText"`
		} `json:"beforePay"`
		AfterPay      orderRow       `json:"afterPay"`
		AfterKube     *orderRow      `json:"afterKube"`
		PhoneOverflow int            `json:"phoneOverflow"`
		Heights       map[string]int `json:"heights"`
		DemoBanner    bool           `json:"demoBanner"`
		LayoutBefore  pageLayout     `json:"layoutBefore"`
		LayoutAfter   pageLayout     `json:"layoutAfter"`
		Store         pageStorage    `json:"store"`
	}
	pr.wait(&rep)

	if rep.Offer == nil || !strings.Contains(*rep.Offer, "6.00") {
		t.Errorf("the offer row is %v; want the listing at 6.00", rep.Offer)
	}
	if len(rep.Catalogue) == 0 || !strings.Contains(strings.Join(rep.Catalogue, " "), "debian-13") {
		t.Errorf("the catalogue lists %q; want debian-13 among them", rep.Catalogue)
	}
	sessions := fake.Sessions()
	if len(sessions) != 1 || sessions[0].ID != sessionID {
		t.Fatalf("the fake Stripe has %d sessions (%+v), want the one the tab opened", len(sessions), sessions)
	}
	cs := sessions[0]
	if cs.Quantity != 2 || cs.UnitAmount != 600 || cs.Destination != account {
		t.Errorf("checkout %+v; want 2 × 600 to %s", cs, account)
	}
	want := "https://checkout.stripe.test/c/pay/" + cs.ID
	if rep.CheckoutTab != want || rep.Link.Href != want || rep.Link.Target != "_blank" || !strings.Contains(rep.Link.Rel, "noopener") {
		t.Errorf("the new tab opened %q, #order-checkout is %+v; want %s, target _blank, rel noopener", rep.CheckoutTab, rep.Link, want)
	}
	for k, vs := range cs.Form {
		for _, v := range vs {
			if strings.Contains(v, userMark) {
				t.Errorf("the user data went to Stripe in %s", k)
			}
		}
	}
	o := rep.AfterPay
	if rep.BeforePay.State != "awaitingPayment" || rep.BeforePay.Order != orderID {
		t.Errorf("before the payment the machine list shows %+v; want order %s awaitingPayment", rep.BeforePay, orderID)
	}
	// paid, or active once the provisioner has made the machines.
	if (o.State != "paid" && o.State != "active") || o.Name != "web" || len(o.Replicas) != 2 || o.Address != "vm-"+orderID+".vms.example.org" || o.StateText == "" {
		t.Errorf("after paying, the machine is %+v; want paid or active, named web, at vm-%s.vms.example.org, with 2 replicas", o, orderID)
	}
	for _, r := range o.Replicas {
		if !strings.HasPrefix(r.Replica, "vm-"+orderID+"-") || r.StateText == "" || r.Name == "" {
			t.Errorf("replica %+v; want vm-%s-…, named, its state in words", r, orderID)
		}
	}
	if k := rep.AfterKube; k == nil || len(k.Replicas) != 2 {
		t.Errorf("after #refresh the machine is %+v; want its 2 replicas with the cluster's states", rep.AfterKube)
	} else {
		for _, r := range k.Replicas {
			switch r.Replica {
			case "vm-" + orderID + "-0":
				if r.State != "running" || strings.Join(r.Consoles, ",") != "Console,Serial console" {
					t.Errorf("replica %+v; want running, with its Console and Serial console buttons", r)
				}
			case "vm-" + orderID + "-1":
				if r.State != "importing" || !strings.Contains(r.StateText, "42.5") || len(r.Consoles) != 0 {
					t.Errorf("replica %+v; want importing, with CDI's progress 42.5%% and no console buttons", r)
				}
			default:
				t.Errorf("replica %+v: not of the order", r)
			}
		}
	}
	kube.assertClean(t)
	if rep.PhoneOverflow > 0 {
		t.Errorf("at 390 px the page is %d px wider than the screen", rep.PhoneOverflow)
	}
	for k, v := range rep.Store.Local {
		if strings.Contains(v, userMark) {
			t.Errorf("localStorage[%q] keeps the user data", k)
		}
	}
	noToken(t, rep.Store, "", s.token)
	st := marketStatusOf(t, s, &answers{}, s.token)
	if len(st.Orders) != 1 || st.Orders[0].OrderID != orderID || st.Orders[0].Quantity != 2 || st.Orders[0].Image != "debian-13" {
		t.Errorf("status orders %+v; want the page's order of 2 debian-13", st.Orders)
	}
	// serve --dev with the stand-in on loopback: a trial edge, which
	// says that no money moves.
	if !rep.DemoBanner {
		t.Error("the page of a trial edge (--dev, its Stripe on loopback) did not say that no money moves")
	}
	wantOrderLayout(t, s, rep.LayoutBefore, rep.LayoutAfter, rep.Heights)
	// The browser ran in America/Los_Angeles: the page's times are UTC
	// all the same, said so, as the CLI writes them.
	if len(st.Orders) == 1 && st.Orders[0].ExpiresAt != nil {
		if want := pageUTC(*st.Orders[0].ExpiresAt); o.Expires != want || !strings.HasSuffix(o.Meta, " UTC") {
			t.Errorf("the order shows paid until %q, ordered %q; want %q, and the order time in UTC", o.Expires, o.Meta, want)
		}
	}
	if !strings.Contains(strings.ToLower(rep.BeforePay.StateText), "pay") {
		t.Errorf("an unpaid order's state reads %q; want it to say the buyer must pay", rep.BeforePay.StateText)
	}
}

// wantOrderLayout: before the order the box has nothing of its own and
// its images come first, "Your machines" last; with a machine, the machine
// comes first, in the first screen of a desktop; the not-offered list is
// folded, the catalogue an even grid; the page shorter than the 3 100 px
// (desktop) and 4 570 px (phone) measured when the layout was fixed, with room to spare
// (on a phone 4 000 px since the catalogue offers two installation ISOs and
// a running replica has its console buttons: 3 849 px measured then).
func wantOrderLayout(t *testing.T, s *server, before, after pageLayout, heights map[string]int) {
	t.Helper()
	before.above(t, "with no orders", "images", "machines")
	after.above(t, "with a machine", "machines", "images")
	after.above(t, "with a machine", "machines", "order")
	after.above(t, "with a machine", "machines", "catalogue")
	if m := after.Tops["machines"]; m == nil || *m >= after.Viewport {
		t.Errorf("with a machine, #machines starts at %s: below the first screen (%d px)", topOf(m), after.Viewport)
	}
	wantFolded(t, after, notOfferedCount(t, s))
	wantEvenCatalogue(t, after)
	if heights["desktop"] == 0 || heights["desktop"] > 2700 || heights["phone"] == 0 || heights["phone"] > 4000 {
		t.Errorf("the signed-in page is %d px tall on a desktop and %d on a phone; want at most 2700 and 4000", heights["desktop"], heights["phone"])
	}
	t.Logf("the signed-in page with one machine: %d px on a desktop (1280 × 900), %d on a phone (390 × 844)", heights["desktop"], heights["phone"])
}

// notOfferedCount is how many systems the edge's catalogue says it does
// not offer.
func notOfferedCount(t *testing.T, s *server) int {
	t.Helper()
	resp, err := httpClient.Get(s.ctlBase + "/market/vm-images")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct {
		NotOffered []json.RawMessage `json:"not_offered"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || len(c.NotOffered) == 0 {
		t.Fatalf("GET /market/vm-images: %v, %d not offered", err, len(c.NotOffered))
	}
	return len(c.NotOffered)
}

// TestPageUnavailable: a tenant the market does not serve (made with
// 'tenant add' and no flags: it does not share, status says notSharing)
// reads why in a sentence and sees no forms.
func TestPageUnavailable(t *testing.T) {
	t.Parallel()
	browserDir(t)
	work := t.TempDir()
	s := startPageServe(t, filepath.Join(work, "data"), nil, nil)
	r := vmshelf(t, "tenant", "add", "box1", "--data-dir", s.dataDir)
	if r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	token := strings.TrimSuffix(r.stdout, "\n")
	s.secret(token)
	st := s.status(t, token)
	if st.Available || st.Reason == "" {
		t.Fatalf("box1's status: available %v reason %q; want false with a reason", st.Available, st.Reason)
	}

	pr := startPage(t, "unavailable", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": token,
	}, nil)
	pr.extra = s.logs
	var rep unavailableReport
	pr.wait(&rep)
	if rep.Hidden == nil || *rep.Hidden || !rep.Visible["unavailable"] || rep.Reason != st.Reason {
		t.Errorf("#unavailable: hidden %v, visible %v, data-reason %q; want shown with %s", rep.Hidden, rep.Visible["unavailable"], rep.Reason, st.Reason)
	}
	if strings.Contains(rep.Text, st.Reason) {
		t.Errorf("#unavailable says %q: the code %s, not words", rep.Text, st.Reason)
	}
	if len(strings.Fields(rep.Text)) < 4 || regexp.MustCompile(`^\w+$`).MatchString(rep.Text) {
		t.Errorf("#unavailable says %q; want the reason in a sentence", rep.Text)
	}
	for _, id := range []string{"upload-file", "upload-start", "order-form", "listing-form"} {
		if rep.Visible[id] {
			t.Errorf("#%s shows although the market is not available to the tenant", id)
		}
	}
}

// unavailableReport is unavailable.mjs's: the notice, which parts show,
// and where the sections stand.
type unavailableReport struct {
	commonReport
	Hidden  *bool           `json:"hidden"`
	Reason  string          `json:"reason"`
	Text    string          `json:"text"`
	Visible map[string]bool `json:"visible"`
	Layout  pageLayout      `json:"layout"`
}

// TestPageNotOffered: a sharing box on an edge without machines (serve
// without --vms-enable: status says notOffered) reads why in words meant
// for a box's owner, not in the flags of the edge's operator, and its
// machines come before a catalogue it cannot order from.
func TestPageNotOffered(t *testing.T) {
	t.Parallel()
	browserDir(t)
	s := startPageServe(t, filepath.Join(t.TempDir(), "data"), nil, nil)
	if st := s.status(t, s.token); st.Available || st.Reason != "notOffered" {
		t.Fatalf("the dev box's status: available %v reason %q; want false, notOffered", st.Available, st.Reason)
	}
	pr := startPage(t, "unavailable", 60*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
	}, nil)
	pr.extra = s.logs
	var rep unavailableReport
	pr.wait(&rep)
	if !rep.Visible["unavailable"] || rep.Reason != "notOffered" {
		t.Errorf("#unavailable: visible %v, data-reason %q; want shown with notOffered", rep.Visible["unavailable"], rep.Reason)
	}
	if regexp.MustCompile(`--[a-z]|vms-enable|notOffered`).MatchString(rep.Text) || !strings.Contains(rep.Text, "operator") {
		t.Errorf("#unavailable says %q; want plain words for a box's owner (who turns machines on, no flag)", rep.Text)
	}
	if rep.Visible["order-form"] || rep.Layout.Tops["order"] != nil {
		t.Errorf("the order form shows on an edge without machines")
	}
	rep.Layout.above(t, "without machines", "machines", "catalogue")
	rep.Layout.above(t, "without machines", "images", "machines")
}

// TestPageCheckoutURL: the page puts the edge's checkout_url into a link
// and a tab only if it is an https URL, or http on a loopback host (a
// development edge's fake Stripe): a javascript: or data: URL, or plain
// http to another host, opens no tab and is no href anywhere on the page;
// the order's result and its card say in words that the address is not
// used. The test rewrites the edge's answers in the browser (the edge
// itself only relays what Stripe answered).
func TestPageCheckoutURL(t *testing.T) {
	t.Parallel()
	browserDir(t)
	key, _ := stripeTestSecrets()
	const account = "acct_pageHostUrl"
	fake, err := stripetest.New(key, map[string]string{account: "active"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL},
		append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key)...)
	s.secret(key)
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	bad := []string{"javascript:alert(document.domain)", "http://checkout.example.org/pay"}
	good := "http://127.0.0.1:9/c/pay/cs_test_loopback"
	badJSON, _ := json.Marshal(bad)
	pr := startPage(t, "checkouturl", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_LISTING": l.ListingID,
		"PAGE_BAD_URLS": string(badJSON), "PAGE_GOOD_URL": good,
	}, nil)
	pr.extra = s.logs
	type result struct {
		State, Reason, OrderID, Text, URL string
		Opened                            []string
	}
	var rep struct {
		commonReport
		Results  []result `json:"results"`
		Hrefs    []string `json:"hrefs"`
		Machines []struct {
			Order, Pay, Refused string
		} `json:"machines"`
	}
	pr.wait(&rep)
	if len(rep.Results) != len(bad)+1 {
		t.Fatalf("%d orders placed on the page, want %d: %+v", len(rep.Results), len(bad)+1, rep.Results)
	}
	byOrder := map[string]string{}
	for _, r := range rep.Results {
		byOrder[r.OrderID] = r.URL
		if r.URL == good {
			if r.State != "placed" || len(r.Opened) != 1 || r.Opened[0] != good {
				t.Errorf("order with checkout_url %q: %+v; want placed and the URL opened in a tab", r.URL, r)
			}
			continue
		}
		if r.State != "refused" || r.Reason != "badCheckoutURL" || r.OrderID == "" || len(r.Opened) != 0 ||
			!strings.Contains(r.Text, "not an https address") {
			t.Errorf("order with checkout_url %q: %+v; want refused badCheckoutURL in words, the order named, no tab", r.URL, r)
		}
	}
	for _, h := range rep.Hrefs {
		for _, b := range bad {
			if h == b {
				t.Errorf("the page has a link to %q", h)
			}
		}
	}
	if len(rep.Machines) != len(bad)+1 {
		t.Fatalf("machines %+v, want %d", rep.Machines, len(bad)+1)
	}
	for _, m := range rep.Machines {
		want := byOrder[m.Order]
		switch {
		case want == good && (m.Pay != good || m.Refused != ""):
			t.Errorf("machine %+v: want a pay link to %s", m, good)
		case want != good && (m.Pay != "" || !strings.Contains(m.Refused, "not an https address")):
			t.Errorf("machine %+v (checkout_url %q): want no pay link and the refusal in words", m, want)
		}
	}
}
