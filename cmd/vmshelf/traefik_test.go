package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/vmshelf/vmshelf/internal/testkit/traefiktest"
	"github.com/vmshelf/vmshelf/provisioner"
)

// vmshelf behind a real Traefik set up as docs/deploy sets k3s's: Traefik's
// static arguments are those its Helm chart makes of the kit's values
// (base/traefik-k3s.yaml; rke2's are the same but for the Service, which
// provisioner/kubetest holds), it routes as Traefik's Ingress provider
// routes the kit's Ingresses (base/ingress.yaml) on their hosts, and serve
// runs with the kit's image-hosting flags (base/vmshelf.yaml), Traefik's
// address in place of its pod network. What stands in for the cluster:
// loopback ports for the Services, the test's certificate for Let's
// Encrypt's, a directory for Traefik's volume.

// The client's and the proxy's loopback addresses: the tests' clients
// connect to Traefik from traefikClient, and Traefik to serve from
// 127.0.0.1, which serve trusts as the kit trusts Traefik's pods.
var traefikClient = netip.MustParseAddr("127.0.0.2")

const traefikProxy = "127.0.0.1/32"

// traefikEdge is serve behind the kit's Ingresses.
type traefikEdge struct {
	s                 *server
	routes            traefiktest.HTTP
	dataHost, ctlHost string
}

// startTraefikEdge starts serve with the kit's image-hosting flags (and
// extra) and works out the routes to it.
func startTraefikEdge(t *testing.T, extra ...string) *traefikEdge {
	t.Helper()
	traefiktest.Path(t) // before serve starts: a missing Traefik is said first
	c := kitHostingDeployment(t).Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--data-dir", "--data-addr", "--control-addr": // the pod's
		case "--trusted-proxies":
			args = append(args, name+"="+traefikProxy)
		default:
			args = append(args, a)
		}
	}
	s := startServe(t, filepath.Join(t.TempDir(), "data"), append(args, extra...))
	ings := kitObjects[networkingv1.Ingress](t, "base/ingress.yaml", "Ingress")
	routes, err := traefiktest.Routes(ings, map[string]string{"vmshelf-data:8480": s.dataAddr, "vmshelf-control:8481": s.ctlAddr})
	if err != nil {
		t.Fatal(err)
	}
	e := &traefikEdge{s: s, routes: routes}
	for _, ing := range ings {
		switch ing.Name {
		case "vmshelf-data":
			e.dataHost = ing.Spec.Rules[0].Host
		case "vmshelf-control":
			e.ctlHost = ing.Spec.Rules[0].Host
		}
	}
	if e.dataHost == "" || e.ctlHost == "" {
		t.Fatalf("base/ingress.yaml: data host %q, control host %q", e.dataHost, e.ctlHost)
	}
	return e
}

// traefik starts a Traefik in front of the edge: with the kit's settings,
// or with Traefik's defaults; extra are the test's own arguments after
// them. The kit's ACME resolver keeps its settings but for its CA, a closed
// loopback port, so that nothing leaves the machine (no route asks it for
// a certificate anyway).
func (e *traefikEdge) traefik(t *testing.T, kit bool, extra ...string) *traefiktest.Traefik {
	t.Helper()
	var args []string
	if kit {
		args = append(kitTraefikValues(t).Args(t.TempDir()),
			"--certificatesresolvers."+provisioner.CertResolver+".acme.caserver=https://127.0.0.1:1/directory")
	}
	return traefiktest.Start(t, traefiktest.Config{
		Args:  append(args, extra...),
		HTTP:  e.routes,
		Names: []string{e.dataHost, e.ctlHost},
		From:  traefikClient,
		Ready: "https://" + e.ctlHost + "/market/vm-images",
	})
}

// kitTraefikValues are k3s's HelmChartConfig's values, read strictly.
func kitTraefikValues(t *testing.T) traefiktest.Values {
	t.Helper()
	type helmChartConfig struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			ValuesContent string `json:"valuesContent"`
		} `json:"spec"`
	}
	hs := kitObjects[helmChartConfig](t, "base/traefik-k3s.yaml", "HelmChartConfig")
	if len(hs) != 1 || hs[0].Metadata.Name != "traefik" {
		t.Fatalf("base/traefik-k3s.yaml: %d HelmChartConfigs, want k3s's traefik alone", len(hs))
	}
	v, err := traefiktest.ParseValues(hs[0].Spec.ValuesContent)
	if err != nil {
		t.Fatalf("base/traefik-k3s.yaml: %v", err)
	}
	return v
}

