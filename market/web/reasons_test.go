package web

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/reason"
)

// Every reason the page can meet has a sentence in reasons.js's REASONS table:
// a refusal is shown in words, never as a bare code. The reasons are the
// edge's table of them (internal/reason): every error answer of both
// planes, and the reasons answers carry in fields of their own (why an
// order was cancelled, why the market cannot run machines); besides them,
// the page's own reasons. A new reason without words fails here.
func TestEveryReasonHasWords(t *testing.T) {
	app, err := os.ReadFile(filepath.Join("static", "reasons.js"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(app), "const REASONS = {")
	end := strings.Index(string(app)[start:], "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("reasons.js has no REASONS table")
	}
	table := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(\w+): '`).FindAllStringSubmatch(string(app)[start:start+end], -1) {
		table[m[1]] = true
	}
	for _, r := range reason.All() {
		if !table[r.Name()] {
			t.Errorf("reason %q (%d: %s) has no sentence in reasons.js's REASONS", r.Name(), r.Status(), r.Words())
		}
	}
	for _, code := range reason.Fields() {
		if !table[code] {
			t.Errorf("the field reason %q has no sentence in reasons.js's REASONS", code)
		}
	}
	// The page's own reasons, named in the DOM contract.
	for _, code := range []string{"proxyTooLarge", "network", "tooLarge", "notQcow2", "imageQuota", "noSpace", "virtualSizeTooLarge", "backingFile"} {
		if !table[code] {
			t.Errorf("the page's reason %q has no sentence", code)
		}
	}
}

// Every close code a console's WebSocket ends with (market/console.go's
// close… constants, and the normal close of a console the machine ended)
// has words in console.js's CLOSE_WORDS: the page says why a console
// closed, never a bare number.
func TestEveryConsoleCloseHasWords(t *testing.T) {
	js, err := os.ReadFile(filepath.Join("static", "console.js"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(js), "const CLOSE_WORDS = {")
	end := strings.Index(string(js)[start:], "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("console.js has no CLOSE_WORDS table")
	}
	table := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(\d+): '`).FindAllStringSubmatch(string(js)[start:start+end], -1) {
		table[m[1]] = true
	}
	src, err := os.ReadFile(filepath.Join("..", "console.go"))
	if err != nil {
		t.Fatal(err)
	}
	codes := regexp.MustCompile(`close\w+\s+websocket\.StatusCode = (\d+)`).FindAllStringSubmatch(string(src), -1)
	if len(codes) < 6 {
		t.Fatalf("found only %d close codes in market/console.go: the pattern no longer matches the code", len(codes))
	}
	if !strings.Contains(string(src), "websocket.StatusNormalClosure") {
		t.Fatal("market/console.go no longer ends a console with a normal close: update this test")
	}
	for _, c := range append(codes, []string{"", "1000"}) {
		if !table[c[1]] {
			t.Errorf("close code %s has no sentence in console.js's CLOSE_WORDS", c[1])
		}
	}
}
