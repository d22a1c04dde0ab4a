package main

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestE2ETenantRemove: tenant rm while serve runs refuses a box that holds
// an image or an unused ticket, saying what and how it ends, and removes
// one that holds nothing: its token is refused at once. tenant list shows
// its times in UTC, saying so.
func TestE2ETenantRemove(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	work := t.TempDir()
	data := filepath.Join(work, "data")
	s := startServe(t, data, nil)
	r := vmshelf(t, "tenant", "add", "box1", "--sharing", "--in-mesh", "--data-dir", data)
	if r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	tok := strings.TrimSuffix(r.stdout, "\n")
	s.secret(tok)

	r = vmshelf(t, "tenant", "list", "--data-dir", data)
	header, rows, _ := strings.Cut(r.stdout, "\n")
	if r.code != 0 || !strings.HasSuffix(header, "CREATED (UTC)") {
		t.Fatalf("tenant list: exit %d, header %q; want the times' column to say UTC", r.code, header)
	}
	row := regexp.MustCompile(`(?m)^box1\s.*\s(\d{4}-\d\d-\d\d \d\d:\d\d)$`).FindStringSubmatch(rows)
	if row == nil {
		t.Fatalf("tenant list has no row for box1 ending in its time:\n%s", r.stdout)
	}
	added, err := time.Parse("2006-01-02 15:04", row[1]) // UTC when no zone is given
	if now := time.Now().UTC(); err != nil || now.Sub(added) < 0 || now.Sub(added) > 2*time.Minute {
		t.Errorf("box1 added at %q (%v); want the minute just past in UTC (now %v)", row[1], err, now)
	}

	// An unused ticket holds the box; so does dev's image.
	code, body := s.ctl(t, "/market/vm-images/ticket", tok, `{"name":"x","efi":false}`)
	if code != http.StatusCreated {
		t.Fatalf("ticket: %d %s", code, body)
	}
	var tk ticketAnswer
	decode(t, body, &tk)
	s.secret(tk.Ticket)
	disk, diskBytes := makeImage(t, work, "disk.qcow2")
	s.upload(t, s.ticket(t, "dev's disk"), disk, diskBytes)
	for _, c := range []struct{ name, says string }{
		{"box1", "1 unused upload ticket(s) (vmshelf cancel"},
		{"dev", "1 image(s) (the box removes them: vmshelf rm)"},
	} {
		r = vmshelf(t, "tenant", "rm", c.name, "--data-dir", data)
		if line := refusal(t, r, 1); !strings.Contains(line, c.says) || !strings.Contains(line, "tenant "+c.name+" was not removed") {
			t.Errorf("tenant rm %s says %q; want it to say %q", c.name, line, c.says)
		}
	}
	if code, body := s.ctl(t, "/market/vms/status", tok, ""); code != http.StatusOK {
		t.Fatalf("box1 after a refused rm: %d %s", code, body)
	}

	code, body = s.ctl(t, "/market/vm-images/ticket/cancel", tok, `{"upload_id":"`+tk.UploadID+`"}`)
	if code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, body)
	}
	r = vmshelf(t, "tenant", "rm", "box1", "--data-dir", data)
	if r.code != 0 || r.stdout != "removed box1\n" {
		t.Fatalf("tenant rm: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// The running serve refuses the token at once: no cache keeps it.
	code, body = s.ctl(t, "/market/vms/status", tok, "")
	wantError(t, "the removed box's token", code, body, http.StatusUnauthorized, "unauthorized")
	r = vmshelf(t, "tenant", "rm", "box1", "--data-dir", data)
	if line := refusal(t, r, 1); !strings.Contains(line, "no tenant named box1") {
		t.Errorf("tenant rm of a removed box says %q", line)
	}
	refusal(t, vmshelf(t, "tenant", "rm", "Bad Name", "--data-dir", data), 2)
	refusal(t, vmshelf(t, "tenant", "rm", "--data-dir", data), 2)
}
