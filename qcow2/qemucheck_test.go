package qcow2_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2"
	q "github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// notFlaggedByQemuCheck are the synthetic cases the gate refuses as
// corrupt although `qemu-img check` does not flag them: where the gate is
// deliberately stricter than QEMU's own check. docs/image-safety.md ("How
// it is tested") names them and counts them; TestCorruptAgainstQemuCheck
// holds both the list and the count to what qemu-img check does.
var notFlaggedByQemuCheck = map[string]string{
	"header/corrupt bit":                   "QEMU's corrupt bit on sound tables: check finds nothing wrong with them",
	"structure/truncated before L1":        "an L1 table cut by the end of the file: QEMU reads zeros",
	"structure/L1 partly outside":          "an L1 table cut by the end of the file: QEMU reads zeros",
	"structure/zero flag in v2":            "check passes, convert fails",
	"structure/zero flag with extended L2": "the spec forbids it",
	"structure/compressed runs past EOF":   "a compressed extent past the sector holding the end of the file",
}

// numberWords spells the counts the docs may use.
var numberWords = []string{"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}

// qemuCheckClaim is the docs' sentence, up to the count.
const qemuCheckClaim = "`qemu-img check` flags all but "

// TestQemuCheckClaim holds, without qemu-img, the half of the docs' claim
// that needs no tool: the docs count notFlaggedByQemuCheck right, and the
// gate refuses each of those cases as corrupt. A gate that lets one of
// them through ships it to a QEMU whose check would not notice.
func TestQemuCheckClaim(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "image-safety.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ") // the sentence wraps
	if n := len(notFlaggedByQemuCheck); n >= len(numberWords) {
		t.Fatalf("%d cases qemu-img check does not flag: too many to be a deliberate few", n)
	} else if claim := qemuCheckClaim + numberWords[n] + " "; !strings.Contains(text, claim) {
		t.Errorf("docs/image-safety.md does not say %q: it must count the %d cases listed here", claim, n)
	}
	found := 0
	for _, c := range q.Synthetic() {
		if _, ok := notFlaggedByQemuCheck[c.Name]; !ok {
			continue
		}
		found++
		if c.Want != qcow2.ReasonCorrupt {
			t.Errorf("%s: listed as corrupt but not flagged, yet the corpus wants %q", c.Name, c.Want)
		}
		_, _, err := qcow2.Inspect(bytes.NewReader(c.Data), int64(len(c.Data)), q.Limits)
		if got := reason(err); got != qcow2.ReasonCorrupt {
			t.Errorf("%s: the gate says %q, want corrupt: qemu-img check would not catch it (%s)",
				c.Name, got, notFlaggedByQemuCheck[c.Name])
		}
	}
	if found != len(notFlaggedByQemuCheck) {
		t.Errorf("%d of the %d cases listed in notFlaggedByQemuCheck are synthetic cases", found, len(notFlaggedByQemuCheck))
	}
}

// TestCorruptAgainstQemuCheck checks the docs' claim about `qemu-img
// check` over the cases the gate calls corrupt: every synthetic case
// whose verdict is corrupt is written to a file and checked, and the
// cases it does not flag must be exactly notFlaggedByQemuCheck (whose
// count TestQemuCheckClaim holds the docs to). "Flags" is exit status 2
// (corruption found) or 1 (the image would not open, or the check could
// not finish); 0 (clean) and 3 (only leaked clusters, which we allow too)
// do not flag.
func TestCorruptAgainstQemuCheck(t *testing.T) {
	qm := qemuTools(t)
	dir := t.TempDir()
	var unflagged, corrupt []string
	for _, c := range q.Synthetic() {
		if c.Want != qcow2.ReasonCorrupt {
			continue
		}
		corrupt = append(corrupt, c.Name)
		path := filepath.Join(dir, "case.qcow2")
		if err := os.WriteFile(path, c.Data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := qm.exec(t, "check", path)
		switch code {
		case 1, 2:
		case 0, 3:
			unflagged = append(unflagged, c.Name)
		default:
			t.Errorf("%s: qemu-img check exit status %d, want 0 to 3\n%s", c.Name, code, out)
		}
	}
	if len(corrupt) == 0 {
		t.Fatal("no synthetic case is corrupt")
	}
	for _, name := range unflagged {
		if notFlaggedByQemuCheck[name] == "" {
			t.Errorf("qemu-img check does not flag %q, which the docs do not list", name)
		}
	}
	for name, why := range notFlaggedByQemuCheck {
		if !slices.Contains(unflagged, name) {
			t.Errorf("qemu-img check flags %q (or it is no corrupt case), listed as not flagged: %s", name, why)
		}
	}
	t.Logf("%d corrupt cases, %d not flagged by qemu-img check: %q", len(corrupt), len(unflagged), unflagged)
}
