package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// The record store's outage, through the binary: two serve replicas on
// one PostgreSQL 15, over local files and over S3, while PUT and tus
// uploads and ticket requests run on both, and PostgreSQL is stopped
// (pg_ctl stop -m fast), killed (SIGKILL of its postmaster), stalled
// (SIGSTOP of every process, then SIGCONT) and started again on the same
// socket. The deadline of every store call is 1 s (--store-timeout), so
// the whole run stays short.

// Bounds the answers are held to.
const (
	outageStoreTimeout = time.Second
	// ticketBound: a ticket request makes two store calls (its tenant,
	// its ticket), each cut at the deadline.
	ticketBound = 2*outageStoreTimeout + 1500*time.Millisecond
	// uploadBound: from an upload's last byte that moved to its answer.
	// The longest path is a lease whose renewals the stalled store does
	// not answer: it ends once less than 4 s of its 10 s are left, at a
	// renewal (every 2.5 s), 8.5 s after the last one that landed.
	uploadBound = 12 * time.Second
	// readyBound: a plane's /readyz says not ready within its 2 s probe
	// bound, and the pollers ask every readyPoll.
	readyBound = 3 * time.Second
	readyPoll  = 100 * time.Millisecond
	// backBound: once the store answers again (a new connection gets its
	// answer: pg_ctl start -w, or a resumed server through its backlog),
	// both planes' /readyz are ready within it.
	backBound = time.Second
)

// outageAnswer is one answer a client got, or the error instead of one.
type outageAnswer struct {
	phase, what, replica string
	status               int
	reason, retryAfter   string
	err                  error
	took                 time.Duration // from the request to its answer
	waited               time.Duration // from the last byte that moved to the answer
}

// outageEdge is the two replicas, their store and their images.
type outageEdge struct {
	t       *testing.T
	cluster *pgtest.Cluster
	bucket  *s3test.Server // nil: each replica's images in its data dir
	env     []string
	args    []string
	a, b    *server
	image   []byte
	sha     string
	client  *http.Client // validated against docs/openapi.yaml, no timeout of its own

	mu      sync.Mutex
	answers []outageAnswer
	// images are the uploads answered 201 (or a last 204), by upload
	// id, with the replica that stored them.
	images map[string]*server
	// tickets are the tickets answered 201 that no upload used.
	tickets map[string]bool
}

// TestE2EStoreOutage: with PostgreSQL stopped, killed or stalled, no
// answer is 500 or 408, every answer comes within its bound, a ticket
// request that got no 201 left no ticket, every 201 has its image byte
// for byte and nothing else is kept (records, files, objects, tickets);
// both planes' /readyz say not ready within their bound and ready within
// 1 s of the store's return, and log each change once.
func TestE2EStoreOutage(t *testing.T) {
	needTool(t, "qemu-img")
	needTool(t, "qemu-io")
	skipShort(t, "it starts PostgreSQL, versitygw and vmshelf serve")
	p := filepath.Join(t.TempDir(), "outage.qcow2")
	if r := runCmd(t, nil, "qemu-img", "create", "-f", "qcow2", p, "64M"); r.code != 0 {
		t.Fatalf("qemu-img create: %s", r.stderr)
	}
	if r := runCmd(t, nil, "qemu-io", "-f", "qcow2", "-c", "write -P 0xcd 0 12M", p); r.code != 0 {
		t.Fatalf("qemu-io: %s%s", r.stdout, r.stderr)
	}
	image, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"files", "s3"} {
		t.Run(mode, func(t *testing.T) {
			e := startOutageEdge(t, mode == "s3", image)
			for _, f := range []struct {
				name       string
				begin, end func(testing.TB)
				hold       time.Duration
				rate       float64 // the uploads' bytes a second
			}{
				{"stopped", e.cluster.Down, e.cluster.Up, 2 * time.Second, 6 << 20},
				{"killed", e.cluster.Kill, e.cluster.Up, 2 * time.Second, 6 << 20},
				// Longer than an upload's lease outlives a store that does
				// not answer (at most 8.5 s): the uploads sending through it
				// lose theirs.
				{"stalled", e.cluster.Stall, func(tb testing.TB) {
					tb.Logf("stalled: the server answered a new connection %v after SIGCONT", e.cluster.Resume(tb).Round(time.Millisecond))
				}, 9 * time.Second, 1 << 20},
			} {
				e.fault(f.name, f.begin, f.end, f.hold, f.rate)
			}
			e.check()
		})
	}
}

