package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// TestE2ECheck runs `vmshelf check` over the synthetic half of the shared
// corpus the upload route is tested with (built in Go, no tool needed): the
// verdict line, the reason and the exit code agree with the gateway's.
func TestE2ECheck(t *testing.T) {
	checkCorpus(t, qcow2test.Synthetic())
}

// TestE2ECheckQemuImages is the same over the images qemu-img and qemu-io
// make (skipped at its start outside CI when they are missing).
func TestE2ECheckQemuImages(t *testing.T) {
	checkCorpus(t, qcow2test.QemuImages(t, filepath.Join(t.TempDir(), "qemu")))
}

func checkCorpus(t *testing.T, cases []qcow2test.Case) {
	t.Helper()
	if len(cases) == 0 {
		t.Fatal("empty corpus")
	}
	dir := t.TempDir()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			p := filepath.Join(dir, "image")
			if err := os.WriteFile(p, tc.Data, 0o600); err != nil {
				t.Fatal(err)
			}
			r := vmshelf(t, "check", p)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != 1 {
				t.Fatalf("want one verdict line, got %q (stderr %q)", r.stdout, r.stderr)
			}
			if tc.Want == "" {
				if r.code != 0 || !strings.HasPrefix(lines[0], "ok: qcow2 v") || !strings.Contains(lines[0], "allocated") {
					t.Fatalf("exit %d, %q; want 0 and an ok line with the figures", r.code, lines[0])
				}
				return
			}
			if r.code != 1 || !strings.HasPrefix(lines[0], "refused ("+tc.Want+"): ") {
				t.Fatalf("exit %d, %q; want 1 and refused (%s)", r.code, lines[0], tc.Want)
			}
		})
	}
}

// TestE2ECheckSaysFirmware: the verdict line names the firmware that could
// start the disk, as the edge's upload reads it.
func TestE2ECheckSaysFirmware(t *testing.T) {
	dir := t.TempDir()
	blank, _ := makeImage(t, dir, "blank.qcow2")
	boots, _ := makeBootableImage(t, dir, "boots.qcow2")
	for file, want := range map[string]string{
		blank: ", no boot loader: no firmware starts it — ",
		boots: ", starts with a BIOS or UEFI — ",
	} {
		r := vmshelf(t, "check", file)
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("check %s: exit %d, %q; want 0 and %q", filepath.Base(file), r.code, r.stdout, want)
		}
	}
}

func TestE2ECheckUnreadable(t *testing.T) {
	for name, args := range map[string][]string{
		"missing file": {"check", "/nonexistent/disk.qcow2"},
		"a directory":  {"check", t.TempDir()},
		"no file":      {"check"},
		"two files":    {"check", "a", "b"},
	} {
		t.Run(name, func(t *testing.T) {
			r := vmshelf(t, args...)
			if r.code != 2 || !strings.HasPrefix(strings.TrimSpace(r.stderr), "vmshelf: ") {
				t.Fatalf("exit %d, stderr %q; want 2 and a one-line error", r.code, r.stderr)
			}
		})
	}
}
