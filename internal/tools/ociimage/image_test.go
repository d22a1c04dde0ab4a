package ociimage

import (
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestVersionTag(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":  "v1.2.3",
		"(devel)": "devel",
		"":        "devel",
		"v0.0.0-20261202084508-5cdeced9a069+dirty": "v0.0.0-20261202084508-5cdeced9a069-dirty",
		strings.Repeat("a", 200):                   strings.Repeat("a", 128),
	} {
		if got := VersionTag(in); got != want {
			t.Errorf("VersionTag(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCreated: SOURCE_DATE_EPOCH first, then the commit's time, then the
// epoch; never the clock.
func TestCreated(t *testing.T) {
	withTime := Stamp{Time: "2026-12-02T08:45:08Z"}
	tests := []struct {
		name, epoch string
		s           Stamp
		want        time.Time
		err         bool
	}{
		{"SOURCE_DATE_EPOCH wins", "1700000000", withTime, time.Unix(1700000000, 0), false},
		{"the commit's time", "", withTime, time.Date(2026, 12, 2, 8, 45, 8, 0, time.UTC), false},
		{"neither: the epoch", "", Stamp{}, time.Unix(0, 0), false},
		{"SOURCE_DATE_EPOCH not a number", "yesterday", withTime, time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Created(tt.epoch, tt.s)
			if (err != nil) != tt.err || !got.Equal(tt.want) {
				t.Fatalf("Created = %v, %v; want %v (error %v)", got, err, tt.want, tt.err)
			}
		})
	}
}

// TestStampOf: the labels' version and commit are the binary's own
// build information, as `vmshelf version` reads it.
func TestStampOf(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/vmshelf/vmshelf", Version: "v0.0.0-20261202084508-5cdeced9a069+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "5cdeced9a069d35e4f9dccf17a474279d1b214bc"},
			{Key: "vcs.time", Value: "2026-12-02T08:45:08Z"}, {Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"}}}
	s := StampOf(bi)
	want := Stamp{Version: bi.Main.Version, Revision: "5cdeced9a069d35e4f9dccf17a474279d1b214bc", Time: "2026-12-02T08:45:08Z",
		Source: "https://github.com/vmshelf/vmshelf", GOOS: "linux", GOARCH: "arm64"}
	if s != want {
		t.Fatalf("StampOf = %+v, want %+v", s, want)
	}
	l := Labels(s, time.Unix(0, 0))
	if l[LabelVersion] != want.Version || l[LabelRevision] != want.Revision || l[LabelCreated] != "1970-01-01T00:00:00Z" {
		t.Errorf("labels %v", l)
	}
	if _, ok := Labels(Stamp{Version: "(devel)"}, time.Unix(0, 0))[LabelRevision]; ok {
		t.Error("a revision label for a binary that names no commit")
	}
	if got := StampOf(&debug.BuildInfo{}).Version; got != "(devel)" {
		t.Errorf("no version: %q, want (devel) as vmshelf version says", got)
	}
}

// TestBuildRefusesForeignBinaries: an image of a binary for another system
// would not start.
func TestBuildRefusesForeignBinaries(t *testing.T) {
	_, err := Build(Input{Binary: []byte("x"), Stamp: Stamp{GOOS: "darwin", GOARCH: "arm64"}})
	if err == nil || !strings.Contains(err.Error(), "GOOS=linux") {
		t.Fatalf("Build of a darwin binary: %v, want a refusal naming GOOS=linux", err)
	}
}

func TestRefs(t *testing.T) {
	got := Refs(Stamp{Version: "v1.2.3+dirty"})
	if want := []string{"localhost/vmshelf:latest", "localhost/vmshelf:v1.2.3-dirty"}; !slices.Equal(got, want) {
		t.Fatalf("Refs = %v, want %v", got, want)
	}
}
