package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var errNotReady = errors.New("cluster unreachable")

func notReady() error { return errNotReady }

// gaugeValue reads vmshelf_leader from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "vmshelf_leader" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no vmshelf_leader")
	return 0
}

// runJob runs j with a lead that reports its start and waits for its
// context; it returns the start channel and a stop that waits for Run.
func runJob(j *Job) (started <-chan struct{}, stop func()) {
	s := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run(ctx, func(ctx context.Context) { s <- struct{}{}; <-ctx.Done() })
	}()
	return s, func() { cancel(); <-done }
}

func waitStarted(t *testing.T, started <-chan struct{}) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(waitLimit):
		t.Fatal("the work did not start")
	}
}

// Alone on its store a process always leads: the gauge is 1 and its
// readiness is the cluster's.
func TestJobAlone(t *testing.T) {
	reg := prometheus.NewRegistry()
	j, err := NewJob(Config{}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, reg); got != 1 {
		t.Errorf("vmshelf_leader = %v alone, want 1", got)
	}
	if err := j.WhileLeading(notReady)(); !errors.Is(err, errNotReady) {
		t.Errorf("readiness alone = %v, want the cluster's", err)
	}
	if j.WhileLeading(nil) != nil {
		t.Error("a nil readiness became a check")
	}
	started, stop := runJob(j)
	waitStarted(t, started)
	stop()
}

// Over a shared store the gauge and the readiness follow the lease.
func TestJobShared(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	j, err := NewJob(Config{Leases: w.store, Name: lease, Holder: "a"}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, reg); got != 0 {
		t.Errorf("vmshelf_leader = %v before the lease is held, want 0", got)
	}
	if err := j.WhileLeading(notReady)(); err != nil {
		t.Errorf("readiness of a replica that does not lead = %v, want nil", err)
	}
	started, stop := runJob(j)
	defer stop()
	waitStarted(t, started)
	if got := gaugeValue(t, reg); got != 1 {
		t.Errorf("vmshelf_leader = %v while leading, want 1", got)
	}
	if err := j.WhileLeading(notReady)(); !errors.Is(err, errNotReady) {
		t.Errorf("readiness while leading = %v, want the cluster's", err)
	}
	if got := testutil.CollectAndCount(reg, "vmshelf_leader"); got != 1 {
		t.Errorf("%d vmshelf_leader series, want 1", got)
	}
}
