package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// Bounds of the S3 outage tests beyond those of s3hang_test.go.
const (
	// s3IdleTimeout is the S3 blobs' no-byte timeout (s3.DefaultIdleTimeout):
	// a part whose server stopped answering fails that long after its last
	// byte moved. An upload running then is answered within it and
	// hungAnswerMargin; its abort comes after the answer.
	s3IdleTimeout    = 15 * time.Second
	hungAnswerMargin = 5 * time.Second
	// readyHold is how long /readyz must stay 503 while writes fail: more
	// than a verdict's life (1 s) and a probe's bound (2 s) together.
	readyHold = 4 * time.Second
	// cleanupBound is how long the abort of a failed upload may take once
	// the S3 server is back: its retries wait at most 15 s between tries.
	cleanupBound = 40 * time.Second
)

// unreachable checks that r is 503 blobStoreUnreachable with Retry-After:
// the S3 server's outage, which the client retries, never a 500 of ours.
// A HEAD's answer has no body: its status and header say it.
func unreachable(t *testing.T, what string, r timed, head bool) {
	t.Helper()
	switch {
	case r.err != nil:
		t.Errorf("%s with S3 down: %v after %v", what, r.err, r.took)
	case r.code != http.StatusServiceUnavailable || (!head && !strings.Contains(r.body, `"blobStoreUnreachable"`)):
		t.Errorf("%s with S3 down: %d %s after %v; want 503 blobStoreUnreachable", what, r.code, r.body, r.took)
	case r.took > hungRequestBound:
		t.Errorf("%s with S3 down answered after %v; want within %v", what, r.took, hungRequestBound)
	}
}

// timedWithHeader is timedDo that also returns the answer's Retry-After.
func timedWithHeader(req *http.Request) (timed, string) {
	start := time.Now()
	resp, err := hungClient.Do(req)
	if err != nil {
		return timed{err: err, took: time.Since(start)}, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return timed{code: resp.StatusCode, body: string(b), err: err, took: time.Since(start)}, resp.Header.Get("Retry-After")
}

// TestE2ES3Refused: with the S3 server gone (its port closed: connections
// refused), every route that needs the image bytes answers 503
// blobStoreUnreachable with Retry-After: a fetch (GET and HEAD), a PUT, a
// tus creation and a ticket request (it asks the bucket for free space).
// Before, all of them were 500 internal, as if the edge itself were
// broken. Once the server is back on its port, /readyz turns 200 and
// the image, a new upload and its fetch work again.
func TestE2ES3Refused(t *testing.T) {
	s, bucket := s3Serve(t)
	file, data := makeImage(t, t.TempDir(), "refused.qcow2")
	kept := s.upload(t, s.ticket(t, "kept"), file, data)
	u := s.fetchURL(t, kept.UploadID)
	forPut, forTus := s.ticket(t, "put"), s.ticket(t, "tus")
	waitReady(t, s, http.StatusOK, "", 10*time.Second)

	bucket.Stop()
	type ask struct {
		what string
		req  *http.Request
		head bool
	}
	put := mustRequest(t, http.MethodPut, forPut.UploadURL, "", strings.NewReader(string(data)))
	tus := mustRequest(t, http.MethodPost, forTus.UploadURL, "", nil)
	tus.Header.Set("Tus-Resumable", "1.0.0")
	tus.Header.Set("Upload-Length", strconv.Itoa(len(data)))
	for _, a := range []ask{
		{"fetch GET", mustRequest(t, http.MethodGet, u, "", nil), false},
		{"fetch HEAD", mustRequest(t, http.MethodHead, u, "", nil), true},
		{"upload PUT", put, false},
		{"tus creation", tus, false},
	} {
		r, retry := timedWithHeader(a.req)
		t.Logf("%s with S3 refusing: %d after %v", a.what, r.code, r.took.Round(time.Millisecond))
		unreachable(t, a.what, r, a.head)
		if r.code == http.StatusServiceUnavailable && retry != "60" {
			t.Errorf("%s with S3 down: Retry-After %q, want 60", a.what, retry)
		}
	}
	waitReady(t, s, http.StatusServiceUnavailable, "blobStoreUnreachable", hungReadyBound)
	// A ticket checks the free space, from a listing of the bucket at most
	// 5 s old (s3.DefaultUsageTTL): until that lapses a ticket may still
	// be issued, and is cancelled again; then the listing must ask S3.
	var (
		tr    timed
		retry string
	)
	poll(t, 10, time.Second, "a ticket request to ask S3 itself", func() bool {
		tr, retry = timedWithHeader(mustRequest(t, http.MethodPost, s.ctlBase+"/market/vm-images/ticket", s.token, strings.NewReader(`{"name":"later"}`)))
		if tr.code != http.StatusCreated {
			return true
		}
		var tk ticketAnswer
		decode(t, []byte(tr.body), &tk)
		s.secret(tk.Ticket)
		if code, b := s.ctl(t, "/market/vm-images/ticket/cancel", s.token, `{"upload_id":"`+tk.UploadID+`"}`); code != http.StatusOK {
			t.Fatalf("cancel of a ticket issued from the cached free space: %d %s", code, b)
		}
		return false
	})
	t.Logf("ticket with S3 refusing: %d after %v", tr.code, tr.took.Round(time.Millisecond))
	unreachable(t, "ticket", tr, false)
	if retry != "60" {
		t.Errorf("ticket with S3 down: Retry-After %q, want 60", retry)
	}

	bucket.Restart(t)
	back := waitReady(t, s, http.StatusOK, "", 10*time.Second)
	t.Logf("S3 back on its port: /readyz 200 after %v", back.Round(time.Millisecond))
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetch after S3 came back: %d bytes, sha256 %s", n, sum)
	}
	again := s.upload(t, s.ticket(t, "again"), file, data)
	if n, sum := fetchAll(t, s.fetchURL(t, again.UploadID), 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetch of the upload after S3 came back: %d bytes, sha256 %s", n, sum)
	}
}

