package headerrule

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// judge reads a head given as its header lines' names.
func judge(names ...string) *Head {
	var h Head
	for _, n := range names {
		h.Line([]byte(n))
	}
	return &h
}

func TestRepeatedSingleRefused(t *testing.T) {
	for _, name := range singles {
		for _, second := range []string{name, strings.ToLower(name), strings.ToUpper(name)} {
			got := judge("Accept", name, "X-Other", second).Refusal(true)
			if !errors.Is(got, RepeatedHeader) || !strings.Contains(got.Msg, name) {
				t.Errorf("%s then %s: %v, want repeatedHeader naming %s", name, second, got, name)
			}
		}
		if got := judge(name, "Accept").Refusal(true); got != nil {
			t.Errorf("%s once: %v, want none", name, got)
		}
	}
}

// The first header given twice is the one named.
func TestFirstRepeatNamed(t *testing.T) {
	got := judge("Upload-Offset", "Range", "Range", "Upload-Offset").Refusal(true)
	if got == nil || !strings.Contains(got.Msg, "Range") || strings.Contains(got.Msg, "Upload-Offset") {
		t.Errorf("%v, want Range named", got)
	}
}

func TestListsMayRepeat(t *testing.T) {
	for _, name := range []string{"Accept", "Accept-Encoding", "Cache-Control", "Forwarded", "X-Forwarded-For",
		"If-None-Match", "If-Match", "Connection", "Access-Control-Request-Headers", "Via", "User-Agent-X", "",
		"Content-Lengthy", "Hostx", strings.Repeat("x", 100)} {
		if got := judge(name, name, name).Refusal(true); got != nil {
			t.Errorf("%q three times: %v, want none", name, got)
		}
	}
}

func TestFraming(t *testing.T) {
	for _, c := range []struct {
		names  []string
		http11 bool
		want   error
	}{
		{[]string{"Content-Length"}, true, nil},
		{[]string{"transfer-encoding"}, true, nil},
		{[]string{"Content-Length", "Transfer-Encoding"}, true, AmbiguousLength},
		{[]string{"TRANSFER-ENCODING", "content-length"}, true, AmbiguousLength},
		{[]string{"Transfer-Encoding"}, false, AmbiguousLength},
		{[]string{"Content-Length"}, false, nil},
		{[]string{"Content-Length", "Content-Length", "Transfer-Encoding"}, true, RepeatedHeader},
	} {
		got := judge(c.names...).Refusal(c.http11)
		if (c.want == nil) != (got == nil) || (got != nil && !errors.Is(got, c.want)) {
			t.Errorf("%q (HTTP/1.1 %v): %v, want %v", c.names, c.http11, got, c.want)
		}
		if got != nil && errors.Is(got, AmbiguousLength) && !strings.Contains(got.Msg, "Transfer-Encoding") {
			t.Errorf("%q: %q does not name Transfer-Encoding", c.names, got.Msg)
		}
	}
}

func TestHeadAllocatesNothing(t *testing.T) {
	names := [][]byte{[]byte("Host"), []byte("User-Agent"), []byte("Accept"), []byte("Range"), []byte("Authorization")}
	if n := testing.AllocsPerRun(100, func() {
		var h Head
		for _, n := range names {
			h.Line(n)
		}
		_ = h.Refusal(true)
	}); n != 0 {
		t.Errorf("%v allocations per head, want 0", n)
	}
}

func TestSinglesFitTheSet(t *testing.T) {
	if len(singles) > 32 {
		t.Fatalf("%d singles do not fit Head.seen's 32 bits", len(singles))
	}
	if singles[contentLength] != "Content-Length" || singles[transferEncoding] != "Transfer-Encoding" {
		t.Fatal("contentLength and transferEncoding do not index their names")
	}
}

// docs/api.md lists the headers refused when repeated, the same as the
// code: the headers its section "One reading of every header" lists in
// its first paragraph, after "in more than one line:" up to the full stop.
func TestSinglesDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### One reading of every header\n\n")
	if !ok {
		t.Fatal(`docs/api.md has no section "### One reading of every header"`)
	}
	para, _, _ := strings.Cut(section, "\n\n")
	_, list, ok := strings.Cut(para, "in more than one line:")
	if !ok {
		t.Fatalf(`the section's first paragraph has no list after "in more than one line:": %q`, para)
	}
	list, _, _ = strings.Cut(list, ".")
	var documented []string
	for _, m := range regexp.MustCompile("`([A-Za-z-]+)`").FindAllStringSubmatch(list, -1) {
		documented = append(documented, m[1])
	}
	want := slices.Clone(singles[:])
	slices.Sort(want)
	slices.Sort(documented)
	if !slices.Equal(documented, want) {
		t.Errorf("docs/api.md lists %q as refused when repeated; the code refuses %q", documented, want)
	}
}
