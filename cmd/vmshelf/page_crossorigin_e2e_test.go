package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The Machines page opened from another machine: the page on one address
// (127.0.0.1, the control plane) uploads to the data plane on another
// (127.0.0.2), as a laptop does with a box's page on the LAN.

// otherLoopback is a free address on 127.0.0.2: another host than the
// page's 127.0.0.1 to a browser, on this machine.
func otherLoopback(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.2", port)
}

// crossOriginRun uploads disk from the page at pageURL to serve s and
// returns the row's end and the page's origin.
func crossOriginRun(t *testing.T, s *server, pageURL, disk, want string) (uploadRow, string) {
	t.Helper()
	pr := startPage(t, "crossorigin", 150*time.Second, map[string]string{
		"PAGE_URL": pageURL, "PAGE_TOKEN": s.token, "PAGE_FILE": disk, "PAGE_WANT": want,
	}, nil)
	pr.extra = s.logs
	var rep struct {
		commonReport
		End    uploadRow  `json:"end"`
		Listed pageImages `json:"listed"`
		Origin string     `json:"origin"`
	}
	pr.wait(&rep)
	return rep.End, rep.Origin
}

// TestPageCrossOrigin: with serve's defaults the page uploads to a data
// plane on another address (the page's own origin is allowed); when the
// page is opened at an address the edge does not allow, the page says in
// words that the browser blocked the upload (not that the edge is down),
// the try's ticket goes back to the quota, and serve logs the refused
// origin once with the flag that allows it.
func TestPageCrossOrigin(t *testing.T) {
	t.Parallel()
	browserDir(t)
	needTool(t, "qemu-img")
	work := t.TempDir()
	disk, b := randomQcow2(t, work, "laptop-disk.qcow2", 4)

	t.Run("allowed by default", func(t *testing.T) {
		ctl := freeAddr(t)
		s := startServeAt(t, filepath.Join(t.TempDir(), "data"), otherLoopback(t), ctl, nil)
		end, origin := crossOriginRun(t, s, s.ctlBase+"/machines", disk, "done")
		wantDone(t, end)
		imgs := s.status(t, s.token).Images
		if len(imgs) != 1 {
			t.Fatalf("status lists %d images, want 1", len(imgs))
		}
		wantImage(t, s, imgs[0].UploadID, b)
		if !strings.HasPrefix(s.dataBase, "http://127.0.0.2:") || origin != "http://"+ctl {
			t.Errorf("the page at %s uploaded to %s: want two hosts", origin, s.dataBase)
		}
	})

	// A box serving its LAN: both planes on every address, named by
	// --public-url alone; the page opened at that name uploads.
	t.Run("every address", func(t *testing.T) {
		_, dport, _ := net.SplitHostPort(freeAddr(t))
		_, cport, _ := net.SplitHostPort(freeAddr(t))
		s := startServeAt(t, filepath.Join(t.TempDir(), "data"), "0.0.0.0:"+dport, "0.0.0.0:"+cport,
			[]string{"--public-url", "http://127.0.0.2:" + dport})
		s.dataBase = "http://127.0.0.2:" + dport
		end, _ := crossOriginRun(t, s, "http://127.0.0.2:"+cport+"/machines", disk, "done")
		wantDone(t, end)
		if n := len(s.status(t, s.token).Images); n != 1 {
			t.Fatalf("status lists %d images, want 1", n)
		}
	})

	// The edge hands out an upload address where nothing listens: the
	// page says within seconds that nothing answers there, names it, and
	// gives the ticket back.
	t.Run("upload address dead", func(t *testing.T) {
		dead := otherLoopback(t)
		s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--public-url", "http://" + dead})
		end, _ := crossOriginRun(t, s, s.ctlBase+"/machines", disk, "refused")
		if end.Reason != "network" || !strings.Contains(end.Status, "Nothing answers at the edge's upload address http://"+dead) {
			t.Errorf("the refused row says %q (%s); want that nothing answers at %s", end.Status, end.Reason, dead)
		}
		poll(t, 400, 50*time.Millisecond, "the try's ticket back", func() bool { return len(s.status(t, s.token).Tickets) == 0 })
	})

	t.Run("origin not allowed", func(t *testing.T) {
		ctl := freeAddr(t)
		_, port, _ := net.SplitHostPort(ctl)
		// The edge names its page localhost; the browser opens it at
		// 127.0.0.1, an origin the data plane does not know.
		s := startServeAt(t, filepath.Join(t.TempDir(), "data"), otherLoopback(t), ctl,
			[]string{"--checkout-return-url", "http://localhost:" + port + "/machines"})
		end, origin := crossOriginRun(t, s, s.ctlBase+"/machines", disk, "refused")
		if end.Reason != "corsBlocked" || !strings.Contains(end.Status, "blocked") || !strings.Contains(end.Status, "--cors-origin "+origin) ||
			strings.Contains(end.Status, "could not be reached") {
			t.Errorf("the refused row says %q (%s); want the browser's block in words with the flag, not a network failure", end.Status, end.Reason)
		}
		poll(t, 400, 50*time.Millisecond, "the try's ticket back", func() bool {
			st := s.status(t, s.token)
			return len(st.Tickets) == 0 && len(st.Images) == 0
		})
		poll(t, 400, 25*time.Millisecond, "serve's line of the refused origin", func() bool {
			return strings.Count(s.logs(), "origin="+origin) == 1 && strings.Contains(s.logs(), `flag="--cors-origin `+origin+`"`)
		}, func() string { return grepLines(s.logs(), "origin") })
	})
}
