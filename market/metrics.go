package market

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
	// ticketsCancelled counts the cancels that ended a ticket, not the
	// answers to a cancel of one that had ended already.
	ticketsCancelled prometheus.Counter
	requests         *prometheus.CounterVec
	ordersPlaced     prometheus.Counter
	// ordersCancelled counts the buyers' cancels by what became of the
	// checkout at Stripe (checkoutOutcomes).
	ordersCancelled *prometheus.CounterVec
	webhookEvents   *prometheus.CounterVec
	refunds         *prometheus.CounterVec
	disputes        prometheus.Counter
	disputesClosed  *prometheus.CounterVec
	consolesOpen    *prometheus.GaugeVec
	consoleSessions *prometheus.CounterVec
	consoleRefusals *prometheus.CounterVec
	consoleBytesVec *prometheus.CounterVec
	// powerActions counts each replica's power action by action and
	// outcome (accepted, or the reason it was refused with).
	powerActions *prometheus.CounterVec
	log          *slog.Logger

	// onboardingLinks counts POST /market/stripe/onboarding by result.
	onboardingLinks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, st Store, blobs Blobs, unfinished UnfinishedWrites, log *slog.Logger) (*metrics, error) {
	m := &metrics{
		ticketsIssued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_issued_total",
			Help: "Upload tickets issued to tenants.",
		}),
		ticketsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_expired_total",
			Help: "Upload tickets that expired unused.",
		}),
		ticketsCancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_tickets_cancelled_total",
			Help: "Upload tickets their tenant cancelled unused.",
		}),
		// route is a registered pattern or "other" and code an HTTP
		// status, so the label set stays bounded whatever clients send.
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_control_requests_total",
			Help: "Control-plane requests by route pattern and status code.",
		}, []string{"route", "code"}),
		ordersPlaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_orders_placed_total",
			Help: "VM orders placed (capacity reserved, checkout opened or tried).",
		}),
		ordersCancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_orders_cancelled_total",
			Help: "VM orders their buyer cancelled while awaiting payment, by what became of the checkout at Stripe: expired, paid (paid first: refunded), unconfirmed (a payment before the checkout runs out is refunded), none (no checkout).",
		}, []string{"checkout"}),
		// type is one of the four checkout.session events or "other",
		// result one of the webhook's own results: a bounded label set.
		webhookEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_webhook_events_total",
			Help: "Stripe webhook events by type and what the webhook did with them.",
		}, []string{"type", "result"}),
		// cause one of imagestore.RefundCauses, outcome one of
		// refundOutcomes: a bounded label set, every pair present from
		// the start so that rate() sees the first one.
		refunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_refunds_total",
			Help: "Automatic refunds by cause: decided (started) and each attempt's outcome (refunded, pending, failed, error).",
		}, []string{"cause", "outcome"}),
		disputes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vmshelf_disputes_total",
			Help: "Charges of orders disputed by the buyer's bank (charge.dispute.created).",
		}),
		// outcome one of imagestore.DisputeOutcomes: a bounded label set.
		disputesClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_disputes_closed_total",
			Help: "Disputes of orders' charges the bank decided (charge.dispute.closed), by outcome: won, lost, warning_closed, prevented.",
		}, []string{"outcome"}),
		onboardingLinks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vmshelf_onboarding_links_total",
			Help: "Stripe onboarding links asked for by hosts (POST /market/stripe/onboarding), by result: ok, refused (notHosting, accountManagedElsewhere), unavailable (Stripe or the store failed).",
		}, []string{"result"}),
		log: log,
	}
	m.newMachineMetrics()
	m.showEveryLabel()
	for _, c := range []prometheus.Collector{m.ticketsIssued, m.ticketsExpired, m.ticketsCancelled, m.requests, m.ordersPlaced, m.ordersCancelled, m.webhookEvents,
		m.refunds, m.disputes, m.disputesClosed, m.onboardingLinks, m.consolesOpen, m.consoleSessions, m.consoleRefusals, m.consoleBytesVec, m.powerActions, newStatsCollector(st, blobs, unfinished)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("market: registering metrics: %w", err)
		}
	}
	return m, nil
}

// newMachineMetrics makes the counters of what buyers do with their
// machines: consoles and power actions.
func (m *metrics) newMachineMetrics() {
	m.consolesOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vmshelf_consoles_open",
		Help: "Consoles (VNC or serial) open on this replica now.",
	}, []string{"kind"})
	m.consoleSessions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmshelf_console_sessions_total",
		Help: "Console sessions ended, by kind and why: browser_closed, console_closed, idle, order_ended.",
	}, []string{"kind", "end"})
	m.consoleRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmshelf_console_refusals_total",
		Help: "Console tickets or WebSockets refused, by kind and reason: ticket, notRunning, busy, cluster, store.",
	}, []string{"kind", "reason"})
	m.consoleBytesVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmshelf_console_bytes_total",
		Help: "Bytes passed through consoles: to_machine, to_browser.",
	}, []string{"direction"})
	m.powerActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmshelf_power_actions_total",
		Help: "Buyers' power actions on replicas, by action (start, stop, restart) and outcome: accepted, or the reason it was refused (alreadyRunning, alreadyStopped, machineStopped, replicaImporting, machinesNotMade, orderEnded, clusterBusy).",
	}, []string{"action", "outcome"})
}

