package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmshelf/vmshelf/market"
)

// apiMarkdownPath is the reference a person reads: its "Errors" table lists
// every (status, reason) an error answer can carry.
const apiMarkdownPath = "../../docs/api.md"

// errorTable reads docs/api.md's Errors table: each row's status and the
// reasons (in backquotes) of its reason column.
func errorTable(t *testing.T) map[answer]bool {
	t.Helper()
	table, err := readErrorTable()
	if err != nil {
		t.Fatal(err)
	}
	return table
}

func readErrorTable() (map[answer]bool, error) {
	b, err := os.ReadFile(apiMarkdownPath)
	if err != nil {
		return nil, err
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Errors\n")
	if start < 0 {
		return nil, fmt.Errorf("%s has no Errors section", apiMarkdownPath)
	}
	section := doc[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	table := map[answer]bool{}
	reason := regexp.MustCompile("`([a-z][A-Za-z0-9]*)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		status, err := strconv.Atoi(strings.TrimSpace(cells[1]))
		if err != nil {
			continue // the header and its rule
		}
		for _, m := range reason.FindAllStringSubmatch(cells[2], -1) {
			table[answer{status, m[1]}] = true
		}
	}
	if len(table) < 40 {
		return nil, fmt.Errorf("%s's Errors table reads as %d answers: the table's shape changed", apiMarkdownPath, len(table))
	}
	return table, nil
}

// documentedError says whether docs/api.md's Errors table lists the error
// answer (status, reason): every error answer the end-to-end tests get
// from the binary is checked with it (apiWatch.check).
var documentedError = sync.OnceValues(readErrorTable)

// TestAPIErrorTableCoversCode: the Errors table of docs/api.md lists every
// (status, reason) of the table of reasons, the one the code answers from,
// and nothing else.
func TestAPIErrorTableCoversCode(t *testing.T) {
	table := errorTable(t)
	answers := tableAnswers()
	for _, a := range sortedAnswers(answers) {
		if !table[a] {
			t.Errorf("the code answers %v (%q), which %s's Errors table does not list", a, answers[a], apiMarkdownPath)
		}
	}
	for _, a := range sortedAnswers(table) {
		if _, ok := answers[a]; !ok {
			t.Errorf("%s's Errors table lists %v, which the table of reasons does not have", apiMarkdownPath, a)
		}
	}
}

// TestWebhookEventsDocumented: docs/api.md's table of the webhook's events
// is the one list of them, and it is the list of events the market acts
// on, in that order; README and operations.md point to it instead of
// listing them again.
func TestWebhookEventsDocumented(t *testing.T) {
	b, err := os.ReadFile(apiMarkdownPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "### `POST /market/stripe/webhook`")
	end := strings.Index(doc[start+1:], "\n### ")
	if start < 0 || end < 0 {
		t.Fatalf("%s has no webhook section", apiMarkdownPath)
	}
	var listed []string
	row := regexp.MustCompile("(?m)^\\| `([a-z_.]+)`")
	for _, m := range row.FindAllStringSubmatch(doc[start:start+1+end], -1) {
		listed = append(listed, m[1])
	}
	if want := market.WebhookEvents(); !slices.Equal(listed, want) {
		t.Errorf("%s lists the webhook's events %q; the market acts on %q", apiMarkdownPath, listed, want)
	}
	for _, other := range []string{"../../README.md", "../../docs/operations.md"} {
		b, err := os.ReadFile(other)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "`checkout.session.async_payment_failed`"); n > 0 {
			t.Errorf("%s lists webhook events again (%d times); point to %s instead", other, n, apiMarkdownPath)
		}
	}
}
