package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// needTool finds a tool a test cannot do without: missing, it is a
// failure under CI=true and a loud skip elsewhere, naming what installs it.
func needTool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := name + " is not installed; install it with: " + install
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
	return ""
}

// The page's QCOW2 check (static/qcow2.js, run by node on a Blob as in the
// browser) refuses what the edge's gate refuses, with the same reason, on
// images made by qemu-img, and accepts what it accepts: a refused file
// never takes a ticket, and an accepted one is not turned away in the
// browser for a rule the edge does not have.
func TestQcow2JSAgreesWithTheGate(t *testing.T) {
	node := needTool(t, "node", "apt-get install nodejs qemu-utils")
	qemuImg := needTool(t, "qemu-img", "apt-get install nodejs qemu-utils")
	dir := t.TempDir()
	const (
		maxVirtual = 512 << 30
		uploadMax  = 32 << 30
	)
	// qcow2test's runner retries qemu-img's flaky LUKS timing ("Unable to
	// get accurate CPU usage") and bounds each run.
	run := func(args ...string) {
		t.Helper()
		qcow2test.RunQemu(t, dir, qemuImg, args...)
	}
	file := func(name string) string { return filepath.Join(dir, name) }
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(file(name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(file(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	run("create", "-q", "-f", "qcow2", "-o", "compat=0.10", file("v2.qcow2"), "1G")
	run("create", "-q", "-f", "qcow2", file("v3.qcow2"), "1G")
	run("create", "-q", "-f", "qcow2", "-o", "cluster_size=2M", file("cluster2m.qcow2"), "1G")
	run("create", "-q", "-f", "qcow2", "-o", "compression_type=zstd", file("zstd.qcow2"), "1G")
	run("create", "-q", "-f", "qcow2", "-b", file("v3.qcow2"), "-F", "qcow2", file("backing.qcow2"))
	run("create", "-q", "-f", "qcow2", "--object", "secret,id=sec0,data=not-a-real-secret",
		"-o", "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10", file("luks.qcow2"), "64M")
	run("create", "-q", "-f", "qcow2", file("huge.qcow2"), "600G")
	run("create", "-q", "-f", "raw", file("disk.raw"), "1M")
	v3 := read("v3.qcow2")
	write("truncated.qcow2", v3[:50])
	write("magic-only.qcow2", v3[:3])
	write("empty.qcow2", nil)
	// A backing format extension without the backing file fields: only
	// the extension list gives it away.
	ext := bytes.Clone(v3[:4096])
	hl := 104 // qemu-img's v3 header_length is 112: the extensions start there
	if n := int(ext[100])<<24 | int(ext[101])<<16 | int(ext[102])<<8 | int(ext[103]); n > hl {
		hl = n
	}
	copy(ext[hl:], []byte{0xe2, 0x79, 0x2a, 0xca, 0, 0, 0, 5, 'q', 'c', 'o', 'w', '2', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	write("backing-ext.qcow2", append(ext, v3[4096:]...))
	// The backing file named in the header only: its format extension
	// turned into one nobody knows (skipped), so the header fields alone
	// must decide.
	overlay := read("backing.qcow2")
	i := bytes.Index(overlay[:65536], []byte{0xe2, 0x79, 0x2a, 0xca})
	if i < 0 {
		t.Fatal("qemu-img's overlay has no backing format extension")
	}
	noExt := bytes.Clone(overlay)
	copy(noExt[i:], []byte{0, 0, 0, 1})
	write("backing-header.qcow2", noExt)
	version4 := bytes.Clone(v3)
	version4[7] = 4
	write("version4.qcow2", version4)

	cases := []struct {
		file   string
		reason string // "" accepted
	}{
		{"v2.qcow2", ""},
		{"v3.qcow2", ""},
		{"cluster2m.qcow2", ""},
		{"zstd.qcow2", ""},
		{"backing.qcow2", "backingFile"},
		{"backing-ext.qcow2", "backingFile"},
		{"backing-header.qcow2", "backingFile"},
		{"luks.qcow2", "encrypted"},
		{"huge.qcow2", "virtualSizeTooLarge"},
		{"disk.raw", "notQcow2"},
		{"truncated.qcow2", "badHeader"},
		{"magic-only.qcow2", "notQcow2"},
		{"empty.qcow2", "notQcow2"},
		{"version4.qcow2", "notQcow2"},
	}
	args := []string{filepath.Join("testdata", "qcow2check.mjs"), pageModule(t, "qcow2.js"),
		strconv.Itoa(maxVirtual), strconv.Itoa(uploadMax)}
	for _, c := range cases {
		args = append(args, file(c.file))
	}
	out, err := exec.CommandContext(t.Context(), node, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("node qcow2check.mjs: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("node qcow2check.mjs: %v", err)
	}
	var verdicts map[string]struct {
		OK          bool   `json:"ok"`
		Reason      string `json:"reason"`
		Message     string `json:"message"`
		Version     int    `json:"version"`
		VirtualSize int64  `json:"virtualSize"`
	}
	if err := json.Unmarshal(out, &verdicts); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			v, ok := verdicts[file(c.file)]
			if !ok {
				t.Fatalf("no verdict for %s in %s", c.file, out)
			}
			if v.OK != (c.reason == "") || v.Reason != c.reason {
				t.Errorf("qcow2.js: ok %v reason %q (%s), want reason %q", v.OK, v.Reason, v.Message, c.reason)
			}
			if v.OK && v.VirtualSize != 1<<30 {
				t.Errorf("qcow2.js: virtual size %d, want 1 GiB", v.VirtualSize)
			}
			// The edge's gate on the same bytes (its header part, which
			// is what the browser sees before a ticket).
			in := qcow2.NewInspector(qcow2.Limits{MaxVirtualSize: maxVirtual})
			_, werr := in.Write(read(c.file))
			_, ferr := in.Finish()
			gate := ""
			var rej *qcow2.Reject
			if err := errors.Join(werr, ferr); errors.As(err, &rej) {
				gate = rej.Reason
			} else if err != nil {
				t.Fatalf("gate: %v", err)
			}
			if gate != c.reason {
				t.Errorf("the edge's gate says %q, want %q: the expectation is wrong", gate, c.reason)
			}
		})
	}
}

// A file larger than the edge's upload limit is refused as tooLarge before
// its header is even looked at, as the edge refuses its Content-Length.
func TestQcow2JSTooLarge(t *testing.T) {
	node := needTool(t, "node", "apt-get install nodejs qemu-utils")
	qemuImg := needTool(t, "qemu-img", "apt-get install nodejs qemu-utils")
	f := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.CommandContext(t.Context(), qemuImg, "create", "-q", "-f", "qcow2", f, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	fi, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "qcow2check.mjs"))
	lib := pageModule(t, "qcow2.js")
	for _, c := range []struct {
		uploadMax int64
		reason    string
	}{{fi.Size() - 1, "tooLarge"}, {fi.Size(), ""}} {
		out, err := exec.CommandContext(t.Context(), node, script, lib, strconv.Itoa(512<<30),
			strconv.FormatInt(c.uploadMax, 10), f).Output()
		if err != nil {
			t.Fatalf("node: %v", err)
		}
		var v map[string]struct {
			OK     bool   `json:"ok"`
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if got := v[f]; got.Reason != c.reason || got.OK != (c.reason == "") {
			t.Errorf("upload limit %d for a %d-byte file: %+v, want reason %q", c.uploadMax, fi.Size(), got, c.reason)
		}
	}
}
