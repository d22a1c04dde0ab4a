package uploadclient

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestUploadProgressPlain: without a terminal, a line at most every 10 %
// or 5 s, and a last one at the end.
func TestUploadProgressPlain(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, 1000)
	now := time.Unix(0, 0)
	p.now = func() time.Time { return now }
	p.begin(0)
	for pos := int64(1); pos <= 1000; pos++ {
		now = now.Add(time.Millisecond)
		p.sent(pos)
	}
	p.done()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 10 || len(lines) > 11 || !strings.Contains(lines[len(lines)-1], "(100%)") {
		t.Errorf("progress printed %d lines, want 10 or 11 ending at 100%%:\n%s", len(lines), out.String())
	}
	if strings.Contains(out.String(), "\r") {
		t.Errorf("plain progress has carriage returns")
	}

	// Slow: a line every 5 s even without 10 % more.
	out.Reset()
	p = newProgress(&out, 1<<30)
	p.now = func() time.Time { return now }
	p.begin(0)
	for i := int64(1); i <= 60; i++ {
		now = now.Add(time.Second)
		p.sent(i << 10)
	}
	if n := strings.Count(out.String(), "\n"); n != 12 {
		t.Errorf("a minute of slow progress printed %d lines, want 12:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "1.0 KiB/s") || !strings.Contains(out.String(), "ETA ") {
		t.Errorf("progress lines lack the rate or the time left:\n%s", out.String())
	}
}

// TestUploadProgressTerminal: on a terminal one line is redrawn in place
// and cleared for messages.
func TestUploadProgressTerminal(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, 1000)
	p.tty = true
	now := time.Unix(0, 0)
	p.now = func() time.Time { return now }
	p.begin(0)
	for pos := int64(100); pos <= 500; pos += 100 {
		now = now.Add(time.Second)
		p.sent(pos)
	}
	p.interrupt() // a message comes
	now = now.Add(time.Second)
	p.sent(1000)
	p.done()
	s := out.String()
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || strings.Count(s, "\r\033[K") < 7 {
		t.Errorf("terminal progress should redraw one line and end it once: %q", s)
	}
	if !strings.Contains(s, "500 B / 1000 B  50%  100 B/s  ETA 0:05") || !strings.Contains(s, "1000 B / 1000 B  100%") {
		t.Errorf("the drawings lack bytes, percent, rate or time left: %q", s)
	}

	// An upload that stops short leaves no made-up final state.
	out.Reset()
	p = newProgress(&out, 1000)
	p.now = func() time.Time { return now }
	p.begin(0)
	now = now.Add(time.Second)
	p.sent(50) // under 10 %, under 5 s: no line yet
	p.done()
	if out.Len() != 0 {
		t.Errorf("plain progress of a stopped upload: %q", out.String())
	}
}