// lookIn is a client straight to bucket's S3 server, and the bound of one
// look at what it holds.
func lookIn(t *testing.T, bucket *s3test.Server) (*minio.Core, context.Context, context.CancelFunc) {
	t.Helper()
	c, err := s3test.Client(bucket.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	return &minio.Core{Client: c}, ctx, cancel
}

// bucketUploads lists the unfinished multipart uploads under serve's
// prefix (edge/, see s3Serve), straight from the S3 server.
func bucketUploads(t *testing.T, bucket *s3test.Server) []minio.ObjectMultipartInfo {
	t.Helper()
	core, ctx, cancel := lookIn(t, bucket)
	defer cancel()
	res, err := core.ListMultipartUploads(ctx, bucket.Config.Bucket, "edge/images/", "", "", "", 1000)
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	return res.Uploads
}

// bucketKeys lists the objects under edge/<prefix>, straight from the S3
// server.
func bucketKeys(t *testing.T, bucket *s3test.Server, prefix string) []string {
	t.Helper()
	core, ctx, cancel := lookIn(t, bucket)
	defer cancel()
	var keys []string
	for o := range core.Client.ListObjects(ctx, bucket.Config.Bucket, minio.ListObjectsOptions{Prefix: "edge/" + prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list %s: %v", prefix, o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys
}

// partsOf counts the parts S3 holds of upload id's multipart upload (0
// while it has none, or no upload).
func partsOf(t *testing.T, bucket *s3test.Server, id string) int {
	t.Helper()
	core, ctx, cancel := lookIn(t, bucket)
	defer cancel()
	n := 0
	for _, up := range bucketUploads(t, bucket) {
		if up.Key != "edge/images/"+id+".qcow2" {
			continue
		}
		res, err := core.ListObjectParts(ctx, bucket.Config.Bucket, up.Key, up.UploadID, 0, 1000)
		if err != nil {
			t.Fatalf("list parts: %v", err)
		}
		n += len(res.ObjectParts)
	}
	return n
}

// streaming is a request whose body the test writes as it goes: the
// answer comes on answer once serve gives one.
type streaming struct {
	pw     *io.PipeWriter
	answer chan timed
}

// startStreaming sends req with a body of length bytes that the test
// writes through s.pw.
func startStreaming(t *testing.T, req func(body io.Reader) *http.Request, length int) *streaming {
	t.Helper()
	pr, pw := io.Pipe()
	st := &streaming{pw: pw, answer: make(chan timed, 1)}
	r := req(pr)
	r.ContentLength = int64(length)
	go func() {
		res := timedDo(r)
		pr.CloseWithError(io.ErrClosedPipe) // the body's writer stops
		st.answer <- res
	}()
	t.Cleanup(func() { pw.CloseWithError(io.ErrClosedPipe) })
	return st
}

// send writes b as the next bytes of the body, in the background: once
// serve stops reading, the write blocks until the answer closes the pipe.
func (st *streaming) send(b []byte) {
	go func() { _, _ = st.pw.Write(b) }()
}

// waitParts waits, bounded, until S3 holds a part of upload id: the upload
// is under way in S3 when the test breaks the server.
func waitParts(t *testing.T, bucket *s3test.Server, id string) {
	t.Helper()
	poll(t, 400, 50*time.Millisecond, "a part of upload "+id+" in S3", func() bool { return partsOf(t, bucket, id) > 0 })
}

// putUnderWay starts a PUT of a 40 MiB image with a fresh ticket named
// name, and returns once its first 20 MiB are sent and S3 holds a part of
// it; rest is what the PUT has not sent yet.
func putUnderWay(t *testing.T, s *server, bucket *s3test.Server, name string) (ticketAnswer, *streaming, []byte) {
	t.Helper()
	_, img := makeImageData(t, t.TempDir(), name+".qcow2", 40)
	tk := s.ticket(t, name)
	put := startStreaming(t, func(body io.Reader) *http.Request {
		return mustRequest(t, http.MethodPut, tk.UploadURL, "", body)
	}, len(img))
	put.send(img[:20<<20])
	waitParts(t, bucket, tk.UploadID)
	return tk, put, img[20<<20:]
}

// TestE2ES3StoppedMidUpload: a PUT running when the S3 server goes away
// (killed: its port refuses) is answered 503 blobStoreUnreachable at once;
// its multipart upload, which the abort could not remove while the server
// was gone, is aborted as soon as the server is back, not an hour later at
// some start-up, and its partial objects go with it.
func TestE2ES3StoppedMidUpload(t *testing.T) {
	s, bucket := s3Serve(t)
	_, put, rest := putUnderWay(t, s, bucket, "mid")

	bucket.Stop()
	stopped := time.Now()
	put.send(rest)
	r := <-put.answer
	took := time.Since(stopped)
	t.Logf("PUT with S3 stopped under it: %d after %v", r.code, took.Round(time.Millisecond))
	r.took = took
	unreachable(t, "a running PUT", r, false)

	bucket.Restart(t)
	restarted := time.Now()
	poll(t, int(cleanupBound/(250*time.Millisecond)), 250*time.Millisecond, "the failed upload's multipart upload and partial objects to go",
		func() bool { return len(bucketUploads(t, bucket)) == 0 && len(bucketKeys(t, bucket, "partial/")) == 0 },
		func() string {
			return "left: " + strconv.Itoa(len(bucketUploads(t, bucket))) + " multipart uploads, partial objects " +
				strings.Join(bucketKeys(t, bucket, "partial/"), " ") + "\n" + s.logs()
		})
	t.Logf("S3 back: the failed upload's multipart upload aborted within %v", time.Since(restarted).Round(time.Millisecond))
}

// TestE2EUploadWhenS3Hangs: a PUT and a tus PATCH running when the S3
// server hangs (SIGSTOP) are answered 503 blobStoreUnreachable once their
// part has moved no byte for the no-byte timeout (15 s), not after the
// abort's deadlines too (before: 35 s for the PUT, 25 s for the PATCH).
// Once the server runs again the PUT's multipart upload is aborted, the
// session's stays, and the session finishes from its durable offset.
func TestE2EUploadWhenS3Hangs(t *testing.T) {
	s, bucket := s3Serve(t)
	_, tusImg := makeImageData(t, t.TempDir(), "tus.qcow2", 40)
	tusTk := s.ticket(t, "tus")
	sess := tusCreate(t, s, tusTk, len(tusImg))
	_, put, putRest := putUnderWay(t, s, bucket, "put")
	patch := startStreaming(t, func(body io.Reader) *http.Request {
		req := mustRequest(t, http.MethodPatch, sess, "", body)
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Content-Type", "application/offset+octet-stream")
		req.Header.Set("Upload-Offset", "0")
		return req
	}, len(tusImg))
	patch.send(tusImg[:20<<20])
	waitParts(t, bucket, tusTk.UploadID)

	bucket.Pause(t)
	paused := time.Now()
	put.send(putRest)
	patch.send(tusImg[20<<20:])
	for what, ch := range map[string]chan timed{"PUT": put.answer, "PATCH": patch.answer} {
		r := <-ch
		r.took = time.Since(paused)
		t.Logf("%s with S3 hung under it: %d after %v", what, r.code, r.took.Round(time.Millisecond))
		if r.err != nil || r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, `"blobStoreUnreachable"`) ||
			r.took > s3IdleTimeout+hungAnswerMargin {
			t.Errorf("%s with S3 hung: %d %s (%v) after %v; want 503 blobStoreUnreachable within %v",
				what, r.code, r.body, r.err, r.took, s3IdleTimeout+hungAnswerMargin)
		}
	}

	bucket.Continue()
	poll(t, int(cleanupBound/(250*time.Millisecond)), 250*time.Millisecond, "the PUT's multipart upload to go, the session's to stay",
		func() bool {
			var keys []string
			for _, up := range bucketUploads(t, bucket) {
				keys = append(keys, up.Key)
			}
			return slices.Equal(keys, []string{"edge/images/" + tusTk.UploadID + ".qcow2"})
		}, func() string { return s.logs() })
	off := tusOffset(t, sess)
	if resp := tusPatch(t, sess, off, tusImg[off:]); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PATCH from offset %d once S3 runs again: %d\n%s", off, resp.StatusCode, s.logs())
	}
	if n, sum := fetchAll(t, s.fetchURL(t, tusTk.UploadID), 30*time.Second); n != int64(len(tusImg)) || sum != sha256hex(tusImg) {
		t.Fatalf("fetch of the resumed upload: %d bytes, sha256 %s", n, sum)
	}
}

// TestE2EReadyzProvesWrite: /readyz turns ready only once the S3 server
// takes a write. A server back on its port that answers reads but refuses
// writes (versitygw --readonly: as one coming back whose storage is not
// writable yet) answers the bucket's HEAD, which alone made /readyz 200
// while every upload failed; it must stay 503 blobStoreUnreachable. Once
// the server takes writes, /readyz is 200 and an upload succeeds.
func TestE2EReadyzProvesWrite(t *testing.T) {
	s, bucket := s3Serve(t)
	file, data := makeImage(t, t.TempDir(), "ready.qcow2")
	waitReady(t, s, http.StatusOK, "", 10*time.Second)

	bucket.Restart(t, "--readonly")
	core, ctx, cancel := lookIn(t, bucket)
	defer cancel()
	if ok, err := core.BucketExists(ctx, bucket.Config.Bucket); !ok || err != nil {
		t.Fatalf("the read-only server does not answer the bucket's HEAD: %v, %v", ok, err)
	}
	// The verdict from before the restart may live its second yet.
	flip := waitReady(t, s, http.StatusServiceUnavailable, "blobStoreUnreachable", hungReadyBound)
	t.Logf("S3 back refusing writes: /readyz 503 after %v", flip.Round(time.Millisecond))
	start := time.Now()
	for time.Since(start) < readyHold {
		if code, reason := readyReason(t, s); code != http.StatusServiceUnavailable || reason != "blobStoreUnreachable" {
			t.Fatalf("/readyz %v after S3 came back refusing writes: %d %q; want 503 blobStoreUnreachable", time.Since(start).Round(time.Millisecond), code, reason)
		}
		time.Sleep(100 * time.Millisecond) // observing /readyz over readyHold, bounded by the loop
	}

	bucket.Restart(t)
	back := waitReady(t, s, http.StatusOK, "", hungReadyBound)
	t.Logf("S3 takes writes again: /readyz 200 after %v", back.Round(time.Millisecond))
	s.upload(t, s.ticket(t, "after"), file, data)
}

// TestE2EKilledServeLeavesUnfinished: what docs/operations.md says a
// kill -9 of serve in the middle of a PUT leaves in the bucket. Nothing
// of the process is left to abort the upload: its multipart upload, its
// parts and its partial objects (the head) stay, through a restart, until
// a start-up's cleanup once the partial grace (1 h) has passed; the
// restarted serve shows them in vmshelf_image_storage_unfinished_uploads
// and _bytes.
func TestE2EKilledServeLeavesUnfinished(t *testing.T) {
	s, bucket := s3Serve(t)
	tk, put, _ := putUnderWay(t, s, bucket, "killed")
	s.kill()
	// The client's transport waits for its body's reader before it gives
	// up on the dead connection: the body ends here.
	put.pw.CloseWithError(io.ErrClosedPipe)
	<-put.answer

	again := s3ServeOn(t, bucket, s.dataDir)
	if n := len(bucketUploads(t, bucket)); n != 1 {
		t.Errorf("multipart uploads after the restart: %d, want the killed PUT's", n)
	}
	if keys := bucketKeys(t, bucket, "partial/"+tk.UploadID+"/"); !slices.Contains(keys, "edge/partial/"+tk.UploadID+"/head") {
		t.Errorf("partial objects of the killed PUT after the restart: %q, want its head", keys)
	}
	mfs := again.scrape(t)
	uploads, ok := metricValue(mfs, "vmshelf_image_storage_unfinished_uploads", nil)
	bytes, ok2 := metricValue(mfs, "vmshelf_image_storage_unfinished_bytes", nil)
	t.Logf("after the restart: %v unfinished uploads holding %v bytes", uploads, bytes)
	if !ok || !ok2 || uploads != 1 || bytes < 8<<20 {
		t.Errorf("metrics after the restart: unfinished uploads %v (%v), bytes %v (%v); want 1 upload holding at least a part (8 MiB)",
			uploads, ok, bytes, ok2)
	}
}
