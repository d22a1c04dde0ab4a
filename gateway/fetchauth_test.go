package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The fetch route's header form: /market/vm-images/fetch/{upload_id} with
// the fetch token in Authorization, as CDI sends it from a Secret.

// imageURL is the header form's URL of an image: it names only the image.
func (e *env) imageURL(uploadID string) string { return e.base + fetchPrefix + uploadID }

// basic is the Authorization value of `curl -u user:token`; the encoded
// form is a capability too, so the log checks look for it.
func (e *env) basic(user, token string) string {
	cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + token))
	e.remember(cred)
	return "Basic " + cred
}

// withAuth is hdr plus an Authorization header, if auth is set; hdr is not
// changed.
func withAuth(auth string, hdr ...string) []string {
	out := append([]string(nil), hdr...)
	if auth != "" {
		out = append(out, "Authorization", auth)
	}
	return out
}

// TestFetchHeaderForm: the token as Bearer or as the basic-auth password on
// the upload-id URL gets the same answers as the path form, header for
// header and byte for byte: whole, HEAD, ranges, If-Range, 416, 304.
func TestFetchHeaderForm(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	id, data := e.stored(makeImage(t, "64M"))
	rec, err := e.st.Image(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	pathURL := e.fetchURL(id, time.Hour)
	token := capabilityOf(pathURL)
	size := len(data)
	etag := `"` + rec.SHA256 + `"`

	forms := []struct{ name, url, auth string }{
		{"path form", pathURL, ""}, // first: the answer the others must equal
		{"Bearer", e.imageURL(id), "Bearer " + token},
		{"bearer in lower case", e.imageURL(id), "bearer " + token},
		{"basic, curl -u anyuser:TOKEN", e.imageURL(id), e.basic("anyuser", token)},
		{"basic, empty user", e.imageURL(id), e.basic("", token)},
		// The path form ignores headers: a token there is the capability.
		{"path form with a stray Authorization", pathURL, "Bearer " + strings.Repeat("0", 64)},
	}
	requests := []struct {
		name, method string
		hdr          []string
		status       int
		off, n       int // the bytes of the image in the body
		slot         bool
	}{
		{"GET", "GET", nil, 200, 0, size, true},
		{"HEAD", "HEAD", nil, 200, 0, 0, false},
		{"Range", "GET", []string{"Range", "bytes=1000-66535"}, 206, 1000, 65536, true},
		{"suffix Range", "GET", []string{"Range", "bytes=-100"}, 206, size - 100, 100, true},
		{"If-Range current", "GET", []string{"Range", "bytes=10-19", "If-Range", etag}, 206, 10, 10, true},
		{"If-Range stale", "GET", []string{"Range", "bytes=10-19", "If-Range", `"other"`}, 200, 0, size, true},
		{"416", "GET", []string{"Range", fmt.Sprintf("bytes=%d-", size)}, 416, 0, 0, false},
		{"If-None-Match", "GET", []string{"If-None-Match", etag}, 304, 0, 0, false},
	}
	compared := []string{"Content-Length", "Accept-Ranges", "ETag", "Last-Modified", "Content-Type",
		"Cache-Control", "Content-Range", "WWW-Authenticate"}
	var sent int64
	slots := 0
	for _, rq := range requests {
		t.Run(rq.name, func(t *testing.T) {
			var want http.Header
			for _, f := range forms {
				resp, b := get(t, rq.method, f.url, withAuth(f.auth, rq.hdr...)...)
				if resp.StatusCode != rq.status {
					t.Fatalf("%s: status %d %.200q, want %d", f.name, resp.StatusCode, b, rq.status)
				}
				switch rq.status {
				case 200, 206:
					if !bytes.Equal(b, data[rq.off:rq.off+rq.n]) {
						t.Errorf("%s: %d bytes, not bytes %d..+%d of the image", f.name, len(b), rq.off, rq.n)
					}
				case 416:
					if reason := errorOf(t, bytes.NewReader(b)).Reason; reason != "rangeNotSatisfiable" {
						t.Errorf("%s: 416 %s", f.name, reason)
					}
				}
				if rq.slot {
					slots++
					sent += int64(rq.n)
				}
				if want == nil {
					want = resp.Header
					continue
				}
				for _, k := range compared {
					if got := resp.Header.Values(k); fmt.Sprint(got) != fmt.Sprint(want.Values(k)) {
						t.Errorf("%s: %s %q, the path form's %q", f.name, k, got, want.Values(k))
					}
				}
			}
		})
	}
	for range slots {
		e.waitSlotFreed(dirFetch)
	}
	if got := fetchedBytes(e); got != float64(sent) {
		t.Errorf("fetch bytes metric %v, want %d", got, sent)
	}
	e.assertNothingLeft(id)
}

// TestFetchHeaderFormRefusals: without a usable Authorization the header
// form is 401 with a challenge, and costs no miss; a token that is unknown,
// malformed, expired, revoked or of another image is 404 tokenUnknown and
// a miss, in one budget with the path form's; past the budget a valid
// token is still served, in both forms, and only misses get 429.
func TestFetchHeaderFormRefusals(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	const budget = 9 // the 404 rows below
	e := newEnv(t, func(c *Config) { c.MissBurst = budget; c.MissEvery = time.Hour })
	id, data := e.stored(img)
	other, _ := e.stored(img)
	gone, _ := e.stored(img)
	good := capabilityOf(e.fetchURL(id, time.Hour))
	expired := capabilityOf(e.fetchURL(id, time.Minute))
	othersToken := capabilityOf(e.fetchURL(other, time.Hour))
	revoked := capabilityOf(e.fetchURL(gone, time.Hour))
	e.clock.Advance(2 * time.Minute)
	if err := e.st.RemoveImage(context.Background(), e.tenant.ID, gone); err != nil {
		t.Fatal(err)
	}
	if err := e.blobs.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}

	unauthorized := []struct{ name, auth string }{
		{"no Authorization", ""},
		{"Bearer without a token", "Bearer "},
		{"another scheme", "Token " + good},
		{"the token alone", good},
		{"basic, not base64", "Basic !!" + good},
		{"basic without a colon", "Basic " + base64.StdEncoding.EncodeToString([]byte(good))},
		{"basic with an empty password", e.basic(good, "")},
	}
	for _, c := range unauthorized {
		resp, b := get(t, "GET", e.imageURL(id), withAuth(c.auth)...)
		if resp.StatusCode != 401 || errorOf(t, bytes.NewReader(b)).Reason != "unauthorized" {
			t.Errorf("%s: %d %.200q, want 401 unauthorized", c.name, resp.StatusCode, b)
		}
		if ch := resp.Header.Values("WWW-Authenticate"); len(ch) == 0 || !strings.HasPrefix(ch[0], "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge first", c.name, ch)
		}
	}
	if resp, b := get(t, "HEAD", e.imageURL(id)); resp.StatusCode != 401 || len(b) != 0 {
		t.Errorf("HEAD without Authorization: %d, %d bytes, want 401 without a body", resp.StatusCode, len(b))
	}

	// None of those spent the budget: each of these is a 404 and a miss.
	unknown := []struct{ name, url, auth string }{
		{"unknown token", e.imageURL(id), "Bearer " + imagestore.NewSecret()},
		{"unknown token as password", e.imageURL(id), e.basic("x", imagestore.NewSecret())},
		{"malformed token", e.imageURL(id), "Bearer nothex"},
		{"token in upper case", e.imageURL(id), "Bearer " + strings.ToUpper(good)},
		{"expired token", e.imageURL(id), "Bearer " + expired},
		{"another image's token", e.imageURL(id), "Bearer " + othersToken},
		{"another image's token as password", e.imageURL(id), e.basic("x", othersToken)},
		{"revoked token of a removed image", e.imageURL(gone), "Bearer " + revoked},
		{"a path form miss, same budget", e.base + fetchPrefix + imagestore.NewSecret(), ""},
	}
	if len(unknown) != budget {
		t.Fatalf("%d 404 rows, budget %d", len(unknown), budget)
	}
	for _, c := range unknown {
		resp, b := get(t, "GET", c.url, withAuth(c.auth)...)
		if resp.StatusCode != 404 || errorOf(t, bytes.NewReader(b)).Reason != "tokenUnknown" {
			t.Errorf("%s: %d %.200q, want 404 tokenUnknown", c.name, resp.StatusCode, b)
		}
	}
	// The budget is spent: misses of either form are 429 now...
	for _, c := range []struct{ name, url, auth string }{
		{"header form", e.imageURL(id), "Bearer " + othersToken},
		{"path form", e.base + fetchPrefix + imagestore.NewSecret(), ""},
	} {
		resp, b := get(t, "GET", c.url, withAuth(c.auth)...)
		if resp.StatusCode != 429 || errorOf(t, bytes.NewReader(b)).Reason != "rateLimited" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s miss past the budget: %d %.200q, want 429 rateLimited with Retry-After", c.name, resp.StatusCode, b)
		}
	}
	// ...while the valid token is served, whichever way it comes.
	for _, auth := range []string{"Bearer " + good, e.basic("anyuser", good)} {
		if resp, b := get(t, "GET", e.imageURL(id), "Authorization", auth); resp.StatusCode != 200 || !bytes.Equal(b, data) {
			t.Fatalf("valid token (%.6s…) past the budget: %d, %d bytes, want 200 and the image", auth, resp.StatusCode, len(b))
		}
		e.waitSlotFreed(dirFetch)
		if resp, _ := get(t, "HEAD", e.imageURL(id), "Authorization", auth); resp.StatusCode != 200 {
			t.Errorf("HEAD with the valid token past the budget: %d, want 200", resp.StatusCode)
		}
	}
	if resp, b := get(t, "GET", e.base+fetchPrefix+good); resp.StatusCode != 200 || !bytes.Equal(b, data) {
		t.Fatalf("valid token in the path past the budget: %d, %d bytes", resp.StatusCode, len(b))
	}
	e.waitSlotFreed(dirFetch)
	if resp, _ := get(t, "POST", e.imageURL(id), "Authorization", "Bearer "+good); resp.StatusCode != 405 {
		t.Errorf("POST to the header form: %d, want 405", resp.StatusCode)
	}
	if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirFetch, "unauthorized")); got != float64(len(unauthorized)+1) {
		t.Errorf("rejections{unauthorized} = %v, want %d", got, len(unauthorized)+1)
	}
	e.assertNothingLeft(id, other)
}

