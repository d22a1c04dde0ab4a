package web

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runTransferCheck runs one group of testdata/transfercheck.mjs, the unit
// tests of the page's upload rules (static/transfer.js) under node with a
// fake tus-js-client, API, fetch and clock: no browser, no DOM, no
// network. Every broken rule is on node's stderr.
func runTransferCheck(t *testing.T, group string) {
	t.Helper()
	node := needTool(t, "node", "apt-get install nodejs")
	script, err := filepath.Abs(filepath.Join("testdata", "transfercheck.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), node, script, pageModule(t, "transfer.js"), group)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node transfercheck.mjs %s: %v\n%s%s", group, err, stdout.Bytes(), stderr.Bytes())
	}
	if !strings.HasPrefix(stdout.String(), "ok "+group+":") {
		t.Fatalf("node transfercheck.mjs %s printed %q, want its ok line", group, stdout.Bytes())
	}
	t.Log(strings.TrimSpace(stdout.String()))
}

// A failed request is tried again where trying again may pass: a conflict
// or a locked session, a slow request, a busy or restarting edge, a 5xx
// other than a full disk, a body cut short, no answer, a proxy's 413 (with
// smaller parts); a ticket refused for the rate is asked for again after
// the wait the edge names. Retry stays offered after such a stop.
func TestTransferRetries(t *testing.T) { runTransferCheck(t, "retries") }

// A failed request is not tried again where the answer stays the same: a
// verdict on the image, a lost session, a full disk, a refused rate, the
// edge's own tooLarge, a CORS block, an edge silent past its quick tries,
// a cancelled upload, a ticket refused for the quota or past its tries.
func TestTransferNoRetry(t *testing.T) { runTransferCheck(t, "noRetry") }

// A proxy's 413, or two PATCHes lost while HEAD answers, halves the parts
// from 8 MiB down to 1 MiB and never below; there the upload stops as
// proxyTooLarge.
func TestTransferHalving(t *testing.T) { runTransferCheck(t, "halving") }

// Files chosen start in the order chosen, the next waiting one whenever a
// transfer ends; a retried file waits its turn.
func TestTransferQueueOrder(t *testing.T) { runTransferCheck(t, "queueOrder") }

// At most the edge's max_transfers (at least one) run at once.
func TestTransferQueueLimit(t *testing.T) { runTransferCheck(t, "queueLimit") }
