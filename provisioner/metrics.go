package provisioner

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The steps of a pass, as the errors metric names them: a bounded set.
const (
	stepPing      = "ping"      // the API server did not answer
	stepStore     = "store"     // reading or writing the order's records
	stepResolve   = "resolve"   // the order's host, image or catalogue entry
	stepNamespace = "namespace" // the buyer's namespace
	stepCloudInit = "cloudinit" // the cloud-init Secret
	stepFetch     = "fetch"     // the fetch token and its Secret
	stepDisk      = "disk"      // a replica's DataVolume
	stepVM        = "vm"        // a VirtualMachine
	stepService   = "service"
	stepIngress   = "ingress"
	stepStatus    = "status" // reading a replica's VM and DataVolume
	stepHalt      = "halt"   // runStrategy Halted at expiry
	stepExpire    = "expire" // revoking the tokens, expiring the order
)

var steps = []string{stepPing, stepStore, stepResolve, stepNamespace, stepCloudInit, stepFetch, stepDisk, stepVM,
	stepService, stepIngress, stepStatus, stepHalt, stepExpire}

type metrics struct {
	runs     prometheus.Counter
	errors   *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		runs: prometheus.NewCounter(prometheus.CounterOpts{Name: "vmshelf_reconcile_runs_total",
			Help: "Passes of the provisioner's reconciler over the paid and active orders."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmshelf_reconcile_errors_total",
			Help: "Failures of the reconciler by step; an order that failed is tried again later."}, []string{"step"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vmshelf_reconcile_duration_seconds",
			Help:    "Duration of a reconciler pass.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}}),
	}
	for _, s := range steps {
		m.errors.WithLabelValues(s) // every step present from the start, at 0
	}
	for _, c := range []prometheus.Collector{m.runs, m.errors, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("provisioner: metrics: %w", err)
		}
	}
	return m, nil
}

// stepError is a failure of one step of an order, in words the buyer can
// read in the order's note.
type stepError struct {
	step string // one of steps
	what string // "creating VirtualMachine vm-o…-0"
	err  error
}

func (e *stepError) Error() string { return e.what + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func failed(step, what string, err error) error { return &stepError{step: step, what: what, err: err} }

// blockedError is a failure the provisioner is sure will not pass by
// itself: cause is one of imagestore.BlockedCauses. A failure to ask (the
// cluster or the store did not answer) is never one.
type blockedError struct {
	cause string
	err   error
}

func (e *blockedError) Error() string { return e.err.Error() }
func (e *blockedError) Unwrap() error { return e.err }

func blocked(cause string, err error) error { return &blockedError{cause: cause, err: err} }

// blockedCause is the cause err names, or "" when it names none.
func blockedCause(err error) string {
	if be, ok := errors.AsType[*blockedError](err); ok {
		return be.cause
	}
	return ""
}

// stepOf is the step an error of a pass failed in.
func stepOf(err error) string {
	var se *stepError
	if errors.As(err, &se) {
		return se.step
	}
	return stepStore
}
