package main

// A crash between a file's move and its record (kill -9 at each step of an
// upload's commit and of an image's removal) must not look like a lost
// database to the next start: start-up carries on, deletes no image file
// but one its owner removed, and still refuses a database that really was
// lost.

import (
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/crashpoint"
	"github.com/vmshelf/vmshelf/internal/tools/ociimage"
)

var (
	crashBinOnce sync.Once
	crashBin     string
	crashBinErr  error
)

// crashBinary is vmshelf built with the tag crashpoints: it kills itself
// with SIGKILL at the step VMSHELF_TEST_CRASH_AT names. Built once, beside
// binPath.
func crashBinary(t *testing.T) string {
	t.Helper()
	skipShort(t, "it builds and crashes vmshelf serve")
	crashBinOnce.Do(func() {
		crashBin = filepath.Join(filepath.Dir(binPath), "vmshelf-crashpoints")
		// binPath's build with the tag: build tags do not change the
		// other packages' compiles, so only this package's differ.
		cmd := exec.Command("go", append([]string{"build", "-tags", "crashpoints"}, ociimage.GoBuildArgs(crashBin)[1:]...)...)
		cmd.Dir, cmd.Env = filepath.Join("..", ".."), ociimage.GoBuildEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			crashBinErr = errors.New("go build -tags crashpoints: " + err.Error() + "\n" + string(out))
		}
	})
	if crashBinErr != nil {
		t.Fatal(crashBinErr)
	}
	return crashBin
}

// crashed waits for s to die by its own SIGKILL at a crash point.
func (s *server) crashed(t *testing.T, step string) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop at %s within 30s; stderr:\n%s", step, s.stderr)
	}
	s.killed = true
	var ee *exec.ExitError
	if !errors.As(s.waitErr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("serve ended with %v, want killed by SIGKILL at %s; stderr:\n%s", s.waitErr, step, s.stderr)
	}
}

// uploadCut runs an upload that serve does not live to answer.
func (s *server) uploadCut(t *testing.T, tk ticketAnswer, file string) {
	t.Helper()
	needTool(t, "curl")
	r := runCmd(t, nil, "curl", "-sS", "--max-time", "30", "-o", os.DevNull, "-T", file, tk.UploadURL)
	if r.code == 0 {
		t.Fatalf("the upload got an answer from a serve that should have died: %s", r.stderr)
	}
}

// removeCut asks for a removal that serve does not live to answer.
func (s *server) removeCut(t *testing.T, id string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.ctlBase+"/market/vm-images/remove", strings.NewReader(`{"upload_id":"`+id+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := httpClient.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the removal got an answer from a serve that should have died: %d %s", resp.StatusCode, b)
	}
}

// remove removes an image and wants 200.
func (s *server) remove(t *testing.T, id string) {
	t.Helper()
	if code, body := s.ctl(t, "/market/vm-images/remove", s.token, `{"upload_id":"`+id+`"}`); code != http.StatusOK {
		t.Fatalf("remove %s: %d %s", id, code, body)
	}
}

// crashCase is one step to crash at, and what the restart must find.
type crashCase struct {
	step string
	// removal: the step is in a removal of the store's last image, which
	// is uploaded first; otherwise in the store's first upload.
	removal bool
	// committed: the crashed upload's file was committed (and must be
	// kept, unrecorded: quarantined, or left for the grace over S3).
	committed bool
}

var crashCases = []crashCase{
	{step: crashpoint.CommitAfterIntent},
	{step: crashpoint.CommitAfterRename, committed: true},
	{step: crashpoint.RemoveAfterRecord, removal: true},
	{step: crashpoint.RemoveAfterUnlink, removal: true},
}

// TestE2ECrashInCommitOrRemoval: serve over its data dir is killed at
// each step of the first upload's commit and of the last image's removal.
// The next start succeeds (before the journal, the two middle steps made
// it refuse with exit 2 and the advice to restore vmshelf.db from a
// backup); the cut-off upload's committed file is quarantined byte for
// byte, never deleted, and not served; the removed image's file is gone;
// and a deleted vmshelf.db is still refused afterwards.
func TestE2ECrashInCommitOrRemoval(t *testing.T) {
	bin := crashBinary(t)
	work := t.TempDir()
	file, data := makeImage(t, work, "disk.qcow2")
	for _, tc := range crashCases {
		t.Run(tc.step, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			var victim string
			if tc.removal {
				s := startServe(t, dir, nil)
				victim = s.upload(t, s.ticket(t, "last"), file, data).UploadID
				s.terminate(t)
			}
			s := startServeWith(t, bin, dir, nil, []string{crashpoint.Env + "=" + tc.step})
			if tc.removal {
				s.removeCut(t, victim)
			} else {
				tk := s.ticket(t, "first")
				victim = tk.UploadID
				s.uploadCut(t, tk, file)
			}
			s.crashed(t, tc.step)

			s = startServe(t, dir, nil)
			if n := len(s.status(t, s.token).Images); n != 0 {
				t.Errorf("after the crash the tenant has %d images, want none", n)
			}
			images := filepath.Join(dir, imagesDir)
			if _, err := os.Stat(filepath.Join(images, victim+".qcow2")); !os.IsNotExist(err) {
				t.Errorf("the crashed %s's file is still served from vm-images (stat: %v)", tc.step, err)
			}
			q := vmshelf(t, "quarantine", "list", "--data-dir", dir)
			if tc.committed {
				b, err := os.ReadFile(filepath.Join(images, ".quarantine", victim+".qcow2"))
				if err != nil || sha256hex(b) != sha256hex(data) {
					t.Errorf("the cut-off upload's file in quarantine: %v (same bytes: %v)", err, err == nil && sha256hex(b) == sha256hex(data))
				}
				if !strings.HasPrefix(q.stdout, victim+"\t") {
					t.Errorf("quarantine list = %q, want %s", q.stdout, victim)
				}
			} else if q.stdout != "" {
				t.Errorf("quarantine list = %q, want none", q.stdout)
			}
			// The journal is settled: the next start has nothing to do.
			s.terminate(t)
			s = startServe(t, dir, nil)
			if strings.Contains(s.logs(), "start-up cleanup") {
				t.Errorf("the second start after the crash still cleaned up:\n%s", s.logs())
			}
			// A lost vmshelf.db is still refused.
			s.upload(t, s.ticket(t, "after"), file, data)
			s.terminate(t)
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(filepath.Join(dir, dbFile+suffix)); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			}
			if line := refusedStart(t, dir); !strings.Contains(line, "no store id") {
				t.Errorf("the refusal of a deleted %s does not say it has no store id: %q", dbFile, line)
			}
		})
	}
}