// TestFetchHeaderFormSharesSlot: the slot belongs to the token, not to the
// URL: while a whole GET of the header form holds the only slot, range
// reads of the same token in either form share it; another token's GET
// waits and gets 503, its HEAD needs no slot.
func TestFetchHeaderFormSharesSlot(t *testing.T) {
	needQemu(t)
	big := makeBigImage(t)
	// The holder stops reading for the whole test: the idle timeout must
	// not cut it on 2 loaded cores.
	e := newEnv(t, func(c *Config) {
		c.MaxTransfers = 1
		c.FetchQueueWait = 200 * time.Millisecond
		c.IdleTimeout = waitBound
	})
	id, data := e.stored(big)
	pathURL := e.fetchURL(id, time.Hour)
	token := capabilityOf(pathURL)
	otherToken := capabilityOf(e.fetchURL(id, time.Hour))

	finish := holdFetch(t, e.imageURL(id), data, "Authorization", "Bearer "+token)
	for _, c := range []struct{ name, url, auth string }{
		{"Bearer", e.imageURL(id), "Bearer " + token},
		{"basic", e.imageURL(id), e.basic("cdi", token)},
		{"path form", pathURL, ""},
	} {
		if r, b := get(t, "GET", c.url, withAuth(c.auth, "Range", "bytes=100-199")...); r.StatusCode != 206 || !bytes.Equal(b, data[100:200]) {
			t.Errorf("range of the holding token (%s): %d, want 206 and its bytes", c.name, r.StatusCode)
		}
	}
	if r, b := get(t, "GET", e.imageURL(id), "Authorization", "Bearer "+otherToken); r.StatusCode != 503 || errorOf(t, bytes.NewReader(b)).Reason != "busy" {
		t.Errorf("GET of another token while the slot is held: %d %.200q, want 503 busy", r.StatusCode, b)
	}
	if r, _ := get(t, "HEAD", e.imageURL(id), "Authorization", "Bearer "+otherToken); r.StatusCode != 200 {
		t.Errorf("HEAD of another token while the slot is held: %d, want 200", r.StatusCode)
	}
	finish()
	for range 4 { // three ranges and the holder
		e.waitSlotFreed(dirFetch)
	}
	e.assertNothingLeft(id)
}

