package leader

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Job is a process's part in the work that must run once over the
// replicas of a store: alone on its store a process always runs it; over
// a shared store, only while it holds the lease.
type Job struct {
	ldr  *Leader                   // nil: alone on the store
	lead func(ctx context.Context) // the work, set by Run
}

// NewJob makes the Job of cfg, a Leader's configuration without Lead (Run
// is given the work). A nil cfg.Leases means the process is alone on its
// store. The gauge vmshelf_leader, registered on reg, says whether this
// replica runs the work.
func NewJob(cfg Config, reg prometheus.Registerer) (*Job, error) {
	j := &Job{}
	if cfg.Leases != nil {
		cfg.Lead = func(ctx context.Context) { j.lead(ctx) }
		ldr, err := New(cfg)
		if err != nil {
			return nil, err
		}
		j.ldr = ldr
	}
	gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vmshelf_leader",
		Help: "1 while this replica runs the provisioner and the sweepers: always alone on its store, over a shared store while it holds the leader lease."},
		func() float64 {
			if j.Leading() {
				return 1
			}
			return 0
		})
	if err := reg.Register(gauge); err != nil {
		return nil, fmt.Errorf("leader: %w", err)
	}
	return j, nil
}

// Leading reports whether this process runs the work now.
func (j *Job) Leading() bool { return j.ldr == nil || j.ldr.Leading() }

// WhileLeading is ready for the replica that runs the work; another
// replica's readiness speaks only for its own part, so there it is nil
// (ready). A nil ready stays nil.
func (j *Job) WhileLeading(ready func() error) func() error {
	if ready == nil || j.ldr == nil {
		return ready
	}
	return func() error {
		if !j.ldr.Leading() {
			return nil
		}
		return ready()
	}
}

// Run runs lead until ctx ends: at once when alone, else in every term
// this replica leads. It returns once lead has returned (and the lease is
// released). Call it once.
func (j *Job) Run(ctx context.Context, lead func(ctx context.Context)) {
	j.lead = lead
	if j.ldr == nil {
		lead(ctx)
		return
	}
	j.ldr.Run(ctx)
}

// HolderName names this process among the replicas: the host's name (a
// pod's) and a random suffix, so that a restarted process is a new
// holder of the leases and two processes never share a name.
func HolderName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	return host + "-" + imagestore.NewSecret()[:8]
}
