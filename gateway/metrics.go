package gateway

import "github.com/prometheus/client_golang/prometheus"

// Directions and outcomes are fixed sets, so every label stays bounded.
const (
	dirUpload = "upload"
	dirFetch  = "fetch"

	outcomeOK       = "ok"       // stored (upload) or sent to the last byte (fetch)
	outcomeRejected = "rejected" // refused with a reason before or while streaming
	outcomeAborted  = "aborted"  // the client went away or stalled
	outcomeFailed   = "failed"   // our fault: store or disk error
)

type metrics struct {
	inFlight   *prometheus.GaugeVec
	bytes      *prometheus.CounterVec
	transfers  *prometheus.CounterVec
	rejections *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	consumed   prometheus.Counter
	released   prometheus.Counter
	queued     prometheus.Gauge
	fetch      fetchSeries
}

// fetchSeries are the fetch direction's series, looked up once: a range
// read is so cheap that finding them by label on each one shows.
type fetchSeries struct {
	inFlight    prometheus.Gauge
	bytes       prometheus.Counter
	duration    prometheus.Observer
	ok, aborted prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vmshelf_transfers_in_flight",
			Help: "Transfers holding a slot now, by direction (upload, fetch).",
		}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_transfer_bytes_total",
			Help: "Image bytes moved on the data plane, by direction (upload: received, fetch: sent).",
		}, []string{"direction"}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_transfers_total",
			Help: "Finished transfers by direction and outcome (ok, rejected, aborted, failed).",
		}, []string{"direction", "outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_transfer_rejections_total",
			Help: "Refused transfers by direction and the reason code of the answer.",
		}, []string{"direction", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vmshelf_transfer_duration_seconds",
			Help: "Duration of transfers that held a slot, by direction.",
			// From a refused header to a 32 GiB image over a home uplink.
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
		}, []string{"direction"}),
		consumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_consumed_total",
			Help: "Upload tickets used by a transfer that started.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_released_total",
			Help: "Upload tickets ended unused by a refusal of their upload before its body (413 tooLarge, 415 badContentType).",
		}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vmshelf_fetches_queued",
			Help: "Fetches waiting for a transfer slot now (up to the fetch queue wait).",
		}),
	}
	for _, c := range []prometheus.Collector{m.inFlight, m.bytes, m.transfers, m.rejections, m.duration, m.consumed, m.released, m.queued} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Make the series exist from the start, so rate() and alerts see zeros.
	for _, d := range []string{dirUpload, dirFetch} {
		m.inFlight.WithLabelValues(d)
		m.bytes.WithLabelValues(d)
		for _, o := range []string{outcomeOK, outcomeRejected, outcomeAborted, outcomeFailed} {
			m.transfers.WithLabelValues(d, o)
		}
	}
	m.fetch = fetchSeries{
		inFlight: m.inFlight.WithLabelValues(dirFetch),
		bytes:    m.bytes.WithLabelValues(dirFetch),
		duration: m.duration.WithLabelValues(dirFetch),
		ok:       m.transfers.WithLabelValues(dirFetch, outcomeOK),
		aborted:  m.transfers.WithLabelValues(dirFetch, outcomeAborted),
	}
	return m, nil
}
