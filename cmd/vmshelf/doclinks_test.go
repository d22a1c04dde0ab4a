package main

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDocsLinkInsideRepo: the repository stands on its own. Every link of
// its Markdown files (README.md, docs/, the packages' READMEs) is a web
// address, or a file of the repository that exists — relative, never out
// of the repository — and an anchor names a heading of its file.
func TestDocsLinkInsideRepo(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %d Markdown files under %s", len(files), root)
	}
	anchors := map[string]map[string]bool{} // file → its headings' anchors
	anchorsOf := func(p string) map[string]bool {
		if anchors[p] == nil {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			anchors[p] = headingAnchors(string(b))
		}
		return anchors[p]
	}
	links := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, target := range markdownLinks(string(b)) {
			links++
			if problem := checkLink(root, file, target, anchorsOf); problem != "" {
				t.Errorf("%s: link %q %s", rel, target, problem)
			}
		}
	}
	if links < 10 {
		t.Fatalf("found only %d links; the test no longer reads them", links)
	}
}

// checkLink says what is wrong with target, a link in file, or "".
func checkLink(root, file, target string, anchorsOf func(string) map[string]bool) string {
	u, err := url.Parse(target)
	switch {
	case err != nil:
		return "is not a URL"
	case u.Scheme == "https" || u.Scheme == "http" || u.Scheme == "mailto":
		if h := u.Hostname(); h == "localhost" || strings.HasPrefix(h, "127.") {
			return "points at this machine, not at the repository or the web"
		}
		return ""
	case u.Scheme != "" || u.Host != "":
		return "has a scheme other than http(s)"
	case strings.HasPrefix(u.Path, "/"):
		return "is an absolute path; link files of the repository relatively"
	}
	dest := file
	if u.Path != "" {
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(u.Path))
		if r, err := filepath.Rel(root, dest); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			return "leaves the repository"
		}
		if _, err := os.Stat(dest); err != nil {
			return "names no file of the repository"
		}
	}
	if u.Fragment != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[u.Fragment] {
		return "names no heading of " + filepath.Base(dest)
	}
	return ""
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	codeSpan   = regexp.MustCompile("`[^`\\n]*`")
	inlineLink = regexp.MustCompile(`!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlLink   = regexp.MustCompile(`(?i)<(?:a|img)\b[^>]*\b(?:href|src)\s*=\s*"([^"]+)"`)
	heading    = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
)

// markdownLinks returns the targets of a Markdown text's links (inline,
// reference definitions, HTML a/img), outside code.
func markdownLinks(md string) []string {
	md = fence.ReplaceAllString(md, "")
	md = codeSpan.ReplaceAllString(md, "``")
	var out []string
	for _, re := range []*regexp.Regexp{inlineLink, refLink, htmlLink} {
		for _, m := range re.FindAllStringSubmatch(md, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingAnchors are the anchors GitHub gives a text's headings: lower
// case, punctuation but '-' and '_' dropped, spaces as '-', repeats
// numbered.
func headingAnchors(md string) map[string]bool {
	md = fence.ReplaceAllString(md, "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(md, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && !strings.ContainsRune("—–…·→", r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
