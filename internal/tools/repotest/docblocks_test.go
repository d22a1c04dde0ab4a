package repotest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocBlocksFailLoudly: a reader pastes the shell blocks of README.md
// and docs/; a refused request must stop there with the refusal's words,
// not pass an error body on as if it were the answer (a curl -s alone
// exits 0 on a 4xx and prints nothing of it when its output goes to a
// file). So every curl of a ```sh block asks for failure (--fail-with-body,
// or --fail where the body is not an answer: a download to a file, a HEAD)
// and for its error messages (-sS, or no -s at all); or it prints the
// status itself (-w '%{http_code}…', a checker of many URLs).
func TestDocBlocksFailLoudly(t *testing.T) {
	root := repoRoot(t)
	files := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "docs/deploy/*.md", "bench/*.md", "provisioner/kubetest/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	curls := 0
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range docCurls(string(b)) {
			curls++
			if problem := curlQuiet(c.text); problem != "" {
				t.Errorf("%s:%d: %s\n%s", name, c.line, problem, c.text)
			}
		}
	}
	if curls == 0 {
		t.Fatal("no curl found in any block: the scan is broken")
	}
}

type docCurl struct {
	line int
	text string // the command, continuation lines joined
}

// docCurls finds each curl command of the text's ```sh blocks.
func docCurls(text string) []docCurl {
	var out []docCurl
	lines := strings.Split(text, "\n")
	in := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case l == "```sh":
			in = true
			continue
		case strings.HasPrefix(l, "```"):
			in = false
			continue
		}
		if !in || !curlWord.MatchString(l) {
			continue
		}
		c := docCurl{line: i + 1, text: l}
		for strings.HasSuffix(strings.TrimRight(c.text, " "), "\\") && i+1 < len(lines) {
			i++
			c.text += "\n" + lines[i]
		}
		out = append(out, c)
	}
	return out
}

var (
	curlWord = regexp.MustCompile(`(^|[\s$(|])curl\s`)
	// a flag word: --fail-with-body, or a short-flag cluster like -sSf.
	curlFlags = regexp.MustCompile(`\s(-[A-Za-z]+|--[a-z-]+)`)
)

// curlQuiet says what is wrong with a curl command that would let a
// refusal pass quietly, or "".
func curlQuiet(cmd string) string {
	cmd, _, _ = strings.Cut(cmd, " #") // a trailing comment is not a flag
	var silent, showErr, fail bool
	for _, m := range curlFlags.FindAllStringSubmatch(cmd, -1) {
		f := m[1]
		switch {
		case f == "--fail-with-body" || f == "--fail":
			fail = true
		case f == "--silent":
			silent = true
		case f == "--show-error":
			showErr = true
		case !strings.HasPrefix(f, "--"):
			silent = silent || strings.Contains(f, "s")
			showErr = showErr || strings.Contains(f, "S")
			fail = fail || strings.Contains(f, "f")
		}
	}
	switch {
	case !fail && strings.Contains(cmd, "%{http_code}"):
		return "" // it prints the status itself: a checker of many URLs
	case !fail:
		return "curl without --fail-with-body (or --fail): a refusal passes as an answer"
	case silent && !showErr:
		return "curl -s without -S: a refusal's error is not printed"
	}
	return ""
}
