package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// The bounds docs/operations.md ("When the image storage hangs") promises
// while the bucket does not answer.
const (
	hungRemoveBound  = 15 * time.Second // POST /market/vm-images/remove answers 200
	hungReadyBound   = 5 * time.Second  // /readyz turns 503 blobStoreUnreachable
	hungRequestBound = 15 * time.Second // a fetch or an upload fails
)

// s3Serve starts serve over SQLite with its images in a fresh versitygw
// bucket.
func s3Serve(t *testing.T) (*server, *s3test.Server) {
	t.Helper()
	needTool(t, "curl")
	bucket := s3test.StartServer(t)
	return s3ServeOn(t, bucket, filepath.Join(t.TempDir(), "data")), bucket
}

// s3ServeOn starts serve with its data dir at dataDir (a restart: the
// same dir again) and its images in bucket, under the prefix edge/.
func s3ServeOn(t *testing.T, bucket *s3test.Server, dataDir string) *server {
	t.Helper()
	env := []string{
		"AWS_ENDPOINT_URL=" + bucket.Config.Endpoint,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + string(bucket.Config.AccessKeyID),
		"AWS_SECRET_ACCESS_KEY=" + string(bucket.Config.SecretAccessKey),
	}
	s := startServe(t, dataDir, []string{"--blobs", "s3://" + bucket.Config.Bucket + "/edge", "--blob-capacity-gib", "4"}, env...)
	s.secret(string(bucket.Config.SecretAccessKey))
	return s
}

// hungClient waits longer than any bound, so that a request that hangs
// is measured rather than cut off by the client.
var hungClient = &http.Client{
	Transport: apiTransport{&http.Transport{Proxy: nil, DisableKeepAlives: true}},
	Timeout:   60 * time.Second,
}

// timed is one request's outcome and how long it took.
type timed struct {
	code int
	body string
	err  error
	took time.Duration
}

func timedDo(req *http.Request) timed {
	start := time.Now()
	resp, err := hungClient.Do(req)
	if err != nil {
		return timed{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return timed{code: resp.StatusCode, body: string(b), err: err, took: time.Since(start)}
}

// readyReason is /readyz's status and reason (empty on 200).
func readyReason(t *testing.T, s *server) (int, string) {
	t.Helper()
	r := timedDo(mustRequest(t, http.MethodGet, s.ctlBase+"/readyz", "", nil))
	if r.err != nil {
		return 0, r.err.Error()
	}
	var e struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal([]byte(r.body), &e)
	return r.code, e.Reason
}

func mustRequest(t *testing.T, method, url, token string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// waitReady polls /readyz until it answers want with reason, at most
// within; it returns how long that took, or fails t.
func waitReady(t *testing.T, s *server, want int, reason string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	code, got := 0, ""
	for time.Since(start) < within {
		if code, got = readyReason(t, s); code == want && got == reason {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("/readyz did not answer %d %q within %v; last %d %q", want, reason, within, code, got)
	return 0
}

// TestE2EHungS3: with the bucket's server stopped (SIGSTOP: connections
// are accepted, nothing answers), a removal still answers 200 within its
// bound and logs the unfinished unlink, /readyz turns 503 naming the blob
// store, and a fetch and an upload fail within theirs. Once the server
// runs again, /readyz is 200 and the image is served. A server that is
// gone (connections refused) is unready too.
func TestE2EHungS3(t *testing.T) {
	s, bucket := s3Serve(t)
	file, data := makeImage(t, t.TempDir(), "hang.qcow2")
	keep := s.upload(t, s.ticket(t, "keep"), file, data)
	gone := s.upload(t, s.ticket(t, "gone"), file, data)
	u := s.fetchURL(t, keep.UploadID)
	tk := s.ticket(t, "during")
	waitReady(t, s, http.StatusOK, "", 10*time.Second)

	bucket.Pause(t)
	var (
		wg                 sync.WaitGroup
		removal, fetch, up timed
		flip               time.Duration
	)
	wg.Go(func() {
		removal = timedDo(mustRequest(t, http.MethodPost, s.ctlBase+"/market/vm-images/remove", s.token,
			strings.NewReader(`{"upload_id":"`+gone.UploadID+`"}`)))
	})
	wg.Go(func() { fetch = timedDo(mustRequest(t, http.MethodGet, u, "", nil)) })
	wg.Go(func() {
		f, err := os.Open(file)
		if err != nil {
			up.err = err
			return
		}
		defer f.Close()
		req := mustRequest(t, http.MethodPut, tk.UploadURL, "", f)
		req.ContentLength = int64(len(data))
		up = timedDo(req)
	})
	flip = waitReady(t, s, http.StatusServiceUnavailable, "blobStoreUnreachable", 30*time.Second)
	wg.Wait()
	t.Logf("S3 stopped: removal %d after %v, /readyz 503 after %v, fetch %d after %v, upload %d after %v",
		removal.code, removal.took.Round(time.Millisecond), flip.Round(time.Millisecond),
		fetch.code, fetch.took.Round(time.Millisecond), up.code, up.took.Round(time.Millisecond))

	if removal.err != nil || removal.code != http.StatusOK || removal.took > hungRemoveBound {
		t.Errorf("removal with S3 stopped: %d %s (%v) after %v, want 200 within %v",
			removal.code, removal.body, removal.err, removal.took, hungRemoveBound)
	}
	if flip > hungReadyBound {
		t.Errorf("/readyz turned 503 after %v, want within %v", flip, hungReadyBound)
	}
	for what, r := range map[string]timed{"fetch": fetch, "upload": up} {
		if r.err != nil || r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, `"blobStoreUnreachable"`) || r.took > hungRequestBound {
			t.Errorf("%s with S3 stopped: %d %s (%v) after %v, want 503 blobStoreUnreachable within %v",
				what, r.code, r.body, r.err, r.took, hungRequestBound)
		}
	}
	if !strings.Contains(s.logs(), "image record removed but its file was not") {
		t.Errorf("the unfinished unlink of %s is not logged:\n%s", gone.UploadID, s.logs())
	}

	bucket.Continue()
	back := waitReady(t, s, http.StatusOK, "", 30*time.Second)
	t.Logf("S3 continued: /readyz 200 after %v", back.Round(time.Millisecond))
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetch after S3 came back: %d bytes, sha256 %s", n, sum)
	}

	bucket.Stop()
	refused := waitReady(t, s, http.StatusServiceUnavailable, "blobStoreUnreachable", 30*time.Second)
	t.Logf("S3 gone (connections refused): /readyz 503 after %v", refused.Round(time.Millisecond))
	if refused > hungReadyBound {
		t.Errorf("/readyz with S3 refusing connections turned 503 after %v, want within %v", refused, hungReadyBound)
	}
}
