package market

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vmshelf/vmshelf/imagestore"
)

// statsTimeout bounds the store query a scrape makes, so a slow store makes
// the two gauges go missing from one scrape rather than hang /metrics.
const statsTimeout = 2 * time.Second

type metrics struct {
	ticketsIssued  prometheus.Counter
	ticketsExpired prometheus.Counter
	requests       *prometheus.CounterVec
	log            *slog.Logger
}

func newMetrics(reg prometheus.Registerer, st imagestore.Store, blobs imagestore.Blobs, log *slog.Logger) (*metrics, error) {
	m := &metrics{
		ticketsIssued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_issued_total",
			Help: "Upload tickets issued to tenants.",
		}),
		ticketsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_expired_total",
			Help: "Upload tickets that expired unused.",
		}),
		// route is a registered pattern or "other" and code an HTTP
		// status, so the label set stays bounded whatever clients send.
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_control_requests_total",
			Help: "Control-plane requests by route pattern and status code.",
		}, []string{"route", "code"}),
		log: log,
	}
	for _, c := range []prometheus.Collector{m.ticketsIssued, m.ticketsExpired, m.requests, newStatsCollector(st, blobs)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("market: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(route string, code int) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}

// handler serves gather. A collector that fails (the store's stats) drops
// its own series and logs, instead of failing the whole scrape: the
// counters stay visible when the store is slow.
func (m *metrics) handler(reg prometheus.Registerer, gather prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(gather, promhttp.HandlerOpts{
		ErrorLog:      promLog{m.log},
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg, // counts promhttp_metric_handler_errors_total
	})
}

// promLog adapts slog to promhttp's Println logger.
type promLog struct{ log *slog.Logger }

func (l promLog) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }

// statsCollector reports what the store holds, asking it on every scrape
// (the numbers are the store's, not a copy that could drift).
type statsCollector struct {
	st     imagestore.Store
	blobs  imagestore.Blobs
	images *prometheus.Desc
	bytes  *prometheus.Desc
	free   *prometheus.Desc
	// quarantined files are images start-up set aside because no record
	// named them: somebody's disk, maybe, waiting for an operator.
	quarantined *prometheus.Desc
}

func newStatsCollector(st imagestore.Store, blobs imagestore.Blobs) *statsCollector {
	return &statsCollector{
		st: st, blobs: blobs,
		images: prometheus.NewDesc("vmshelf_images_stored",
			"Images stored, over all tenants.", nil, nil),
		bytes: prometheus.NewDesc("vmshelf_images_stored_bytes",
			"Bytes of the images stored, over all tenants.", nil, nil),
		// Uploads are refused (507) below Content-Length + 1 GiB of this:
		// the figure to alert on before boxes see noSpace.
		free: prometheus.NewDesc("vmshelf_image_storage_free_bytes",
			"Bytes free for new images where they are stored.", nil, nil),
		quarantined: prometheus.NewDesc("vmshelf_quarantined_image_files",
			"Image files set aside at start-up because no record named them; see 'vmshelf quarantine list'.", nil, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.images
	ch <- c.bytes
	ch <- c.free
	ch <- c.quarantined
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	if free, err := c.blobs.Available(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.free, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(free))
	}
	if q, err := c.blobs.Quarantined(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.quarantined, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue, float64(len(q)))
	}
	st, err := c.st.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.images, err)
		ch <- prometheus.NewInvalidMetric(c.bytes, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.images, prometheus.GaugeValue, float64(st.Images))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.ImageBytes))
}