func startOutageEdge(t *testing.T, s3 bool, image []byte) *outageEdge {
	t.Helper()
	e := &outageEdge{t: t, cluster: pgtest.StartDurable(t), image: image, sha: sha256hex(image),
		client:  &http.Client{Transport: apiTransport{&http.Transport{Proxy: nil, DisableKeepAlives: true}}},
		images:  map[string]*server{},
		tickets: map[string]bool{},
	}
	// The cluster trusts its socket, so any password is accepted: what
	// matters is that no log line repeats it, whatever fails.
	const password = "pw-5e1b-outage-never-logged"
	url := strings.Replace(e.cluster.NewDatabase(t), "postgres:///", "postgres://postgres:"+password+"@/", 1)
	e.env = []string{storeURLEnv + "=" + url}
	e.args = []string{"--store-timeout", outageStoreTimeout.String(), "--ticket-rate", "1000", "--ticket-burst", "1000",
		"--images-per-tenant", "1000", "--max-transfers", "16"}
	secrets := []string{password}
	if s3 {
		e.bucket = s3test.StartServer(t)
		e.env = append(e.env, "AWS_ENDPOINT_URL="+e.bucket.Config.Endpoint, "AWS_REGION=us-east-1",
			"AWS_ACCESS_KEY_ID="+string(e.bucket.Config.AccessKeyID), "AWS_SECRET_ACCESS_KEY="+string(e.bucket.Config.SecretAccessKey))
		e.args = append(e.args, "--blobs", "s3://"+e.bucket.Config.Bucket+"/edge", "--blob-capacity-gib", "4")
		secrets = append(secrets, string(e.bucket.Config.SecretAccessKey))
	}
	e.a = e.start(nil, secrets)
	e.b = e.start(e.a, secrets)
	return e
}

// start starts a replica with a data dir of its own; the second gets the
// first's dev token.
func (e *outageEdge) start(first *server, secrets []string) *server {
	e.t.Helper()
	dir := filepath.Join(e.t.TempDir(), "data")
	if first != nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, devToken), []byte(first.token+"\n"), 0o600); err != nil {
			e.t.Fatal(err)
		}
	}
	s := startServe(e.t, dir, e.args, e.env...)
	for _, v := range secrets {
		s.secret(v)
	}
	return s
}

// note keeps an answer, and a secret it holds from both replicas' logs.
func (e *outageEdge) note(a outageAnswer) {
	e.mu.Lock()
	e.answers = append(e.answers, a)
	e.mu.Unlock()
}

// do sends req and returns its answer, bounded by a minute so that no
// request of the test hangs it; the body is read.
func (e *outageEdge) do(req *http.Request) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(req.Context(), time.Minute)
	defer cancel()
	resp, err := e.client.Do(req.WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// answerOf fills an outageAnswer from a response.
func answerOf(phase, what string, s *server, resp *http.Response, body []byte, err error, took time.Duration) outageAnswer {
	a := outageAnswer{phase: phase, what: what, replica: s.dataAddr, err: err, took: took}
	if resp != nil {
		a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		var e struct{ Reason string }
		if json.Unmarshal(body, &e) == nil {
			a.reason = e.Reason
		}
	}
	return a
}

// ticket asks replica s for a ticket.
func (e *outageEdge) ticket(phase string, s *server) (ticketAnswer, outageAnswer) {
	req, _ := http.NewRequest(http.MethodPost, s.ctlBase+"/market/vm-images/ticket", strings.NewReader(`{"name":"outage"}`))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, body, err := e.do(req)
	a := answerOf(phase, "ticket", s, resp, body, err, time.Since(start))
	var tk ticketAnswer
	if a.status == http.StatusCreated && json.Unmarshal(body, &tk) == nil {
		e.a.secret(tk.Ticket)
		e.b.secret(tk.Ticket)
	}
	return tk, a
}

// paced is an image body sent at rate bytes a second, which notes when
// its last byte moved: a client on a link of that speed.
type paced struct {
	data     []byte
	off      int
	rate     float64
	start    time.Time
	mu       sync.Mutex
	lastRead time.Time
}

func newPaced(data []byte, rate float64) *paced {
	return &paced{data: data, rate: rate, start: time.Now(), lastRead: time.Now()}
}

func (p *paced) Read(b []byte) (int, error) {
	if p.off >= len(p.data) {
		return 0, io.EOF
	}
	// The pace of the link: the bytes sent never run ahead of the rate.
	// This sleep shapes the client's traffic; nothing waits on it.
	due := p.start.Add(time.Duration(float64(p.off) / p.rate * float64(time.Second)))
	time.Sleep(time.Until(due))
	n := copy(b[:min(len(b), 64<<10)], p.data[p.off:])
	p.off += n
	p.mu.Lock()
	p.lastRead = time.Now()
	p.mu.Unlock()
	return n, nil
}

func (p *paced) last() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastRead
}

