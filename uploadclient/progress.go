package uploadclient

import (
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"
)

// progress shows how far an upload got: on a terminal one line redrawn in
// place (bytes, percent, rate, time left); otherwise a plain line at most
// every 10 % or 5 s, for logs.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	total int64
	now   func() time.Time

	pos       int64     // file offset sent so far
	rate      float64   // bytes per second, smoothed
	sample    time.Time // when rate was last updated
	samplePos int64     // pos then
	beginAt   time.Time // when this stretch of sending began
	beginPos  int64     // pos then
	lastDraw  time.Time
	lastPos   int64 // pos of the last plain line
	drawn     bool  // a terminal line is showing
	started   bool
}

func newProgress(w io.Writer, total int64) *progress {
	p := &progress{w: w, total: total, now: time.Now}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// begin starts sending at off (again, after a retry).
func (p *progress) begin(off int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.pos, p.sample, p.samplePos = off, now, off
	p.beginAt, p.beginPos = now, off
	if !p.started {
		p.started, p.lastDraw, p.lastPos = true, now, off
	}
}

// sent notes that the file up to pos was handed to the connection.
func (p *progress) sent(pos int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pos = pos
	now := p.now()
	if dt := now.Sub(p.sample); dt >= 250*time.Millisecond {
		inst := float64(p.pos-p.samplePos) / dt.Seconds()
		if p.rate == 0 {
			p.rate = inst
		} else {
			a := 1 - math.Exp(-dt.Seconds()/5) // about the last 5 s
			p.rate += a * (inst - p.rate)
		}
		p.sample, p.samplePos = now, p.pos
	}
	switch {
	case p.tty && now.Sub(p.lastDraw) >= 200*time.Millisecond:
		p.draw(now)
	case !p.tty && (p.pos-p.lastPos >= p.total/10 || now.Sub(p.lastDraw) >= 5*time.Second) && p.pos != p.lastPos:
		p.line(now)
	}
}

func (p *progress) draw(now time.Time) {
	fmt.Fprintf(p.w, "\r\033[K%s / %s  %s  %s  %s", sizeIEC(p.pos), sizeIEC(p.total), percent(p.pos, p.total), p.rateText(), p.etaText())
	p.drawn, p.lastDraw = true, now
}

func (p *progress) line(now time.Time) {
	fmt.Fprintf(p.w, "sent %s of %s (%s), %s, %s\n", sizeIEC(p.pos), sizeIEC(p.total), percent(p.pos, p.total), p.rateText(), p.etaText())
	p.lastDraw, p.lastPos = now, p.pos
}

// speed is the smoothed rate, or the average of this stretch before the
// first sample.
func (p *progress) speed() float64 {
	if p.rate > 0 {
		return p.rate
	}
	if dt := p.now().Sub(p.beginAt).Seconds(); dt > 0 && p.pos > p.beginPos {
		return float64(p.pos-p.beginPos) / dt
	}
	return 0
}

func (p *progress) rateText() string {
	if p.speed() <= 0 {
		return "-- /s"
	}
	return sizeIEC(int64(p.speed())) + "/s"
}

func (p *progress) etaText() string {
	left := p.total - p.pos
	if left <= 0 {
		return "done"
	}
	r := p.speed()
	if r <= 0 {
		return "ETA --"
	}
	return "ETA " + clock(time.Duration(float64(left)/r*float64(time.Second)))
}

// interrupt clears a terminal line so that a message can be printed.
func (p *progress) interrupt() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// done ends the display. A finished upload's last state stays on the
// terminal, or gets a last line in a log; an unfinished one shows nothing
// more (what was handed to the connection is not what the edge kept).
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		return
	}
	now := p.now()
	if p.tty {
		if p.pos == p.total {
			p.draw(now)
		}
		if p.drawn {
			fmt.Fprintln(p.w)
		}
		p.drawn = false
	} else if p.pos == p.total && p.pos != p.lastPos {
		p.line(now)
	}
	p.lastPos = p.pos
	p.started = false
}

// sizeIEC is a byte count for people: 1.5 GiB.
func sizeIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, exp := float64(n)/unit, 0
	for v >= unit && exp < 4 {
		v /= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[exp])
}

func percent(n, total int64) string {
	if total <= 0 {
		return "100%"
	}
	return fmt.Sprintf("%d%%", int(float64(n)*100/float64(total)))
}

// clock is a duration as h:mm:ss or m:ss.
func clock(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 100*3600 {
		return ">99h"
	}
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
