package qcow2_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2"
	q "github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// FuzzInspector feeds arbitrary bytes through the Inspector in several
// chunkings and, when the header passes, through CheckStructure. It must
// never panic, and the verdict must not depend on the chunking. The seed
// corpus in testdata/ holds the heads of small qemu-img images.
//
//	go test -run '^$' -fuzz '^FuzzInspector$' -fuzztime 10s ./qcow2
func FuzzInspector(f *testing.F) {
	f.Add([]byte("QFI\xfb\x00\x00\x00\x02"))
	f.Add(q.Base()[:4096])
	f.Add(q.Mutate(q.Base(), q.Exts(q.Ext{Type: q.ExtDataFile, Data: []byte("x")}, q.End))[:256])
	f.Add(q.Mutate(q.Base(), q.Put32(100, 1024), q.Put64(72, qcow2.IncompatExtendedL2), q.Put32(36, 4))[:2048])
	f.Fuzz(func(t *testing.T, data []byte) {
		v, _ := judge(t, data, q.Limits)
		if h := v.hdr; h != nil {
			if h.ClusterBits < 9 || h.ClusterBits > 21 ||
				h.VirtualSize == 0 || h.VirtualSize > q.Limits.MaxVirtualSize ||
				uint64(h.L1Size)*8 > 32<<20 || (h.Version != 2 && h.Version != 3) {
				t.Fatalf("accepted a header that breaks the rules: %+v", *h)
			}
		}
	})
}

// Fuzz bounds: what one input may cost.
const (
	// fuzzMaxAlloc bounds what the gate allocates for one input: its
	// cluster buffer (at most 2 MiB), table chunk, and 4 bits per cluster
	// of the input; anything proportional to what the header claims
	// (l1_size, virtual size, snapshot counts) would blow it.
	fuzzMaxAlloc = 4 << 20
	// fuzzReads bounds the clusters go-qcow2reader reads per input.
	fuzzReads = 32
)