// showEveryLabel makes each bounded label value of the counters whose
// first event rate() must see show from the start, at 0.
func (m *metrics) showEveryLabel() {
	for _, r := range []string{onboardingOK, onboardingRefused, onboardingUnavailable} {
		m.onboardingLinks.WithLabelValues(r)
	}
	for _, c := range strings.Fields(checkoutOutcomes) {
		m.ordersCancelled.WithLabelValues(c)
	}
	for _, outcome := range imagestore.DisputeOutcomes {
		m.disputesClosed.WithLabelValues(outcome)
	}
	for _, cause := range imagestore.RefundCauses {
		for _, outcome := range strings.Fields(refundOutcomes) {
			m.refunds.WithLabelValues(cause, outcome)
		}
	}
}

func (m *metrics) consoleOpened(kind string) { m.consolesOpen.WithLabelValues(kind).Inc() }
func (m *metrics) consoleClosed(kind string) { m.consolesOpen.WithLabelValues(kind).Dec() }
func (m *metrics) consoleEnded(kind, end string) {
	m.consoleSessions.WithLabelValues(kind, end).Inc()
}
func (m *metrics) consoleRefused(kind, reason string) {
	m.consoleRefusals.WithLabelValues(kind, reason).Inc()
}
func (m *metrics) consoleBytes(in, out int64) {
	m.consoleBytesVec.WithLabelValues("to_machine").Add(float64(in))
	m.consoleBytesVec.WithLabelValues("to_browser").Add(float64(out))
}

// refund counts one refund decision or attempt.
func (m *metrics) refund(cause, outcome string) {
	m.refunds.WithLabelValues(cause, outcome).Inc()
}

// disputeClosed counts one dispute the bank decided.
func (m *metrics) disputeClosed(outcome string) { m.disputesClosed.WithLabelValues(outcome).Inc() }

// webhook counts one event. Types other than those the market acts on
// share the label "other" ("unknown" before the event was verified).
func (m *metrics) webhook(typ, result string) {
	if typ != "unknown" && !slices.Contains(WebhookEvents(), typ) {
		typ = "other"
	}
	m.webhookEvents.WithLabelValues(typ, result).Inc()
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
	st     Store
	blobs  Blobs
	images *prometheus.Desc
	bytes  *prometheus.Desc
	free   *prometheus.Desc
	// quarantined files are images start-up set aside because no record
	// named them: somebody's disk, maybe, waiting for an operator.
	quarantined *prometheus.Desc
	orders      *prometheus.Desc
	// unfinished writes in the image storage (S3 only): multipart
	// uploads running, or left by a killed process until a start-up's
	// cleanup after the partial grace.
	unfinishedUploads, unfinishedBytes *prometheus.Desc
	unfinished                         UnfinishedWrites // nil: no such figures
}

// UnfinishedWrites says what unfinished writes hold in the image storage:
// how many uploads, and their bytes (the S3 blobs' Unfinished).
type UnfinishedWrites func(ctx context.Context) (uploads int, bytes int64, err error)

func newStatsCollector(st Store, blobs Blobs, unfinished UnfinishedWrites) *statsCollector {
	return &statsCollector{
		st: st, blobs: blobs, unfinished: unfinished,
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
		orders: prometheus.NewDesc("vmshelf_orders",
			"VM orders by state.", []string{"state"}, nil),
		unfinishedUploads: prometheus.NewDesc("vmshelf_image_storage_unfinished_uploads",
			"Multipart uploads in the S3 bucket neither completed nor aborted: running, or left by a killed process.", nil, nil),
		unfinishedBytes: prometheus.NewDesc("vmshelf_image_storage_unfinished_bytes",
			"Bytes the unfinished uploads hold in the S3 bucket: their parts and partial objects.", nil, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.images
	ch <- c.bytes
	ch <- c.free
	ch <- c.quarantined
	ch <- c.orders
	if c.unfinished != nil {
		ch <- c.unfinishedUploads
		ch <- c.unfinishedBytes
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	if free, err := c.blobs.Available(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.free, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(free))
	}
	if c.unfinished != nil {
		if n, b, err := c.unfinished(ctx); err != nil {
			ch <- prometheus.NewInvalidMetric(c.unfinishedUploads, err)
			ch <- prometheus.NewInvalidMetric(c.unfinishedBytes, err)
		} else {
			ch <- prometheus.MustNewConstMetric(c.unfinishedUploads, prometheus.GaugeValue, float64(n))
			ch <- prometheus.MustNewConstMetric(c.unfinishedBytes, prometheus.GaugeValue, float64(b))
		}
	}
	if q, err := c.blobs.Quarantined(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.quarantined, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue, float64(len(q)))
	}
	if counts, err := c.st.OrderCounts(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.orders, err)
	} else {
		for _, state := range imagestore.OrderStates {
			ch <- prometheus.MustNewConstMetric(c.orders, prometheus.GaugeValue, float64(counts[state]), string(state))
		}
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