// put uploads the image to a ticket through replica s at rate.
func (e *outageEdge) put(phase string, s *server, tk ticketAnswer, rate float64) outageAnswer {
	body := newPaced(e.image, rate)
	req, _ := http.NewRequest(http.MethodPut, retarget(tk.UploadURL, s), body)
	req.ContentLength = int64(len(e.image))
	start := time.Now()
	resp, b, err := e.do(req)
	a := answerOf(phase, "put", s, resp, b, err, time.Since(start))
	a.waited = time.Since(body.last())
	if a.status == http.StatusCreated {
		var img imageAnswer
		if json.Unmarshal(b, &img) != nil || img.SHA256 != e.sha || img.Size != int64(len(e.image)) || img.UploadID != tk.UploadID {
			a.err = fmt.Errorf("201 with %s, want the image %s of %d bytes", b, e.sha, len(e.image))
		}
		e.mu.Lock()
		e.images[tk.UploadID] = s
		e.mu.Unlock()
	}
	return a
}

// tus uploads the image to a ticket as a resumable upload on replica s:
// it creates the session, then PATCHes at rate from the offset the edge
// holds until the upload is complete, resuming after every refusal that
// keeps the session once s is ready again, as a tus client does.
func (e *outageEdge) tus(phase string, s *server, tk ticketAnswer, rate float64) {
	var session string
	for try := 0; session == ""; try++ {
		req, _ := http.NewRequest(http.MethodPost, retarget(tk.UploadURL, s), nil)
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Upload-Length", strconv.Itoa(len(e.image)))
		start := time.Now()
		resp, b, err := e.do(req)
		a := answerOf(phase, "tus creation", s, resp, b, err, time.Since(start))
		e.note(a)
		if a.status == http.StatusCreated {
			session = retarget(resp.Header.Get("Location"), s)
			id := session[strings.LastIndexByte(session, '/')+1:]
			e.a.secret(id)
			e.b.secret(id)
			break
		}
		if a.status != http.StatusServiceUnavailable || try == 20 {
			return // noted; check fails it
		}
		e.waitReady(s)
	}
	off := 0
	for try := 0; ; try++ {
		body := newPaced(e.image[off:], rate)
		req, _ := http.NewRequest(http.MethodPatch, session, body)
		req.ContentLength = int64(len(e.image) - off)
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Content-Type", "application/offset+octet-stream")
		req.Header.Set("Upload-Offset", strconv.Itoa(off))
		start := time.Now()
		resp, b, err := e.do(req)
		a := answerOf(phase, "tus patch", s, resp, b, err, time.Since(start))
		a.waited = time.Since(body.last())
		e.note(a)
		if a.status == http.StatusNoContent && resp.Header.Get("Upload-Offset") == strconv.Itoa(len(e.image)) {
			e.mu.Lock()
			e.images[tk.UploadID] = s
			e.mu.Unlock()
			return
		}
		if a.status != http.StatusServiceUnavailable && a.status != http.StatusLocked || try == 20 {
			return
		}
		e.waitReady(s)
		if off = e.offset(session); off < 0 {
			return
		}
		rate = 1 << 40 // the store is back: the rest goes at once
	}
}

