package connlimit

import "github.com/prometheus/client_golang/prometheus"

// Evictions counts the connections closed at a cap to make room for a new
// client, one series per plane (vmshelf_connections_evicted_total{plane}),
// so that an operator sees a cap that is too small for the clients.
type Evictions struct{ vec *prometheus.CounterVec }

// NewEvictions registers the counter on reg.
func NewEvictions(reg prometheus.Registerer) (*Evictions, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmshelf_connections_evicted_total",
		Help: "Connections closed at a plane's connection cap to make room for a new client (the longest waiting first, then the slowest body reader)."},
		[]string{"plane"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	return &Evictions{vec: vec}, nil
}

// Counted is the option that counts a Listener's evictions as plane's.
func (e *Evictions) Counted(plane string) Option {
	return OnEvict(e.vec.WithLabelValues(plane).Inc)
}