// traefikCall is one request through Traefik; hdr are pairs of header
// name and value.
func traefikCall(t *testing.T, c *http.Client, method, url string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s through Traefik: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s through Traefik: %v", method, url, err)
	}
	return resp, b
}

// ticket takes an upload ticket through Traefik.
func (e *traefikEdge) ticket(t *testing.T, c *http.Client, name string) ticketAnswer {
	t.Helper()
	resp, b := traefikCall(t, c, http.MethodPost, "https://"+e.ctlHost+"/market/vm-images/ticket",
		strings.NewReader(`{"name":`+strconv.Quote(name)+`,"efi":false}`),
		"Authorization", "Bearer "+e.s.token, "Content-Type", "application/json")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("ticket through Traefik: %d %s", resp.StatusCode, b)
	}
	var tk ticketAnswer
	decode(t, b, &tk)
	e.s.secret(tk.Ticket)
	if !strings.HasPrefix(tk.UploadURL, "https://"+e.dataHost+"/") {
		t.Fatalf("upload URL %q is not on the data plane's public name %s", tk.UploadURL, e.dataHost)
	}
	return tk
}

// checkRemotes: every address serve logged is the client's own, and no
// address a request only named in a header is anywhere in its log.
func (e *traefikEdge) checkRemotes(t *testing.T, forged ...string) {
	t.Helper()
	logs := e.s.logs()
	remotes := map[string]int{}
	for _, m := range regexp.MustCompile(`\bremote=(\S+)`).FindAllStringSubmatch(logs, -1) {
		remotes[m[1]]++
	}
	var leaked []string
	for _, f := range forged {
		if regexp.MustCompile(`\b` + regexp.QuoteMeta(f) + `\b`).MatchString(logs) {
			leaked = append(leaked, f)
		}
	}
	if len(remotes) != 1 || remotes[traefikClient.String()] == 0 || len(leaked) > 0 {
		t.Errorf("serve logged the remotes %v (want %s alone), and the forged addresses %q; its log:\n%s",
			remotes, traefikClient, leaked, logs)
	}
}

// TestE2ETraefikClientAddress: through Traefik with the kit's settings,
// the address serve logs and limits by is the client's, whatever the
// client writes: a hundred unknown fetch tokens, each naming another
// address in Forwarded (which Traefik passes on untouched),
// X-Forwarded-For and X-Real-Ip (which it replaces), are one client's
// misses and are limited after the budget (20, then one a second); the
// control plane logs the same client. And Expect: 100-continue passes
// Traefik: a used ticket's 410 and a 40 GB upload's 413 arrive before a
// byte of the body is sent.
func TestE2ETraefikClientAddress(t *testing.T) {
	needTool(t, "qemu-img")
	e := startTraefikEdge(t)
	tr := e.traefik(t, true)
	c := tr.Client(false)
	defer c.CloseIdleConnections()

	var forged []string
	var notFound, limited int
	start := time.Now()
	for i := range 100 {
		fwd, xff, xri := fmt.Sprintf("198.51.100.%d", i+1), fmt.Sprintf("203.0.113.%d", i+1), fmt.Sprintf("192.0.2.%d", i+1)
		forged = append(forged, fwd, xff, xri)
		resp, b := traefikCall(t, c, http.MethodGet, "https://"+e.dataHost+"/market/vm-images/fetch/"+randomHex(t, 32), nil,
			"Forwarded", "for="+fwd, "X-Forwarded-For", xff, "X-Real-Ip", xri)
		switch reason := errorReason(b); {
		case resp.StatusCode == http.StatusNotFound && reason == "tokenUnknown":
			notFound++
		case resp.StatusCode == http.StatusTooManyRequests && reason == "rateLimited":
			limited++
		default:
			t.Fatalf("miss %d: %d %s, want 404 tokenUnknown or 429 rateLimited", i+1, resp.StatusCode, b)
		}
	}
	// The budget: 20 at once, and one more for each second since.
	if budget := 20 + int(time.Since(start)/time.Second) + 1; notFound > budget || limited == 0 {
		t.Errorf("100 misses naming 100 addresses: %d answered 404, %d limited; want at most %d (one client's budget) before 429",
			notFound, limited, budget)
	}
	resp, b := traefikCall(t, c, http.MethodPost, "https://"+e.ctlHost+"/market/vm-images/ticket", strings.NewReader(`{}`),
		"Content-Type", "application/json", "Forwarded", "for=198.51.100.201", "X-Forwarded-For", "203.0.113.201")
	wantError(t, "a ticket without a token through Traefik", resp.StatusCode, b, http.StatusUnauthorized, "unauthorized")
	forged = append(forged, "198.51.100.201", "203.0.113.201")
	poll(t, 400, 25*time.Millisecond, "the control plane's refusal line", func() bool {
		return strings.Contains(e.s.logs(), "reason=unauthorized")
	})

	// A used ticket and an announced body over the limit are refused
	// before the body, Traefik in between.
	_, data := makeImage(t, t.TempDir(), "disk.qcow2")
	used := e.ticket(t, c, "used")
	resp, b = traefikCall(t, c, http.MethodPut, used.UploadURL, bytes.NewReader(data))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload through Traefik: %d %s", resp.StatusCode, b)
	}
	var got imageAnswer
	decode(t, b, &got)
	if got.SHA256 != sha256hex(data) {
		t.Errorf("upload through Traefik stored sha256 %s, want %s", got.SHA256, sha256hex(data))
	}
	large := e.ticket(t, c, "large")
	for _, tc := range []struct {
		what, url string
		length    int64
		code      int
		reason    string
	}{
		{"the used ticket", used.UploadURL, int64(len(data)), http.StatusGone, "ticketUsed"},
		{"40 GB announced", large.UploadURL, 40_000_000_000, http.StatusRequestEntityTooLarge, "tooLarge"},
	} {
		code, body := expectContinue(t, tr, e.dataHost, tc.url, tc.length)
		wantError(t, tc.what+", Expect: 100-continue through Traefik, no body sent", code, body, tc.code, tc.reason)
	}
	e.checkRemotes(t, forged...)
}

