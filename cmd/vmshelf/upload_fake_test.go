package main

// Tests of 'vmshelf upload' (the built binary) against a fake edge
// (internal/testkit/fakeedge), which can lie about the stored digest or
// answer 503 with Retry-After on demand. They need no qemu (the image is
// qcow2test.Base) and no serve, so they check what the real edge cannot
// be made to do on cue.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/fakeedge"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// fakeImage writes qcow2test.Base, a valid QCOW2 the local check accepts.
func fakeImage(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	b := qcow2test.Base()
	p := filepath.Join(dir, "disk.qcow2")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

// wantRoutes checks the exact sequence of requests the edge answered.
func wantRoutes(t *testing.T, got []fakeedge.Request, want ...string) {
	t.Helper()
	var s []string
	for _, r := range got {
		s = append(s, r.String())
	}
	if strings.Join(s, ", ") != strings.Join(want, ", ") {
		t.Errorf("the edge answered:\n  %s\nwant:\n  %s", strings.Join(s, ", "), strings.Join(want, ", "))
	}
}

// TestUploadDigestMismatch: when the stored image's sha256 is not the
// file's, 'vmshelf upload' refuses (exit 1) naming both digests, prints no
// image and removes its state file (the session is over: a rerun would
// find the same image). With the right digest the same fake edge stores
// the image: the refusal is the digest's doing.
func TestUploadDigestMismatch(t *testing.T) {
	for _, wrong := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrong digest %v", wrong), func(t *testing.T) {
			work := t.TempDir()
			f := fakeedge.Start(t, fakeedge.Options{WrongDigest: wrong})
			disk, b := fakeImage(t, work)
			r := vmshelf(t, "upload", "--control", f.URL, "--token-file", f.TokenFile(work), "--name", "digest", disk)

			wantRoutes(t, f.Requests(), "ticket 201", "create 201", "patch 204", "status 200")
			if got := f.Tally().Held; string(got) != string(b) {
				t.Errorf("the edge received %d bytes, not the file's %d", len(got), len(b))
			}
			if _, err := os.Stat(disk + ".vmshelf-upload"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state file is still there (stat: %v)", err)
			}
			reported := f.Tally().Reported
			// Digests are 64 hex too: only they may show.
			if shown := strings.NewReplacer(reported, "", sha256hex(b), "").Replace(r.stdout + r.stderr); anySecret.MatchString(shown) {
				t.Errorf("upload printed something capability-shaped:\n%s", r.stderr)
			}
			if !wrong {
				var img imageAnswer
				if r.code != 0 {
					t.Fatalf("exit %d with the right digest; stderr:\n%s", r.code, r.stderr)
				}
				decode(t, []byte(r.stdout), &img)
				if img.UploadID != f.UploadID || img.SHA256 != sha256hex(b) || img.Size != int64(len(b)) {
					t.Errorf("printed %+v; want image %s with sha256 %s", img, f.UploadID, sha256hex(b))
				}
				return
			}
			line := refusal(t, r, 1)
			for _, want := range []string{"sha256 " + reported, "has " + sha256hex(b), disk, f.UploadID} {
				if !strings.Contains(line, want) {
					t.Errorf("the refusal %q does not mention %q", line, want)
				}
			}
		})
	}
}

// TestUploadHonoursRetryAfter: a 503 with Retry-After from the control
// plane (1 s) and from the data plane (2 s) is waited out before the
// retry, measured at the edge: the next request arrives at least
// Retry-After after the 503 was answered (the client's own first backoff
// is 0.5 s), and not much later; then the upload succeeds.
func TestUploadHonoursRetryAfter(t *testing.T) {
	work := t.TempDir()
	f := fakeedge.Start(t, fakeedge.Options{Busy: map[fakeedge.Route][]int{fakeedge.Ticket: {1}, fakeedge.Patch: {2}}})
	disk, b := fakeImage(t, work)
	r := vmshelf(t, "upload", "--control", f.URL, "--token-file", f.TokenFile(work), "--name", "busy", disk)
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var img imageAnswer
	decode(t, []byte(r.stdout), &img)
	if img.UploadID != f.UploadID || img.SHA256 != sha256hex(b) {
		t.Errorf("printed %+v; want image %s with sha256 %s", img, f.UploadID, sha256hex(b))
	}
	reqs := f.Requests()
	// After the PATCH's 503 the client asks how far the upload got.
	wantRoutes(t, reqs, "ticket 503", "ticket 201", "create 201", "patch 503", "head 200", "patch 204", "status 200")
	if len(reqs) != 7 {
		t.FailNow()
	}
	// The client binary is not built with -race; 2 s covers a loaded
	// machine's scheduling delays, and is well under the next backoff step
	// a double wait would show.
	const slack = 2 * time.Second
	for _, c := range []struct {
		refused, retry int
		after          time.Duration
	}{{0, 1, time.Second}, {3, 4, 2 * time.Second}} {
		gap := reqs[c.retry].At.Sub(reqs[c.refused].Done)
		if gap < c.after || gap > c.after+slack {
			t.Errorf("%s came %v after the %s with Retry-After %v; want %v to %v",
				reqs[c.retry].Route, gap, reqs[c.refused], c.after, c.after, c.after+slack)
		}
		t.Logf("%s came %v after the %s with Retry-After %v", reqs[c.retry].Route, gap, reqs[c.refused], c.after)
	}
	for _, want := range []string{"retry 1 of 10 in 1s", "retry 1 of 10 in 2s"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
		}
	}
}