// secretFile writes content to a 0600 file in the test's temp dir: how the
// real-peer tests hand a token to a tool without putting it on a command
// line.
func secretFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// curlGet runs curl with args, the body going to a file, and returns the
// status and the body. The test must have called needTool(t, "curl").
func curlGet(t *testing.T, args ...string) (int, []byte) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "body")
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	all := append([]string{"-sS", "--max-time", strconv.Itoa(int(clientBound / time.Second)), "-o", out, "-w", "%{http_code}"}, args...)
	b, err := exec.CommandContext(ctx, "curl", all...).Output()
	if err != nil {
		t.Fatalf("curl: %v (%s)", err, b)
	}
	code, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatalf("curl status %q: %v", b, err)
	}
	body, err := os.ReadFile(out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return code, body
}

// nbdkitConvert serves url as NBD with nbdkit's curl plugin, set up as
// CDI's importer sets it up (readonly, readahead and retry filters, its
// User-Agent), with the extra plugin parameters in params, then converts
// the disk with qemu-img and compares it with src.
func nbdkitConvert(t *testing.T, src, url string, params ...string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "nbd.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{"--foreground", "--readonly", "--exit-with-parent", "-U", sock,
		"--filter=readahead", "--filter=retry", "curl", "retry-exponential=no"}, params...)
	nbd := exec.CommandContext(ctx, "nbdkit", append(args, "url="+url)...)
	var nbdErr bytes.Buffer
	nbd.Stderr = &nbdErr
	if err := nbd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { nbd.Process.Kill(); nbd.Wait() }()
	waitFor(t, "nbdkit's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	out := filepath.Join(dir, "nbd.raw")
	convert := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", "nbd+unix:///?socket="+sock, out)
	if b, err := convert.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert over nbdkit: %v\n%s\nnbdkit: %s", err, b, nbdErr.String())
	}
	compareWithSource(t, src, out)
}

