package gateway

import (
	"bytes"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// TestTusCheckpointInterval: a running PATCH makes its progress durable
// once CheckpointInterval has passed since the last checkpoint, however
// few bytes came meanwhile, so a crash costs a slow upload at most that
// long of its bytes. The interval is not the default and the bytes never
// reach CheckpointBytes: one nanosecond short of the interval nothing is
// saved, exactly at it the offset is.
func TestTusCheckpointInterval(t *testing.T) {
	const interval = time.Minute // the default is 15 s
	// The base image and zeros behind it: the upload never ends, and its
	// body is long enough for the server to stream it to the handler.
	img := append(qcow2test.Base(), make([]byte, 8<<20)...)
	// A clock that moves only when told: the harness's runs on with the
	// real one, and a nanosecond is a boundary only on a still clock.
	// The idle timeout outlasts the test, as the socket deadlines are
	// set from this clock.
	clk := fakeclock.NewStill(time.Now())
	e := newEnv(t, func(c *Config) {
		c.Now, c.IdleTimeout = clk.Now, 2*time.Minute
		c.CheckpointInterval, c.CheckpointBytes = interval, 1<<40
	})
	sess, _ := e.create(len(img))
	rc := slowPatch(t, e, sess, 0, len(img), img[:100000])
	waitFor(t, "the PATCH to take its first 100000 bytes", func() bool { return uploadedBytes(e) == 100000 })

	clk.Advance(interval - time.Nanosecond)
	rc.send(img[100000:101000], "1000 bytes a nanosecond before the interval")
	waitFor(t, "the PATCH to take 1000 bytes more", func() bool { return uploadedBytes(e) == 101000 })
	if off, _ := headOffset(t, sess); off != 0 {
		t.Fatalf("durable offset %d before the interval passed, want 0", off)
	}

	clk.Advance(time.Nanosecond)
	rc.send(img[101000:102000], "1000 bytes at the interval")
	waitFor(t, "the checkpoint at the interval", func() bool {
		off, _ := headOffset(t, sess)
		return off > 101000 && off <= 102000
	})
	rc.c.Close()
	e.waitSlotFreed(dirUpload)
}

// TestTusSessionExpiresAtItsInstant: a session is dead at its ExpiresAt,
// like a ticket or a token, whether or not the sweep has run: a
// nanosecond before it HEAD finds it, at it 404 sessionUnknown.
func TestTusSessionExpiresAtItsInstant(t *testing.T) {
	clk := fakeclock.NewStill(time.Now())
	e := newEnv(t, func(c *Config) { c.Now = clk.Now })
	sess, _ := e.create(len(qcow2test.Base()))
	clk.Advance(sessionTTL - time.Nanosecond)
	if off, code := headOffset(t, sess); code != 200 || off != 0 {
		t.Fatalf("a nanosecond before the expiry: HEAD %d at %d, want 200 at 0", code, off)
	}
	clk.Advance(time.Nanosecond)
	resp, b := tusReq(t, "HEAD", sess, nil)
	if resp.StatusCode != 404 {
		t.Fatalf("at the expiry: HEAD %d %s, want 404", resp.StatusCode, b)
	}
	resp, b = patch(t, sess, 0, qcow2test.Base())
	if resp.StatusCode != 404 || errorOf(t, bytes.NewReader(b)).Reason != "sessionUnknown" {
		t.Fatalf("at the expiry: PATCH %d %s, want 404 sessionUnknown", resp.StatusCode, b)
	}
}