// offset asks a session's durable offset with HEAD; -1 if it fails.
func (e *outageEdge) offset(session string) int {
	for range 20 {
		req, _ := http.NewRequest(http.MethodHead, session, nil)
		req.Header.Set("Tus-Resumable", "1.0.0")
		resp, _, err := e.do(req)
		if err == nil && resp.StatusCode == http.StatusOK {
			n, err := strconv.Atoi(resp.Header.Get("Upload-Offset"))
			if err == nil {
				return n
			}
		}
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			return -1
		}
	}
	return -1
}

// ready asks a plane's /readyz.
func (e *outageEdge) ready(base string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), readyBound)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
	resp, _, err := e.do(req)
	return err == nil && resp.StatusCode == http.StatusOK
}

// waitReady waits (bounded) until both planes of s are ready.
func (e *outageEdge) waitReady(s *server) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		if e.ready(s.dataBase) && e.ready(s.ctlBase) {
			return
		}
		time.Sleep(readyPoll) // polling the probe, bounded by the deadline
	}
}

// readyWatch probes every plane's /readyz every readyPoll, each probe
// on its own (a slow probe, one the outage holds for its 2 s, does not
// delay the next), and notes the first answer that said not ready after
// the outage began, and the first that said ready of the probes sent
// after the store's return.
type readyWatch struct {
	mu         sync.Mutex
	down, back map[string]time.Time
	backAt     time.Time // the store's return; zero while it is away
}

func (e *outageEdge) watchReady(stop <-chan struct{}) (*readyWatch, *sync.WaitGroup) {
	w := &readyWatch{down: map[string]time.Time{}, back: map[string]time.Time{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(readyPoll) // the probes' period, as a kubelet's
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, base := range []string{e.a.dataBase, e.a.ctlBase, e.b.dataBase, e.b.ctlBase} {
				wg.Go(func() {
					w.mu.Lock()
					sentAfterReturn := !w.backAt.IsZero()
					w.mu.Unlock()
					ok := e.ready(base)
					now := time.Now()
					w.mu.Lock()
					defer w.mu.Unlock()
					if _, seen := w.down[base]; !ok && !seen {
						w.down[base] = now
					}
					if _, seen := w.back[base]; ok && sentAfterReturn && !seen {
						w.back[base] = now
					}
				})
			}
		}
	})
	return w, &wg
}