// TestFetchHeaderFormWithRealPeers: what CDI's importer runs against the
// upload-id URL, with the token only in Authorization: nbdkit's curl
// plugin under qemu-img (with a header, as secretExtraHeaders give it, and
// with user and password, as a secretRef gives it), and curl both ways.
//
// CDI itself passes the header as nbdkit's header= parameter. The tests
// hand it over header-script= (a command printing the header lines, here
// reading a 0600 file) and password=+FILE instead, so that no token is on
// a command line; libcurl sends the same requests either way.
func TestFetchHeaderFormWithRealPeers(t *testing.T) {
	needQemu(t)
	needTool(t, "nbdkit", "curl")
	src := makeImage(t, "64M")
	e := newEnv(t, nil)
	id, data := e.stored(src)
	token := capabilityOf(e.fetchURL(id, time.Hour))
	e.basic("cdi", token) // what libcurl encodes: the log must not hold it
	url := e.imageURL(id)

	t.Run("nbdkit curl header-script, Bearer", func(t *testing.T) {
		headers := secretFile(t, "headers", "User-Agent: cdi-nbdkit-importer\nAuthorization: Bearer "+token+"\n")
		nbdkitConvert(t, src, url, "header-script=cat "+headers)
	})
	t.Run("nbdkit curl user and password", func(t *testing.T) {
		pw := secretFile(t, "password", token)
		nbdkitConvert(t, src, url, "header=User-Agent: cdi-nbdkit-importer", "user=cdi", "password=+"+pw)
	})
	t.Run("curl -H @file", func(t *testing.T) {
		h := secretFile(t, "headers", "Authorization: Bearer "+token+"\n")
		if code, b := curlGet(t, "-H", "@"+h, url); code != 200 || !bytes.Equal(b, data) {
			t.Fatalf("curl -H @file: %d, %d bytes, want 200 and the image", code, len(b))
		}
		if code, b := curlGet(t, "-H", "@"+h, "-r", "65536-65599", url); code != 206 || !bytes.Equal(b, data[65536:65600]) {
			t.Fatalf("curl -H @file -r: %d, %d bytes, want 206 and 64 bytes", code, len(b))
		}
	})
	t.Run("curl -u anyuser:TOKEN from a config file", func(t *testing.T) {
		// -K: curl's config file, so that -u's secret is not on the command line.
		cfg := secretFile(t, "curlrc", `user = "anyuser:`+token+`"`+"\n")
		if code, b := curlGet(t, "-K", cfg, url); code != 200 || !bytes.Equal(b, data) {
			t.Fatalf("curl -u: %d, %d bytes, want 200 and the image", code, len(b))
		}
	})
	t.Run("curl without credentials", func(t *testing.T) {
		code, b := curlGet(t, url)
		if code != 401 || errorOf(t, bytes.NewReader(b)).Reason != "unauthorized" {
			t.Fatalf("curl without credentials: %d %.200q, want 401 unauthorized", code, b)
		}
	})
}

