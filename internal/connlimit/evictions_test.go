package connlimit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Each plane's evictions land in its own series of the one counter.
func TestEvictionsCountedPerPlane(t *testing.T) {
	reg := prometheus.NewRegistry()
	ev, err := NewEvictions(reg)
	if err != nil {
		t.Fatal(err)
	}
	var data, ctl Listener
	ev.Counted("data")(&data)
	ev.Counted("control")(&ctl)
	data.onEvict()
	data.onEvict()
	ctl.onEvict()
	if got := testutil.ToFloat64(ev.vec.WithLabelValues("data")); got != 2 {
		t.Errorf("data evictions = %v, want 2", got)
	}
	if got := testutil.ToFloat64(ev.vec.WithLabelValues("control")); got != 1 {
		t.Errorf("control evictions = %v, want 1", got)
	}
	if _, err := NewEvictions(reg); err == nil {
		t.Error("a second counter on the same registry was accepted")
	}
}