// fault runs one outage: uploads on tickets taken before it run at rate
// while begin takes the store away for hold; ticket requests run on both
// replicas all along; end brings the store back. The PUTs answered an
// error are sent again, with their tickets, once the store is back.
func (e *outageEdge) fault(phase string, begin, end func(testing.TB), hold time.Duration, rate float64) {
	t := e.t
	replicas := []*server{e.a, e.b}
	var puts, tuses []ticketAnswer
	for i := range 4 {
		tk, a := e.ticket(phase+" (before)", replicas[i%2])
		if a.status != http.StatusCreated {
			t.Fatalf("%s: ticket before the outage: %+v", phase, a)
		}
		if i < 2 {
			puts = append(puts, tk)
		} else {
			tuses = append(tuses, tk)
		}
	}
	stop := make(chan struct{})
	watch, watchers := e.watchReady(stop)
	// Ticket requests on both replicas, all along.
	var requesters sync.WaitGroup
	for _, s := range replicas {
		requesters.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond): // the clients' pace
				}
				tk, a := e.ticket(phase, s)
				e.note(a)
				if a.status == http.StatusCreated {
					e.mu.Lock()
					e.tickets[tk.UploadID] = true
					e.mu.Unlock()
				}
			}
		})
	}
	var uploads sync.WaitGroup
	failedPuts := make(chan ticketAnswer, len(puts))
	for i, tk := range puts {
		uploads.Go(func() {
			a := e.put(phase, replicas[(i+1)%2], tk, rate)
			e.note(a)
			if a.status != http.StatusCreated {
				failedPuts <- tk
			}
		})
	}
	for i, tk := range tuses {
		uploads.Go(func() { e.tus(phase, replicas[i%2], tk, rate) })
	}

	// The outage begins while the uploads send.
	time.Sleep(600 * time.Millisecond) // the clients' head start: the uploads are under way
	began := time.Now()
	begin(t)
	time.Sleep(hold) // the length of the outage, not a wait for anything
	end(t)
	backAt := time.Now()
	watch.mu.Lock()
	watch.backAt = backAt
	watch.mu.Unlock()
	t.Logf("%s: the store was away %v", phase, backAt.Sub(began).Round(time.Millisecond))

	// A new ticket and upload work at once.
	var firstTicket time.Duration
	for deadline := backAt.Add(10 * time.Second); ; {
		tk, a := e.ticket(phase+" (after)", e.a)
		t.Logf("%s: a ticket %v after the store's return: %d %s in %v", phase, time.Since(backAt).Round(time.Millisecond), a.status, a.reason, a.took.Round(time.Millisecond))
		if a.status == http.StatusCreated {
			firstTicket = time.Since(backAt)
			if put := e.put(phase+" (after)", e.b, tk, 1<<40); put.status != http.StatusCreated {
				t.Errorf("%s: an upload once the store is back: %+v", phase, put)
			}
			break
		}
		e.note(a)
		if time.Now().After(deadline) {
			t.Fatalf("%s: no ticket 10 s after the store came back: %+v", phase, a)
		}
	}
	uploads.Wait()
	close(failedPuts)
	// Every PUT answered an error has its ticket back, for the retry.
	for tk := range failedPuts {
		var a outageAnswer
		for deadline := time.Now().Add(15 * time.Second); ; {
			a = e.put(phase+" (retry)", e.a, tk, 1<<40)
			if a.status == http.StatusCreated || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // polling for the ticket's return, bounded
		}
		if a.status != http.StatusCreated {
			t.Errorf("%s: the retry of a PUT answered an error, with its ticket: %+v; want 201, its ticket given back; the logs of its upload:\n%s",
				phase, a, e.logsOf(tk.UploadID))
		}
	}
	e.waitReady(e.a)
	e.waitReady(e.b)
	close(stop)
	requesters.Wait()
	watchers.Wait()

	watch.mu.Lock()
	defer watch.mu.Unlock()
	for _, base := range []string{e.a.dataBase, e.a.ctlBase, e.b.dataBase, e.b.ctlBase} {
		down, ok := watch.down[base]
		switch {
		case !ok:
			t.Errorf("%s: %s/readyz never said not ready", phase, base)
		case down.Sub(began) > readyBound:
			t.Errorf("%s: %s/readyz said not ready %v after the outage began, want within %v", phase, base, down.Sub(began), readyBound)
		}
		back, ok := watch.back[base]
		switch {
		case !ok:
			t.Errorf("%s: %s/readyz never said ready again", phase, base)
		case back.Sub(backAt) > backBound:
			t.Errorf("%s: %s/readyz ready %v after the store's return, want within %v", phase, base, back.Sub(backAt), backBound)
		}
		t.Logf("%s: %s/readyz: not ready after %v, ready again %v after the store's return", phase, base,
			down.Sub(began).Round(time.Millisecond), back.Sub(backAt).Round(time.Millisecond))
	}
	t.Logf("%s: the first ticket 201 came %v after the store's return", phase, firstTicket.Round(time.Millisecond))
}

