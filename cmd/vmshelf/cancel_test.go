package main

// Tests of 'vmshelf cancel' and of the tickets 'vmshelf images' lists
// (the built binary) against serve.

import (
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestE2ECancel: the unused tickets are listed after the images, marked as
// tickets, with their expiry in UTC; cancel gives one's place back at
// once, the data plane refuses it afterwards, and the refusals of cancel
// say why (a used ticket, an unknown one, a malformed id).
func TestE2ECancel(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "data"), nil)
	control := []string{"--control", s.ctlBase, "--token-file", filepath.Join(s.dataDir, "dev-token")}
	first, second := s.ticket(t, "first disk"), s.ticket(t, "second disk")

	r := vmshelf(t, append([]string{"images"}, control...)...)
	if r.code != 0 || !strings.Contains(r.stderr, "no images") {
		t.Fatalf("images with tickets only: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	wantTicketRows(t, r.stdout, []string{"first disk", "second disk"}, first, second)
	// The quota of 3 holds the two tickets and one more.
	third := s.ticket(t, "third disk")
	if code, body := s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"fourth"}`); code != http.StatusConflict {
		t.Fatalf("a fourth ticket: %d %s, want 409 imageQuota", code, body)
	}

	r = vmshelf(t, append([]string{"cancel", first.UploadID}, control...)...)
	if r.code != 0 || r.stdout != "cancelled "+first.UploadID+"\n" {
		t.Fatalf("cancel: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	fourth := s.ticket(t, "fourth disk") // in the place the cancel gave back
	disk, data := makeImage(t, work, "disk.qcow2")
	code, body := curl(t, "-T", disk, first.UploadURL)
	wantError(t, "an upload with the cancelled ticket", code, body, http.StatusGone, "ticketUsed")

	used := s.upload(t, third, disk, data)
	r = vmshelf(t, append([]string{"images"}, control...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("images: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	images, tickets, _ := strings.Cut(r.stdout, "\n\n")
	wantImageRows(t, images+"\n", []imageAnswer{used})
	wantTicketRows(t, tickets, []string{"second disk", "fourth disk"}, second, fourth)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in the refusal line
	}{
		{"a ticket an upload used", []string{"cancel", used.UploadID, second.UploadID}, 1,
			[]string{"cancelling ticket " + used.UploadID, "ticketUsed", "vmshelf rm", "not tried: " + second.UploadID}},
		{"an unknown ticket", []string{"cancel", strings.Repeat("0", 24)}, 1, []string{"no upload ticket with that upload_id", "ticketUnknown"}},
		{"the ticket instead of its id", []string{"cancel", second.Ticket}, 2, []string{"not an UPLOAD_ID", "not the ticket itself"}},
		{"no UPLOAD_ID", []string{"cancel"}, 2, []string{"cancel needs the UPLOAD_IDs of the tickets to cancel"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := vmshelf(t, append(tc.args, control...)...)
			line := refusal(t, r, tc.code)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q does not say %q", line, w)
				}
			}
			if strings.Contains(r.stderr, second.Ticket) || strings.Contains(r.stderr, s.token) {
				t.Errorf("printed a capability")
			}
		})
	}
	if st := s.status(t, s.token); len(st.Images) != 1 {
		t.Errorf("status lists %+v after the refusals; want the one image", st.Images)
	}
}

// wantTicketRows checks the table of unused tickets 'vmshelf images'
// prints: a header that says they are tickets, then a row per ticket in
// order, with its upload id, name, EFI and expiry minute (UTC); never the
// ticket itself.
func wantTicketRows(t *testing.T, out string, names []string, want ...ticketAnswer) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(want)+1 || !slices.Equal(columns.Split(lines[0], -1), []string{"UNUSED TICKET", "NAME", "EFI", "EXPIRES (UTC)"}) {
		t.Fatalf("tickets printed:\n%s\nwant a header and %d rows", out, len(want))
	}
	for i, tk := range want {
		row := []string{tk.UploadID, names[i], "false", tk.ExpiresAt.UTC().Format("2006-01-02 15:04")}
		if got := columns.Split(lines[i+1], -1); !slices.Equal(got, row) {
			t.Errorf("tickets row %d is %q, want %q", i+1, got, row)
		}
		if strings.Contains(out, tk.Ticket) {
			t.Errorf("images printed the ticket of %s", tk.UploadID)
		}
	}
}
