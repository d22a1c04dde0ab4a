package web

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every reason code the edge can answer has a sentence in reasons.js's REASONS
// table: a refusal is shown in words, never as a bare code. The codes are
// read from the sources that answer them (the data plane, the control
// plane, the QCOW2 gate's reasons, the order cancellations, the rule of
// one reading of a head both planes answer), so a new code without words
// fails here.
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
	patterns := []*regexp.Regexp{
		regexp.MustCompile(`Status\w+, "([a-z]\w+)"`),      // apierr.New/Wrap(status, "reason", …)
		regexp.MustCompile(`Reason\w+\s*=\s*"(\w+)"`),      // the QCOW2 gate's reasons
		regexp.MustCompile(`\bcancel\w*\([^()]*, "(\w+)"`), // why an order was cancelled (cancel, cancelByBuyer)
		regexp.MustCompile(`reason := "(\w+)"`),            // the webhook's cancellation
		regexp.MustCompile(`ans\.Machines = "(\w+)"`),      // readiness of the market
	}
	codes := map[string]string{}
	for _, dir := range []string{"../../gateway", "..", "../../imagestore/qcow2", "../../internal/apierr", "../../internal/headerrule"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, re := range patterns {
				for _, m := range re.FindAllStringSubmatch(string(b), -1) {
					codes[m[1]] = f
				}
			}
		}
	}
	if len(codes) < 40 {
		t.Fatalf("found only %d reason codes in the sources: the patterns no longer match the code", len(codes))
	}
	for code, file := range codes {
		if !table[code] {
			t.Errorf("reason %q (answered in %s) has no sentence in reasons.js's REASONS", code, file)
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