// expectContinue sends a PUT head with Expect: 100-continue over its own
// connection to Traefik and no body, and returns the answer that comes
// instead of the go-ahead: a refusal that arrives here came before any
// body byte.
func expectContinue(t *testing.T, tr *traefiktest.Traefik, host, url string, length int64) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	path := strings.TrimPrefix(url, "https://"+host)
	head := "PUT " + path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/octet-stream\r\n" +
		"Content-Length: " + strconv.FormatInt(length, 10) + "\r\nExpect: 100-continue\r\n\r\n"
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("PUT %s with Expect: 100-continue, no body: no answer: %v", path[:40], err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusContinue {
		t.Fatalf("PUT %s: 100 Continue, where a refusal should have come before the body", path[:40])
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// errorReason is the reason of an error body, or "".
func errorReason(b []byte) string {
	var e struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Reason
}

// TestE2ETraefikAccessLog: Traefik's access log, as the kit's settings
// alone write it (its standard output, the common format) and as an
// operator moves it (a file, common or JSON), holds no capability: not the
// upload ticket of a PUT or of a resumable upload's creation, not the
// session's id, not the fetch token of a GET, a range and a HEAD, not an
// unknown token. It has a line for each of those requests all the same,
// naming the client.
func TestE2ETraefikAccessLog(t *testing.T) {
	needTool(t, "qemu-img")
	e := startTraefikEdge(t, "--images-per-tenant=10")
	_, data := makeImage(t, t.TempDir(), "disk.qcow2")
	for _, format := range []string{"kit", "common", "json"} {
		t.Run(format, func(t *testing.T) {
			var tr *traefiktest.Traefik
			accessLog := filepath.Join(t.TempDir(), "access.log")
			readLog := func() string { b, _ := os.ReadFile(accessLog); return string(b) }
			if format == "kit" {
				tr = e.traefik(t, true)
				readLog = func() string { return commonLogLines(tr.Output()) }
			} else {
				tr = e.traefik(t, true, "--accesslog.filepath="+accessLog, "--accesslog.format="+format)
			}
			c := tr.Client(false)
			defer c.CloseIdleConnections()
			var secrets []string
			requests := 0
			call := func(method, url string, body io.Reader, want int, hdr ...string) (*http.Response, []byte) {
				t.Helper()
				requests++
				resp, b := traefikCall(t, c, method, url, body, hdr...)
				if resp.StatusCode != want {
					t.Fatalf("%s through Traefik: %d %s, want %d", method, resp.StatusCode, b, want)
				}
				return resp, b
			}
			tk := e.ticket(t, c, "put")
			requests++
			secrets = append(secrets, tk.Ticket)
			_, b := call(http.MethodPut, tk.UploadURL, bytes.NewReader(data), http.StatusCreated)
			var img imageAnswer
			decode(t, b, &img)

			tk = e.ticket(t, c, "tus")
			requests++
			secrets = append(secrets, tk.Ticket)
			tus := []string{"Tus-Resumable", "1.0.0"}
			resp, _ := call(http.MethodPost, tk.UploadURL, nil, http.StatusCreated, append(tus, "Upload-Length", strconv.Itoa(len(data)))...)
			session := resp.Header.Get("Location")
			id := session[strings.LastIndex(session, "/")+1:]
			if !strings.HasPrefix(session, "https://"+e.dataHost+"/") || id == "" {
				t.Fatalf("session Location %q", session)
			}
			e.s.secret(id)
			secrets = append(secrets, id)
			call(http.MethodHead, session, nil, http.StatusOK, tus...)
			call(http.MethodDelete, session, nil, http.StatusNoContent, tus...)

			r := runCmd(t, e.s.env, binPath, "fetch-url", img.UploadID, "--data-dir", e.s.dataDir)
			if r.code != 0 {
				t.Fatalf("fetch-url: %d %s", r.code, r.stderr)
			}
			fetch := strings.TrimSpace(r.stdout)
			token := fetch[strings.LastIndex(fetch, "/")+1:]
			if !hex64.MatchString(token) || !strings.HasPrefix(fetch, "https://"+e.dataHost+"/") {
				t.Fatalf("fetch-url printed %q", fetch)
			}
			e.s.secret(token)
			secrets = append(secrets, token)
			call(http.MethodGet, fetch, nil, http.StatusOK)
			call(http.MethodGet, fetch, nil, http.StatusPartialContent, "Range", "bytes=0-99")
			call(http.MethodHead, fetch, nil, http.StatusOK)
			miss := randomHex(t, 32)
			secrets = append(secrets, miss)
			call(http.MethodGet, "https://"+e.dataHost+"/market/vm-images/fetch/"+miss, nil, http.StatusNotFound)

			var lines []string
			poll(t, 400, 25*time.Millisecond, fmt.Sprintf("%d lines in Traefik's access log", requests+1), func() bool {
				lines = strings.Split(strings.TrimSpace(readLog()), "\n")
				// Each request's, and the readiness probe's.
				return len(lines) >= requests+1
			}, func() string { return tr.Output() })
			for _, l := range lines {
				for _, s := range secrets {
					if strings.Contains(l, s) {
						t.Errorf("Traefik's access log holds a capability (%.8s…): %s", s, strings.ReplaceAll(l, s, s[:8]+"…"))
					}
				}
				if !strings.Contains(l, traefikClient.String()) {
					t.Errorf("access log line without the client's address: %s", l)
				}
				if format == "json" {
					var fields map[string]any
					if err := json.Unmarshal([]byte(l), &fields); err != nil {
						t.Fatalf("access log line %q: %v", l, err)
					}
					if _, ok := fields["RequestMethod"]; !ok {
						t.Errorf("access log line without its method: %s", l)
					}
				}
			}
			if out := tr.Output(); anySecret.MatchString(out) {
				t.Errorf("Traefik's own output holds a capability-shaped string:\n%s", out)
			}
		})
	}
}

// commonLogLine is a line of an access log in the common format: the
// client's address, two fields, then the time in brackets.
var commonLogLine = regexp.MustCompile(`(?m)^\S+ \S+ \S+ \[[^]]+\] ".*$`)

// commonLogLines are the access-log lines among Traefik's output (its own
// log lines are not in that format).
func commonLogLines(out string) string {
	return strings.Join(commonLogLine.FindAllString(out, -1), "\n")
}

// TestE2ETraefikLongUpload: an upload that outlasts Traefik's default read
// timeout (an entry point ends a request it has not read within 60 s since
// Traefik v2.11.2) completes through the kit's Traefik with its SHA-256,
// over HTTP/1.1 and HTTP/2, and is cut through a Traefik without the kit's
// settings, which leaves serve nothing of it. The four run at once, each
// paced to last uploadLasting: one test of about a minute, beside the
// others.
func TestE2ETraefikLongUpload(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-img")
	const uploadLasting = 64 * time.Second
	e := startTraefikEdge(t, "--images-per-tenant=8")
	kit, bare := e.traefik(t, true), e.traefik(t, false)
	_, data := makeImage(t, t.TempDir(), "disk.qcow2")
	type upload struct {
		name    string
		tr      *traefiktest.Traefik
		h2      bool
		tk      ticketAnswer
		resp    *http.Response
		body    []byte
		err     error
		lasted  time.Duration
		refused bool // Traefik's defaults: cut
	}
	ups := []*upload{
		{name: "kit, HTTP/1.1", tr: kit}, {name: "kit, HTTP/2", tr: kit, h2: true},
		{name: "defaults, HTTP/1.1", tr: bare, refused: true}, {name: "defaults, HTTP/2", tr: bare, h2: true, refused: true},
	}
	var wg sync.WaitGroup
	for _, u := range ups {
		u.tk = e.ticket(t, kit.Client(false), u.name)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 3*uploadLasting)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.tk.UploadURL, &pacedReader{data: data, lasting: uploadLasting})
			if err != nil {
				u.err = err
				return
			}
			req.ContentLength = int64(len(data))
			c := u.tr.Client(u.h2)
			defer c.CloseIdleConnections()
			start := time.Now()
			if u.resp, u.err = c.Do(req); u.err == nil {
				u.body, u.err = io.ReadAll(u.resp.Body)
				u.resp.Body.Close()
			}
			u.lasted = time.Since(start)
		})
	}
	wg.Wait()
	var kept []string
	for _, u := range ups {
		switch {
		case !u.refused && u.err != nil:
			t.Errorf("%s: %v after %v", u.name, u.err, u.lasted)
		case !u.refused && u.resp.StatusCode != http.StatusCreated:
			t.Errorf("%s: %d %s after %v, want 201", u.name, u.resp.StatusCode, u.body, u.lasted)
		case !u.refused:
			var img imageAnswer
			decode(t, u.body, &img)
			if img.SHA256 != sha256hex(data) || img.UploadID != u.tk.UploadID {
				t.Errorf("%s: stored %+v, want upload %s with sha256 %s", u.name, img, u.tk.UploadID, sha256hex(data))
			}
			if want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[u.h2]; u.resp.Proto != want {
				t.Errorf("%s: answered over %s", u.name, u.resp.Proto)
			}
			if u.lasted <= 60*time.Second {
				t.Errorf("%s: lasted %v, not beyond Traefik's default read timeout", u.name, u.lasted)
			}
			kept = append(kept, u.tk.UploadID)
		case u.err == nil && u.resp.StatusCode == http.StatusCreated:
			t.Errorf("%s: 201 after %v: Traefik's default read timeout did not cut an upload of %v", u.name, u.lasted, uploadLasting)
		default:
			t.Logf("%s: cut after %v (%v %s)", u.name, u.lasted, u.err, statusOf(u.resp))
		}
	}
	// What was cut left nothing: exactly the completed images, no part of
	// the others.
	slices.Sort(kept)
	partial := filepath.Join(e.s.dataDir, "vm-images", ".partial")
	var ids []string
	poll(t, 400, 25*time.Millisecond, "the images stored to be the completed uploads alone, and no partial file", func() bool {
		ids = ids[:0]
		for _, img := range e.s.status(t, e.s.token).Images {
			ids = append(ids, img.UploadID)
		}
		slices.Sort(ids)
		return slices.Equal(ids, kept) && len(dirEntries(t, partial)) == 0
	}, func() string {
		return fmt.Sprintf("images %q, want %q; partial files %q", ids, kept, dirEntries(t, partial))
	})
}

// statusOf is a response's status line, or "no answer".
func statusOf(resp *http.Response) string {
	if resp == nil {
		return "no answer"
	}
	return resp.Status
}

// pacedReader hands out data at an even pace from its first Read, the last
// byte no sooner than lasting after it: a slow uplink, throttled as curl
// --limit-rate throttles.
type pacedReader struct {
	data    []byte
	lasting time.Duration
	start   time.Time
	off     int
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.off == len(p.data) {
		return 0, io.EOF
	}
	if p.start.IsZero() {
		p.start = time.Now()
	}
	n := min(len(b), 8<<10, len(p.data)-p.off)
	due := p.start.Add(time.Duration(float64(p.lasting) * float64(p.off+n) / float64(len(p.data))))
	time.Sleep(time.Until(due)) // the throttle itself, not a wait for another party
	n = copy(b, p.data[p.off:p.off+n])
	p.off += n
	return n, nil
}