// check holds every answer to its rule and bound, and the store, the
// images and the tickets to the answers.
func (e *outageEdge) check() {
	t := e.t
	e.mu.Lock()
	defer e.mu.Unlock()
	var longestTicket, longestUpload outageAnswer
	counts := map[string]int{}
	for _, a := range e.answers {
		counts[fmt.Sprintf("%s %d %s", a.what, a.status, a.reason)]++
		switch {
		case a.err != nil:
			t.Errorf("%s: %s on %s: %v (after %v)", a.phase, a.what, a.replica, a.err, a.took)
		case a.status == http.StatusInternalServerError || a.status == http.StatusRequestTimeout:
			t.Errorf("%s: %s on %s answered %d %s: the store's outage is no fault of ours, nor the client's idleness", a.phase, a.what, a.replica, a.status, a.reason)
		case a.status == http.StatusServiceUnavailable && (a.reason != "storeUnreachable" || a.retryAfter == ""):
			t.Errorf("%s: %s on %s answered 503 %s, Retry-After %q; want storeUnreachable with Retry-After", a.phase, a.what, a.replica, a.reason, a.retryAfter)
		case a.status >= 400 && a.status != http.StatusServiceUnavailable:
			t.Errorf("%s: %s on %s answered %d %s", a.phase, a.what, a.replica, a.status, a.reason)
		}
		if a.what == "ticket" && a.took > longestTicket.took {
			longestTicket = a
		}
		if (a.what == "put" || a.what == "tus patch") && a.waited > longestUpload.waited {
			longestUpload = a
		}
	}
	if longestTicket.took > ticketBound {
		t.Errorf("the longest ticket request took %v (%+v), want within %v", longestTicket.took, longestTicket, ticketBound)
	}
	if longestUpload.waited > uploadBound {
		t.Errorf("the longest upload waited %v after its last byte (%+v), want within %v", longestUpload.waited, longestUpload, uploadBound)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("answers: %s × %d", k, counts[k])
	}
	t.Logf("the longest ticket request: %v (%s, %s); the longest wait of an upload after its last byte: %v (%s, %s)",
		longestTicket.took.Round(time.Millisecond), longestTicket.phase, longestTicket.what,
		longestUpload.waited.Round(time.Millisecond), longestUpload.phase, longestUpload.what)

	// The records: exactly the images answered 201, each byte for byte,
	// no session left, and exactly the unused tickets answered 201: a
	// ticket request that got no 201 left none (the withdrawals settle
	// after their answers: polled, bounded).
	var st struct {
		Images   []imageAnswer `json:"images"`
		Sessions []struct {
			UploadID string `json:"upload_id"`
		} `json:"sessions"`
		Tickets []struct {
			UploadID string `json:"upload_id"`
		} `json:"tickets"`
	}
	wantImages := sortedKeys(e.images)
	wantTickets := sortedKeys(e.tickets)
	var gotImages, gotTickets []string
	poll(t, 300, 100*time.Millisecond, "the records to hold exactly what the clients were told", func() bool {
		code, body := e.a.ctl(t, "/market/vms/status", e.a.token, "")
		if code != http.StatusOK || json.Unmarshal(body, &st) != nil {
			return false
		}
		gotImages, gotTickets = nil, nil
		for _, img := range st.Images {
			gotImages = append(gotImages, img.UploadID)
		}
		for _, tk := range st.Tickets {
			gotTickets = append(gotTickets, tk.UploadID)
		}
		slices.Sort(gotImages)
		slices.Sort(gotTickets)
		return slices.Equal(gotImages, wantImages) && slices.Equal(gotTickets, wantTickets) && len(st.Sessions) == 0
	}, func() string {
		return fmt.Sprintf("images %v, want %v; unused tickets %v, want %v; sessions %v", gotImages, wantImages, gotTickets, wantTickets, st.Sessions)
	})
	for _, img := range st.Images {
		if img.SHA256 != e.sha || img.Size != int64(len(e.image)) {
			t.Errorf("image %s: %d bytes, sha256 %s; want the upload's %d, %s", img.UploadID, img.Size, img.SHA256, len(e.image), e.sha)
		}
	}

	// The bytes: exactly the images, each the upload's, and nothing of an
	// upload that failed (removals after the answer: polled, bounded).
	if e.bucket != nil {
		e.checkBucket(wantImages)
	} else {
		e.checkFiles()
	}
	// The stall outlasted the leases of the uploads sending through it:
	// they said so, and stopped (their answers are checked above).
	if n := countLines(e.a.logs()+e.b.logs(), "upload lease could not be renewed in time"); n == 0 {
		t.Error("no upload lost its lease to the stall: the test no longer stalls the store long enough")
	}
	for _, s := range []*server{e.a, e.b} {
		logs := s.logs()
		for _, plane := range []string{"data", "control"} {
			// One line per change; the pollers asked every plane dozens of
			// times in each of the three outages.
			if n := countLines(logs, `msg="not ready"`, "plane="+plane, "probe=readyz"); n < 3 || n > 6 {
				t.Errorf("%s's %s plane logged %d \"not ready\" lines over 3 outages, want one per change (3 to 6):\n%s", s.dataAddr, plane, n, logs)
			}
		}
		s.assertNoSecrets()
	}
}