// assertNotLogged checks that no 16-character piece of secret is in the
// gateway's log: a leak of a part is a leak.
func (e *env) assertNotLogged(what, secret string) {
	e.t.Helper()
	log := e.log.String()
	for i := 0; i+16 <= len(secret); i++ {
		if strings.Contains(log, secret[i:i+16]) {
			e.t.Errorf("the log holds part of the %s (%q):\n%s", what, secret[i:i+16], log)
			return
		}
	}
}

// TestFetchAuthorizationNotLogged: the token in an Authorization header
// reaches no log line: not the refusal lines of the header form, not a
// fetch's line, and not the request head fasthttp quotes when it cannot
// parse one (its own line and the refusal line of our ErrorHandler), also
// when its snippet of a long head cuts the header's name off.
func TestFetchAuthorizationNotLogged(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	id, _ := e.stored(makeImage(t, "64M"))
	token := capabilityOf(e.fetchURL(id, time.Hour))
	basicAuth := e.basic("anyuser", token)
	cred := strings.TrimPrefix(basicAuth, "Basic ")
	other := imagestore.NewSecret()
	e.remember(other)
	otherBasic := e.basic("anyuser", other)

	// Answers of every kind, each logged one way or another.
	for _, c := range []struct {
		method, auth string
		want         int
	}{
		{"GET", "Bearer " + token, 200},
		{"GET", basicAuth, 200},
		{"HEAD", basicAuth, 200},
		{"GET", "Bearer " + other, 404},
		{"GET", otherBasic, 404},
		{"GET", "Token " + token, 401},
	} {
		if resp, _ := get(t, c.method, e.imageURL(id), "Authorization", c.auth); resp.StatusCode != c.want {
			t.Fatalf("%s %.12s…: %d, want %d", c.method, c.auth, resp.StatusCode, c.want)
		}
		if c.method == "GET" && c.want == 200 {
			e.waitSlotFreed(dirFetch)
		}
	}

	// A head fasthttp cannot parse (a line without a colon), carrying the
	// token both ways.
	head := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nAuthorization: Bearer %s\r\nno colon here",
		fetchPrefix+id, basicAuth, token)
	if resp, _ := openRaw(t, e.base, head).answer("a broken head with credentials"); resp.StatusCode != 400 {
		t.Fatalf("broken head: %d, want 400", resp.StatusCode)
	}
	for _, line := range []string{
		e.logHas("component=fasthttp", "error when reading request headers", "no colon here"),
		e.logHas("msg=refused", "reason=badRequest", "no colon here"),
	} {
		if strings.Count(line, "Authorization: [redacted]") != 2 || strings.Contains(line, "Bearer") || strings.Contains(line, "Basic") {
			t.Errorf("a line quoting the broken head does not show its two Authorization headers as [redacted]: %s", line)
		}
	}

	// A long head: fasthttp quotes its first and last 200 bytes only. The
	// header's name falls in the gap, the end of the credential into the
	// last 200 bytes.
	long := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\nAuthorization: %s\r\nX-Pad2: %s\r\nno colon",
		fetchPrefix+id, strings.Repeat("p-", 150), basicAuth, strings.Repeat("q-", 60))
	if resp, _ := openRaw(t, e.base, long).answer("a long broken head"); resp.StatusCode != 400 {
		t.Fatalf("long broken head: %d, want 400", resp.StatusCode)
	}
	e.logHas("component=fasthttp", "q-q-q-q-")
	e.logHas("msg=refused", "q-q-q-q-")

	e.stop() // the shutdown's lines too
	e.assertNotLogged("fetch token", token)
	e.assertNotLogged("basic-auth credential", cred)
	e.assertNotLogged("other basic-auth credential", strings.TrimPrefix(otherBasic, "Basic "))
}