// FuzzStructure parses the header of arbitrary bytes, then checks the
// structure; nothing may panic, hang, or allocate more than fuzzMaxAlloc
// plus a little per input byte. Whatever the gate accepts must then open
// in go-qcow2reader (Readable, no backing file) and survive reads of up
// to fuzzReads mapped clusters, each at most 64 KiB: the library panics
// or allocates without bound on some hostile headers, and this is the
// proof that the gate keeps those away from it. The seeds in
// testdata/fuzz/FuzzStructure are synthetic images with L2 tables and
// data, compressed clusters, extended L2 entries and a snapshot.
//
//	go test -run '^$' -fuzz '^FuzzStructure$' -fuzztime 10s ./qcow2
func FuzzStructure(f *testing.F) {
	for _, c := range q.Synthetic() {
		if c.Want == "" && len(c.Data) <= 128<<10 {
			f.Add(c.Data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		h, st, err := qcow2.Inspect(bytes.NewReader(data), int64(len(data)), q.Limits)
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > fuzzMaxAlloc+uint64(len(data)) {
			t.Fatalf("the gate allocated %d bytes for %d input bytes", d, len(data))
		}
		var rej *qcow2.Reject
		if err != nil && !errors.As(err, &rej) {
			t.Fatalf("a bytes.Reader cannot fail, yet: %v", err)
		}
		if h == nil {
			return
		}
		// The gateway's path: the streamed header, then CheckStructure.
		err2 := qcow2.CheckStructure(bytes.NewReader(data), int64(len(data)), h)
		if reason(err) != reason(err2) {
			t.Fatalf("Inspect said %v, CheckStructure %v", err, err2)
		}
		if err != nil {
			return
		}
		if mapped := st.DataClusters + st.CompressedClusters; st.AllocatedBytes < 0 ||
			uint64(st.AllocatedBytes) > h.VirtualSize || st.AllocatedBytes > mapped*int64(h.ClusterSize()) ||
			(mapped > 0 && st.L2Tables == 0) {
			t.Fatalf("stats %+v for %v", st, h)
		}
		// The second reader, on the bytes as they are (no zero padding).
		img := openSecond(t, bytes.NewReader(data))
		buf := make([]byte, min(h.ClusterSize(), 64<<10))
		offs := append(mappedClusters(data, h, fuzzReads), 0, int64(h.VirtualSize-1)&^int64(h.ClusterSize()-1))
		for _, off := range offs {
			// Errors are fine (compressed garbage, a data cluster cut by
			// the end of the file); a panic is not.
			_ = readSecond(img, buf[:min(uint64(len(buf)), h.VirtualSize-uint64(off))], off)
		}
		// Our own reader of the virtual disk, which the boot check uses on
		// every accepted upload: it must read what the library reads,
		// and never panic.
		guest, err := qcow2.NewGuest(bytes.NewReader(data), int64(len(data)), h)
		if err != nil {
			t.Fatalf("NewGuest on an accepted image: %v", err)
		}
		want := make([]byte, len(buf))
		for _, off := range offs {
			k := min(uint64(len(buf)), h.VirtualSize-uint64(off))
			errLib := readSecond(img, want[:k], off)
			n, err := guest.ReadAt(buf[:k], off)
			if err == nil && errLib == nil && (n != int(k) || !bytes.Equal(buf[:k], want[:k])) {
				t.Fatalf("at %d: Guest and go-qcow2reader read different bytes", off)
			}
		}
	})
}

var updateSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite testdata/fuzz/FuzzStructure from the synthetic corpus")

// seedCases name the synthetic images kept as FuzzStructure's seed files:
// one of each kind, all small.
var seedCases = map[string]string{
	"valid/v2":                "v2",
	"valid/small snapshot":    "snapshot",
	"valid/small extended L2": "extended-l2",
	"valid/small zstd":        "zstd",
	"valid/512-byte clusters": "c512-deflate",
	"valid/refcount order 0":  "refcount-order-0",
	"valid/refcount order 6":  "refcount-order-6",
}

// TestFuzzSeeds keeps the seed files what they claim: small images the
// gate accepts. With -update-fuzz-seeds it writes them.
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzStructure")
	if *updateSeeds {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, c := range q.Synthetic() {
			if name, ok := seedCases[c.Name]; ok {
				enc := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", c.Data)
				if err := os.WriteFile(filepath.Join(dir, name), []byte(enc), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Each named seed is there and holds exactly its synthetic image.
	want := map[string][]byte{}
	for _, c := range q.Synthetic() {
		if name, ok := seedCases[c.Name]; ok {
			want[name] = c.Data
		}
	}
	if len(want) != len(seedCases) {
		t.Fatalf("%d of the %d seed cases are synthetic cases: %v", len(want), len(seedCases), seedCases)
	}
	seen := map[string]bool{}
	for _, fi := range files {
		raw, err := os.ReadFile(filepath.Join(dir, fi.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) > 512<<10 { // an extended L2 image needs 5 clusters of 16 KiB
			t.Errorf("%s: %d bytes, keep seeds small", fi.Name(), len(raw))
		}
		body, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
		body, ok2 := strings.CutSuffix(body, ")\n")
		data, err := strconv.Unquote(body)
		if !ok || !ok2 || err != nil {
			t.Errorf("%s: not a []byte seed: %v", fi.Name(), err)
			continue
		}
		if w, ok := want[fi.Name()]; ok {
			seen[fi.Name()] = true
			if !bytes.Equal([]byte(data), w) {
				t.Errorf("%s: not the synthetic image it is named for (go test -run TestFuzzSeeds -update-fuzz-seeds)", fi.Name())
			}
		}
		if _, _, err := qcow2.Inspect(strings.NewReader(data), int64(len(data)), q.Limits); err != nil {
			t.Errorf("%s: %v", fi.Name(), err)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("seed file %s missing (go test -run TestFuzzSeeds -update-fuzz-seeds)", name)
		}
	}
}