// checkFiles: each replica's image directory holds exactly the images it
// answered 201 for, each the upload's bytes, and no partial file.
func (e *outageEdge) checkFiles() {
	t := e.t
	for _, s := range []*server{e.a, e.b} {
		var want []string
		for id, on := range e.images {
			if on == s {
				want = append(want, id+".qcow2")
			}
		}
		slices.Sort(want)
		dir := filepath.Join(s.dataDir, imagesDir)
		var files, partials []string
		poll(t, 200, 100*time.Millisecond, "the image files to be exactly the images", func() bool {
			files, partials = nil, nil
			for _, f := range dirEntries(t, dir) {
				if strings.HasSuffix(f, ".qcow2") {
					files = append(files, f)
				}
			}
			for _, f := range dirEntries(t, filepath.Join(dir, ".partial")) {
				partials = append(partials, f)
			}
			return slices.Equal(files, want) && len(partials) == 0
		}, func() string { return fmt.Sprintf("%s: files %v, partials %v; want %v", dir, files, partials, want) })
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || !bytes.Equal(b, e.image) {
				t.Errorf("%s: %d bytes (%v), not the upload's", f, len(b), err)
			}
		}
	}
}

// checkBucket: the bucket holds exactly the images, each committed and
// the upload's bytes, and nothing of an upload in progress.
func (e *outageEdge) checkBucket(want []string) {
	t := e.t
	var wantKeys []string
	for _, id := range want {
		wantKeys = append(wantKeys, "edge/images/"+id+".qcow2")
	}
	var images, partial []string
	var uploads []minio.ObjectMultipartInfo
	poll(t, 300, 100*time.Millisecond, "the bucket to hold exactly the images", func() bool {
		images, partial, uploads = bucketKeys(t, e.bucket, "images/"), bucketKeys(t, e.bucket, "partial/"), bucketUploads(t, e.bucket)
		slices.Sort(images)
		return slices.Equal(images, wantKeys) && len(partial) == 0 && len(uploads) == 0
	}, func() string {
		return fmt.Sprintf("images %v, want %v; partial %v; multipart uploads %d", images, wantKeys, partial, len(uploads))
	})
	if committed := bucketKeys(t, e.bucket, "committed/"); len(committed) != len(want) {
		t.Errorf("commit markers %v, want one per image %v", committed, want)
	}
	core, ctx, cancel := lookIn(t, e.bucket)
	defer cancel()
	for _, key := range images {
		o, err := core.Client.GetObject(ctx, e.bucket.Config.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, o)
		o.Close()
		if got := hex.EncodeToString(h.Sum(nil)); err != nil || got != e.sha {
			t.Errorf("%s: sha256 %s (%v), want the upload's %s", key, got, err, e.sha)
		}
	}
}

// logsOf is both replicas' log lines that name id.
func (e *outageEdge) logsOf(id string) string {
	var b strings.Builder
	for _, s := range []*server{e.a, e.b} {
		for _, l := range strings.Split(s.logs(), "\n") {
			if strings.Contains(l, id) {
				b.WriteString(s.dataAddr + ": " + l + "\n")
			}
		}
	}
	return b.String()
}

// retarget points a data-plane URL another replica handed out at replica
// s, as a load balancer may send it.
func retarget(u string, s *server) string {
	return s.dataBase + u[strings.Index(u, "/market/"):]
}

// countLines counts the lines of text that hold every one of parts.
func countLines(text string, parts ...string) int {
	n := 0
lines:
	for _, l := range strings.Split(text, "\n") {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue lines
			}
		}
		n++
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
