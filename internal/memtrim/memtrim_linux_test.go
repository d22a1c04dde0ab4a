package memtrim

import (
	"crypto/sha256"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// written is a variable of the program: it lives in a writable mapping,
// which AfterStartup must leave alone.
var written = []byte("before")

// rssFile is the resident size of the process's file mappings, in kB.
func rssFile(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// constants hashes read-only data of the binary (the unicode tables).
func constants() [32]byte {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(unicode.Categories)) {
		for _, r := range unicode.Categories[name].R16 {
			h.Write([]byte{byte(r.Lo), byte(r.Lo >> 8), byte(r.Hi), byte(r.Hi >> 8)})
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// The test binary's code and constants stop being resident, and the
// program goes on unchanged: its variables keep what was written, its
// constants read the same, its code runs.
func TestAfterStartup(t *testing.T) {
	written = append(written[:0], "after a write"...)
	want := constants()
	before := rssFile(t)
	n, err := AfterStartup()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("advised %d KiB of mappings; RssFile %d kB → %d kB", n>>10, before, after)
	if n == 0 || after >= before {
		t.Errorf("advised %d bytes, RssFile %d kB → %d kB: want the read-only mappings dropped", n, before, after)
	}
	if string(written) != "after a write" {
		t.Errorf("a variable reads %q after AfterStartup, want what was written", written)
	}
	if constants() != want {
		t.Error("the binary's constants read differently after AfterStartup")
	}
}

// readOnlyMappings picks exactly the executable's mappings without write
// permission.
func TestReadOnlyMappings(t *testing.T) {
	const procMaps = `00400000-0188a000 r-xp 00000000 fe:00 9986998                            /usr/bin/vmshelf
0188a000-02f57000 r--p 0148a000 fe:00 9986998                            /usr/bin/vmshelf
02f57000-0305f000 rw-p 02b57000 fe:00 9986998                            /usr/bin/vmshelf
0305f000-030a0000 rw-p 00000000 00:00 0
3ae478000000-3ae478c00000 rw-p 00000000 00:00 0
7f9586904000-7f9586a5a000 r-xp 00026000 fe:00 326269                     /usr/lib/x86_64-linux-gnu/libc.so.6
7f9586a5a000-7f9586a60000 r--p 00000000 fe:00 9986998                    /usr/bin/vmshelf (deleted)
7f9586a60000-7f9586a62000 r--p 00000000 fe:01 9986998                    /other/disk/same-inode
`
	dev, _ := parseDev("fe:00")
	got, err := readOnlyMappings([]byte(procMaps), dev, 9986998)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0x188a000}, {0x188a000, 0x2f57000}, {0x7f9586a5a000, 0x7f9586a60000}}
	if len(got) != len(want) {
		t.Fatalf("got %x, want %x", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: %x, want %x", i, got[i], want[i])
		}
	}
	if _, err := readOnlyMappings([]byte("zz-00 r--p 0 fe:00 9986998 /usr/bin/vmshelf\n"), dev, 9986998); err == nil {
		t.Error("a malformed address range was accepted")
	}
}

// parseDev agrees with stat's device numbers for majors and minors past a
// byte.
func TestParseDev(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{{"fe:00", 0xfe00}, {"08:01", 0x801}, {"103:1f0", (0xf0) | (0x103 << 8) | (0x100 << 12)}} {
		if got, ok := parseDev(c.in); !ok || got != c.want {
			t.Errorf("parseDev(%q) = %#x, %v; want %#x", c.in, got, ok, c.want)
		}
	}
}
