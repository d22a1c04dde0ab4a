package web

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dustin/go-humanize"
)

// The page writes sizes and times as the CLI does (`vmshelf images`):
// sizes with humanize.IBytes's binary units and rounding, times in UTC
// with the zone said. node runs static/format.js in a zone that is not UTC
// (and a German locale), so a formatter that follows the reader's zone or
// locale shows here as it would in a browser abroad.
func TestFormatAgreesWithTheCLI(t *testing.T) {
	node := needTool(t, "node", "apt-get install nodejs")
	sizes := []int64{0, 1, 9, 10, 512, 1023, 1024, 1536, 10239, 10240, 1<<20 - 1, 1 << 20, 5 << 20,
		4096 << 20, 20 << 30, 32 << 30, 512 << 30, 1<<30 + 1<<29, 1<<40 - 1, 1 << 40, 123456789, 1073741823}
	times := []time.Time{
		time.Date(2026, 12, 2, 10, 40, 59, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 5, 0, 0, time.FixedZone("CET", 3600)), // the last day of 2025 in UTC
		time.Date(2027, 6, 30, 23, 59, 0, 0, time.FixedZone("PDT", -7*3600)),
	}
	var in struct {
		Bytes []int64  `json:"bytes"`
		Times []string `json:"times"`
	}
	in.Bytes = sizes
	for _, tm := range times {
		in.Times = append(in.Times, tm.Format(time.RFC3339Nano))
	}
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	script := pageModule(t, "format.js")
	cmd := exec.CommandContext(t.Context(), node, filepath.Join("testdata", "formatcheck.mjs"), script)
	cmd.Stdin = bytes.NewReader(body)
	cmd.Env = append(os.Environ(), "TZ=America/New_York", "LANG=de_DE.UTF-8", "LC_ALL=de_DE.UTF-8")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node formatcheck.mjs: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		Bytes []string `json:"bytes"`
		Times []string `json:"times"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Bytes) != len(sizes) || len(got.Times) != len(times) {
		t.Fatalf("node printed %q (%v)", out, err)
	}
	for i, n := range sizes {
		if want := humanize.IBytes(uint64(n)); got.Bytes[i] != want {
			t.Errorf("the page writes %d bytes as %q, the CLI as %q", n, got.Bytes[i], want)
		}
	}
	for i, tm := range times {
		if want := tm.UTC().Format("2006-01-02 15:04") + " UTC"; got.Times[i] != want {
			t.Errorf("the page writes %s as %q, want %q (the CLI's UTC, said)", in.Times[i], got.Times[i], want)
		}
	}
}
