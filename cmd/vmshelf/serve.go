package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/gateway"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
	"github.com/vmshelf/vmshelf/internal/connlimit"
	"github.com/vmshelf/vmshelf/internal/leader"
	"github.com/vmshelf/vmshelf/market"
	"github.com/vmshelf/vmshelf/market/catalogue"
	"github.com/vmshelf/vmshelf/provisioner"
)

// serveFlags are serve's flags (docs/operations.md "Flags"). Every flag is
// parsed and checked at start, also those of parts a deployment does not
// use (the VM market's without --vms-enable), so that a mistake in a unit
// file is refused at once, not the day the part is turned on.
type serveFlags struct {
	dataDir, dataAddr, controlAddr, publicURL string
	uploadMaxGiB, maxVirtualGiB               float64
	tenantReserveGiB                          float64
	idleTimeout, ticketTTL                    time.Duration
	maxTransfers, imagesPerTenant             int
	vmCatalogue, kubeconfig, vmsDomain        string
	catalogue                                 *catalogue.Catalogue // from vmCatalogue by validate; nil: built in
	vmsEnable, dev                            bool
	vmCPU, vmMemoryMiB, vmDiskGiB             int
	vmStorageClass, stripeAPIBase             string
	checkoutReturnURL, currency               string
	corsOrigin                                string
	tusCheckpointMiB, headroomMiB             int
	// blobs: "" (the images in <data-dir>/vm-images) or s3://bucket/prefix.
	blobs           string
	blobCapacityGiB float64
	// ticketRate and ticketBurst: each tenant's token bucket for tickets.
	ticketRate  float64
	ticketBurst int

	// The data plane's connection cap (conns.go); derived from the
	// descriptor limit unless given.
	dataMaxConns int

	// The control plane's limits (control.go).
	controlMaxConns                          int
	controlIdleTimeout, controlHeaderTimeout time.Duration

	logLevelName string
	logLevel     slog.Level // from logLevelName by validate

	// Worked out by validate: the sizes in bytes (tenantReserve is
	// uploadMax unless given) and the base of the URLs handed out.
	uploadMax, maxVirtual, tenantReserve, blobCapacity int64
	base                                               string

	// Passed to the gateway and the market.
	trustedProxiesList string
	trustedProxies     clientaddr.Proxies // from trustedProxiesList by validate
	fetchQueueWait     time.Duration
	// The refunds: the deadline of a paid order that cannot run, how
	// often refunds are decided and retried, and how long one Stripe
	// call may take (a refund attempt is claimed for twice that).
	refundDeadline, refundEvery, stripeTimeout time.Duration
}

// serveHelp is "vmshelf serve -h".
var serveHelp = cli.Doc{
	Args:    "[flags]",
	Summary: "run the data plane, the control plane and the metrics",
	About: `Runs the edge over the store in --data-dir: the data plane on --data-addr (uploads ` +
		`and fetches), the control plane on --control-addr (the API, the Machines page, /metrics, ` +
		`/healthz, /readyz) and, with --vms-enable, the KubeVirt reconciler that runs the paid ` +
		`orders. Every setting is checked before a port is opened. SIGTERM or SIGINT stops ` +
		`taking new work and lets the running transfers finish (at most ` + shutdownBound.String() + `).`,
	Env: append([]cli.EnvVar{storeURLVar}, append(s3Vars, []cli.EnvVar{
		{Name: "STRIPE_SECRET_KEY or STRIPE_SECRET_KEY_FILE", About: "the Stripe secret key, or a file holding it " +
			"(a mounted Secret; set one of the two). Without it the market takes no payment: " +
			"listings and orders answer 503. Never a flag: a command line is visible to every user."},
		{Name: "STRIPE_WEBHOOK_SECRET or STRIPE_WEBHOOK_SECRET_FILE", About: "the signing secret of Stripe's " +
			"webhook, or a file holding it. Without it the webhook answers 503 and no payment is confirmed."},
		{Name: "GOMEMLIMIT", About: "the Go runtime's soft memory limit; when unset, serve sets " +
			strconv.Itoa(defaultMemoryLimit>>20) + " MiB."},
		{Name: "KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT", About: "with --vms-enable and no " +
			"--kubeconfig: the cluster serve runs in (Kubernetes sets them in every pod)."},
	}...)...),
	Exits: []string{
		"0  stopped by SIGTERM or SIGINT once the running transfers ended",
		"1  failed while starting or running (a port in use, the store); the message says why",
		"2  refused before any port was opened: a bad flag, variable, secret file, catalogue or " +
			"kubeconfig, or a data dir that is unusable, in use or damaged",
	},
}

func parseServeFlags(args []string) (*serveFlags, error) {
	f := &serveFlags{}
	fs := newFlagSet("serve", serveHelp)
	fs.StringVar(&f.dataDir, "data-dir", defaultData, "directory of the store and the images")
	fs.StringVar(&f.dataAddr, "data-addr", "127.0.0.1:8480", "listen address of the data plane (uploads, fetches)")
	fs.StringVar(&f.controlAddr, "control-addr", defaultControlAddr, "listen address of the control plane (API, metrics, health)")
	fs.StringVar(&f.publicURL, "public-url", "", "base of the upload and fetch URLs handed out (default http://<data-addr>)")
	fs.Float64Var(&f.uploadMaxGiB, "upload-max-gib", 32, "largest image file accepted, in GiB (decimals allowed)")
	fs.Float64Var(&f.maxVirtualGiB, "max-virtual-gib", 512, "largest virtual disk size accepted, in GiB")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 60*time.Second, "a transfer with no byte for this long is ended")
	fs.IntVar(&f.maxTransfers, "max-transfers", 4, "uploads and fetches running at once")
	fs.DurationVar(&f.ticketTTL, "ticket-ttl", time.Hour, "how long an upload ticket is valid")
	fs.Float64Var(&f.ticketRate, "ticket-rate", float64(market.DefaultTicketRate), "tickets a second one tenant may take in the long run (429 rateLimited beyond it)")
	fs.IntVar(&f.ticketBurst, "ticket-burst", market.DefaultTicketBurst, "tickets one tenant may take at once before --ticket-rate applies")
	fs.IntVar(&f.imagesPerTenant, "images-per-tenant", 3, "images a tenant may hold")
	fs.StringVar(&f.vmCatalogue, "vm-catalogue", "", "catalogue file replacing the built-in one")
	fs.BoolVar(&f.vmsEnable, "vms-enable", false, "offer VMs on the market and run the KubeVirt reconciler")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (in-cluster config when empty)")
	fs.StringVar(&f.vmsDomain, "vms-domain", "", "domain for VM ingresses (none when empty)")
	fs.IntVar(&f.vmCPU, "vm-cpu", 1, "vCPUs per replica")
	fs.IntVar(&f.vmMemoryMiB, "vm-memory-mib", 2048, "memory per replica in MiB")
	fs.IntVar(&f.vmDiskGiB, "vm-disk-gib", 20, "smallest disk per replica in GiB")
	fs.StringVar(&f.vmStorageClass, "vm-storage-class", "losos-vm-local", "storage class of replica disks")
	fs.StringVar(&f.stripeAPIBase, "stripe-api-base", "https://api.stripe.com", "Stripe API base URL")
	fs.StringVar(&f.checkoutReturnURL, "checkout-return-url", "", "where Stripe Checkout returns the buyer (default http://<control-addr>/machines)")
	fs.StringVar(&f.currency, "currency", "eur", "currency of listings")
	fs.DurationVar(&f.refundDeadline, "refund-deadline", market.DefaultRefundDeadline, "a paid order not running this long after its payment, for a cause that will not pass by itself, is refunded")
	fs.DurationVar(&f.refundEvery, "refund-every", time.Minute, "how often refunds are decided and failed ones retried")
	fs.DurationVar(&f.stripeTimeout, "stripe-timeout", billing.DefaultTimeout, "the longest one call to Stripe may take")
	fs.StringVar(&f.corsOrigin, "cors-origin", "", "let a web page on this origin (or * for any) upload from a browser (default: the Machines page's own origin, that of --checkout-return-url)")
	fs.IntVar(&f.tusCheckpointMiB, "tus-checkpoint-mib", 256, "a resumable upload makes its progress durable every this many MiB (with --blobs s3://…: at the end of every part)")
	fs.Float64Var(&f.tenantReserveGiB, "tenant-reserve-gib", 0, "disk space one tenant's running uploads may hold beyond what they wrote, in GiB; at least --upload-max-gib (0: --upload-max-gib)")
	fs.IntVar(&f.headroomMiB, "headroom-mib", imagestore.DefaultHeadroom>>20, "free disk space an upload must leave, in MiB; below it no ticket is issued")
	fs.IntVar(&f.dataMaxConns, "data-max-conns", 0, "data-plane connections held at once; at the cap one with no request in progress makes room (default: half the descriptors beyond "+strconv.Itoa(descriptorReserve)+", at most "+strconv.Itoa(maxDefaultDataConns)+")")
	fs.IntVar(&f.controlMaxConns, "control-max-conns", defaultControlMaxConns, "control-plane connections held at once; at the cap the one longest without a sign of life and no request in progress makes room, and a new client waits only while none can")
	fs.DurationVar(&f.controlIdleTimeout, "control-idle-timeout", defaultControlIdleTimeout, "a control-plane keep-alive connection with no request for this long is closed")
	fs.DurationVar(&f.controlHeaderTimeout, "control-header-timeout", defaultControlHeaderTimeout, "a control-plane request header must arrive within this (at most 30s)")
	fs.StringVar(&f.logLevelName, "log-level", "info", "least severe log lines written: debug, info, warn or error")
	fs.StringVar(&f.trustedProxiesList, "trusted-proxies", "", "comma-separated CIDRs (or addresses) of reverse proxies whose X-Forwarded-For / Forwarded is believed; none when empty")
	fs.DurationVar(&f.fetchQueueWait, "fetch-queue-wait", 30*time.Second, "a fetch beyond --max-transfers waits this long for a slot before 503")
	fs.StringVar(&f.blobs, "blobs", "", "where the images live: s3://bucket/prefix for an S3 bucket shared by every replica (default <data-dir>/vm-images)")
	fs.Float64Var(&f.blobCapacityGiB, "blob-capacity-gib", 0, "with --blobs s3://…: what the bucket may hold for vmshelf, in GiB, in place of a disk's free space")
	fs.BoolVar(&f.dev, "dev", false, "create tenant 'dev' if missing and write its token to <data-dir>/dev-token")
	if err := cli.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	f.resolveDataMaxConns(fs)
	if fs.NArg() > 0 {
		return nil, usagef("serve takes no arguments, got %q; see vmshelf serve -h", fs.Arg(0))
	}
	return f, f.validate()
}

func (f *serveFlags) validate() error {
	for name, addr := range map[string]string{"data-addr": f.dataAddr, "control-addr": f.controlAddr} {
		if err := checkListenAddr(addr); err != nil {
			return usagef("--%s %q: %v", name, addr, err)
		}
	}
	var err error
	if f.uploadMax, err = cli.GiB(f.uploadMaxGiB, "upload-max-gib"); err != nil {
		return err
	}
	if f.maxVirtual, err = cli.GiB(f.maxVirtualGiB, "max-virtual-gib"); err != nil {
		return err
	}
	f.tenantReserve = f.uploadMax
	if f.tenantReserveGiB != 0 {
		if f.tenantReserve, err = cli.GiB(f.tenantReserveGiB, "tenant-reserve-gib"); err != nil {
			return err
		}
		// Below the largest image, a PUT of an image the edge accepts
		// could never be admitted.
		if f.tenantReserveGiB < f.uploadMaxGiB {
			return usagef("--tenant-reserve-gib %v is below --upload-max-gib %v: an image of the largest size could never be uploaded", f.tenantReserveGiB, f.uploadMaxGiB)
		}
	}
	if err := f.validateBlobs(); err != nil {
		return err
	}
	if err := f.validateLimits(); err != nil {
		return err
	}
	f.currency = strings.ToLower(f.currency)
	if _, ok := billing.MinimumAmount(f.currency); !ok {
		return usagef("--currency %q is not one the payment gate knows the minimum charge of (eur, usd, chf, gbp, dkk, nok, sek, pln)", f.currency)
	}
	if f.vmsDomain != "" && !isDomain(f.vmsDomain) {
		return usagef("--vms-domain %q is not a DNS domain like vms.example.org", f.vmsDomain)
	}
	if f.base, err = publicBase(f.publicURL, f.dataAddr); err != nil {
		return err
	}
	if f.logLevel, err = parseLogLevel(f.logLevelName); err != nil {
		return err
	}
	if f.trustedProxies, err = clientaddr.Parse(f.trustedProxiesList); err != nil {
		return usagef("--trusted-proxies: %v", err)
	}
	for name, u := range map[string]string{"stripe-api-base": f.stripeAPIBase, "checkout-return-url": f.checkoutReturnURL} {
		if u == "" {
			continue
		}
		if _, err := baseurl.Parse(u); err != nil {
			return usagef("--%s %q is not an http(s) URL", name, u)
		}
	}
	if f.vmCatalogue != "" {
		// The whole file is checked now: a bad entry would otherwise only
		// show when a buyer's import fails.
		if f.catalogue, err = catalogue.Load(f.vmCatalogue); err != nil {
			return usagef("--vm-catalogue: %v", err)
		}
	}
	return nil
}

// validateLimits checks the numbers, durations and origin of the flags.
func (f *serveFlags) validateLimits() error {
	switch {
	case f.idleTimeout <= 0:
		return usagef("--idle-timeout must be positive")
	case f.ticketTTL <= 0:
		return usagef("--ticket-ttl must be positive")
	case !(f.ticketRate > 0) || f.ticketBurst < 1:
		return usagef("--ticket-rate must be a positive number of tickets a second and --ticket-burst at least 1")
	case f.maxTransfers < 1:
		return usagef("--max-transfers must be at least 1")
	case f.imagesPerTenant < 1:
		return usagef("--images-per-tenant must be at least 1")
	case f.vmCPU < 1 || f.vmMemoryMiB < 64 || f.vmDiskGiB < 1:
		return usagef("--vm-cpu, --vm-memory-mib and --vm-disk-gib must be positive (memory at least 64 MiB)")
	case f.tusCheckpointMiB < 1:
		return usagef("--tus-checkpoint-mib must be at least 1")
	case f.headroomMiB < 1:
		return usagef("--headroom-mib must be at least 1")
	case f.dataMaxConns < 1:
		return usagef("--data-max-conns must be at least 1")
	case f.controlMaxConns < 1:
		return usagef("--control-max-conns must be at least 1")
	case f.controlIdleTimeout <= 0:
		return usagef("--control-idle-timeout must be positive")
	case f.controlHeaderTimeout <= 0 || f.controlHeaderTimeout > controlReadTimeout:
		return usagef("--control-header-timeout must be positive and at most %v", controlReadTimeout)
	case f.fetchQueueWait <= 0:
		return usagef("--fetch-queue-wait must be positive (a fetch beyond the cap waits at most this long)")
	case f.refundDeadline <= 0 || f.refundEvery <= 0 || f.stripeTimeout <= 0:
		return usagef("--refund-deadline, --refund-every and --stripe-timeout must be positive")
	case f.corsOrigin != "" && f.corsOrigin != "*" && !baseurl.IsOrigin(f.corsOrigin):
		return usagef("--cors-origin %q is not an origin (scheme://host[:port]) or *", f.corsOrigin)
	}
	return nil
}

// parseLogLevel accepts the four names of --log-level, in any case.
// slog.Level's own parser reads them, but also offsets like "INFO+2",
// which the help does not promise: those are refused.
func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(s)) || l.UnmarshalText([]byte(s)) != nil {
		return 0, usagef("--log-level %q is not one of debug, info, warn, error", s)
	}
	return l, nil
}

// isDomain accepts a DNS name of lower-case labels, at least two.
func isDomain(s string) bool {
	labels := strings.Split(s, ".")
	if len(s) > 253 || len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if len(l) > 63 || !dnsLabelPattern.MatchString(l) {
			return false
		}
	}
	return true
}

var dnsLabelPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// secretFromEnv reads $name, or the file $name_FILE names (a mounted
// Kubernetes Secret); both set is an error, neither is "". A secret never
// comes from a flag: a command line is visible to every user of the
// machine.
func secretFromEnv(name string) (string, error) {
	v, path := os.Getenv(name), os.Getenv(name+"_FILE")
	switch {
	case v != "" && path != "":
		return "", usagef("%s and %s_FILE are both set; set one", name, name)
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return "", usagef("%s_FILE: %v", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(v), nil
}

// pageURL is where the Machines page is served to browsers: where Stripe
// Checkout returns the buyer, --checkout-return-url or the control plane's
// own address.
func (f *serveFlags) pageURL() string {
	if f.checkoutReturnURL != "" {
		return f.checkoutReturnURL
	}
	return "http://" + f.controlAddr + "/machines"
}

// pageOrigin is the origin the data plane lets upload from a browser:
// --cors-origin, or else the Machines page's own (the page is served by the
// control plane, on another port than the uploads, so without CORS the page
// that `make run` serves could not upload at all). Allowing it opens
// nothing: every data-plane route is authorised by a capability in its URL
// or header, never by a cookie.
func (f *serveFlags) pageOrigin() string {
	if f.corsOrigin != "" {
		return f.corsOrigin
	}
	u, err := url.Parse(f.pageURL())
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// checkListenAddr accepts host:port with a port 0..65535.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// publicBase is the URL prefix of the upload and fetch URLs handed out: an
// http(s) URL with a host and nothing after the path (no user info, query
// or fragment, which would end up inside every capability URL).
func publicBase(public, dataAddr string) (string, error) {
	if public == "" {
		return "http://" + dataAddr, nil
	}
	base, err := baseurl.Base(public)
	if err != nil {
		return "", usagef("--public-url %q is not an http(s) base URL (scheme, host, optional path)", public)
	}
	return base, nil
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: f.logLevel}))
	cli.WarnUnknownEnv(ctx, log, os.Environ()) // a misspelt VMSHELF_* would be ignored without a word
	// The data plane streams: its working set is a few MiB per transfer and
	// per busy connection, whatever the image size. A soft memory limit
	// makes the runtime collect and give memory back to the OS before the
	// heap doubles the way GOGC alone would let it; GOMEMLIMIT overrides.
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	peers, err := configurePeers(f, reg, log)
	if err != nil {
		return err
	}
	sh, err := openShelf(ctx, f, log, stdout)
	if err != nil {
		return err
	}
	defer sh.close()
	p, err := buildPlanes(f, sh, peers, reg, log)
	if err != nil {
		return err
	}
	return p.run(ctx, f, sh, log)
}

// peers are the services serve talks to besides its store: Stripe and the
// cluster. They are configuration like the flags, so a bad secret or
// kubeconfig is refused before the data dir is created or touched (and
// before --dev writes a token): a refused start leaves nothing behind. A
// cluster that does not answer is no refusal: uploads and the market work
// without it, and the provisioner keeps asking.
type peers struct {
	payments      billing.Payments // nil: no STRIPE_SECRET_KEY
	webhookSecret string
	cluster       provisioner.Cluster
}

func configurePeers(f *serveFlags, reg prometheus.Registerer, log *slog.Logger) (*peers, error) {
	var p peers
	key, err := secretFromEnv("STRIPE_SECRET_KEY")
	if err != nil {
		return nil, err
	}
	if p.webhookSecret, err = secretFromEnv("STRIPE_WEBHOOK_SECRET"); err != nil {
		return nil, err
	}
	if key != "" {
		if p.payments, err = billing.NewStripe(billing.StripeConfig{SecretKey: key, APIBase: f.stripeAPIBase, Timeout: f.stripeTimeout, Metrics: reg}); err != nil {
			return nil, usagef("STRIPE_SECRET_KEY or --stripe-api-base: %v", err)
		}
	}
	if f.vmsEnable {
		p.cluster, err = provisioner.Connect(f.kubeconfig, log)
		var unreadable *provisioner.ConfigError
		switch {
		case errors.As(err, &unreadable):
			return nil, usagef("--kubeconfig: %v", err)
		case err != nil:
			return nil, usagef("--kubeconfig %s: %v", f.kubeconfig, err)
		}
	}
	return &p, nil
}

// shelf is the store serve opened: the locked data dir, the records, the
// image bytes, and this replica's name over a shared store ("" alone).
type shelf struct {
	lock    *os.File
	st      *records
	blobs   *openedBlobs
	replica string
}

func (sh *shelf) close() { sh.st.Close(); sh.lock.Close() }

// openShelf opens the store in the data dir and refuses to start on one
// that is damaged or whose records are not those of the image files.
func openShelf(ctx context.Context, f *serveFlags, log *slog.Logger, stdout io.Writer) (_ *shelf, err error) {
	if err := prepareDataDir(f.dataDir); err != nil {
		return nil, err
	}
	lock, err := lockDataDir(f.dataDir)
	if err != nil {
		return nil, err
	}
	st, err := openRecords(ctx, f.dataDir, true, os.Getenv, sqlite.WithReserve(storeReserve))
	if errors.Is(err, imagestore.ErrDamaged) {
		// A zero-filled or overwritten vmshelf.db: refused like a damaged one.
		err = usagef("data dir %s: %s is damaged or is not a vmshelf database (%v); refusing to start: stop, "+
			"move it aside (keep it) and put back the newest backup of %s, then start again", f.dataDir, dbFile, err, dbFile)
	}
	if err != nil {
		lock.Close()
		return nil, err
	}
	sh := &shelf{lock: lock, st: st}
	defer func() {
		if err != nil {
			sh.close()
		}
	}()
	if sh.blobs, err = openBlobs(ctx, f, os.Getenv); err != nil {
		return nil, err
	}
	if st.local != nil {
		sh.blobs.Blobs = sqlite.RefillAfterDelete(sh.blobs.Blobs, st.local, log)
	}
	if err := sh.check(ctx, f, log); err != nil {
		return nil, err
	}
	if f.dev {
		if err := ensureDevTenant(ctx, st, f.dataDir, stdout); err != nil {
			return nil, err
		}
	}
	// Over a shared store, each replica writes resumable uploads under
	// their leases in the store, as a holder of this name.
	if st.shared() {
		sh.replica = leader.HolderName()
	}
	return sh, nil
}

// check is start-up's check of the store: its integrity, then that the
// records and the image files are one store's.
func (sh *shelf) check(ctx context.Context, f *serveFlags, log *slog.Logger) error {
	st, blobs := sh.st, sh.blobs
	// A damaged db must stop here: reading it as it is could make images
	// look unrecorded, and every tenant request would fail later anyway.
	if err := st.Verify(ctx); err != nil {
		if errors.Is(err, imagestore.ErrDamaged) {
			return usagef("%s is damaged (%v); refusing to start: stop, restore %s from a backup, then start again",
				st.name, err, st.short)
		}
		return fmt.Errorf("check store: %w", err)
	}
	reconcile := imagestore.Reconcile
	if st.shared() {
		if !blobsFlagS3(f.blobs) {
			log.Warn("the records are shared (" + storeURLEnv + ") but the images are in this replica's data dir: " +
				"run one replica only, or give every replica the same --blobs s3://…")
		}
		reconcile = func(ctx context.Context, st imagestore.ReconcileRecords, blobs imagestore.ReconcileBlobs, log *slog.Logger) error {
			return imagestore.ReconcileShared(ctx, st, blobs, log, imagestore.SharedReconcile{Now: time.Now(), Grace: sharedGrace})
		}
	}
	if err := reconcile(ctx, st, blobs.Blobs, log); err != nil {
		var lost *imagestore.StoreLostError
		if errors.As(err, &lost) {
			return storeLost(st, blobs, lost)
		}
		return err
	}
	return nil
}

// planes are the data plane, the control plane (the market) and what runs
// beside them: the provisioner (nil without --vms-enable) and the job of
// the leader, which runs the work that acts on every record once.
type planes struct {
	gw        *gateway.Gateway
	mk        *market.Server
	prov      *provisioner.Provisioner
	job       *leader.Job
	evictions *connlimit.Evictions
}

func buildPlanes(f *serveFlags, sh *shelf, peers *peers, reg *prometheus.Registry, log *slog.Logger) (*planes, error) {
	var p planes
	var err error
	// Every plane shares one token cache: a revocation or removal made by
	// the market or the provisioner empties it for the data plane at once.
	shared := imagestore.CacheTokens(sh.st, imagestore.TokenCacheTTL)
	if p.gw, err = newGateway(f, sh, shared, reg, log); err != nil {
		return nil, err
	}
	if f.vmsEnable && peers.payments == nil {
		log.Warn("--vms-enable without STRIPE_SECRET_KEY: listings and orders answer 503 paymentsUnavailable")
	}
	if f.vmsEnable && peers.webhookSecret == "" {
		log.Warn("--vms-enable without STRIPE_WEBHOOK_SECRET: the webhook answers 503 and no payment is confirmed")
	}
	var (
		onPaid       func(string)
		clusterReady func() error
	)
	if f.vmsEnable {
		p.prov, err = provisioner.New(provisioner.Config{
			CPU:          f.vmCPU,
			MemoryMiB:    f.vmMemoryMiB,
			DiskGiB:      f.vmDiskGiB,
			StorageClass: f.vmStorageClass,
			Domain:       f.vmsDomain,
			FetchBase:    f.base,
			Catalogue:    f.catalogue,
			Log:          log.With("component", "provisioner"),
		}, shared, peers.cluster, reg)
		if err != nil {
			return nil, err
		}
		onPaid, clusterReady = p.prov.Kick, p.prov.Ready
	}
	// Over a shared store the provisioner and the sweepers run on one
	// replica, the holder of the leader lease; another replica's /readyz
	// speaks only for its own part.
	var leases imagestore.Leases // nil: alone on its store, this process always leads
	if sh.st.shared() {
		leases = sh.st
	}
	if p.job, err = leader.NewJob(leader.Config{Leases: leases, Name: leaderLease, Holder: sh.replica,
		Log: log.With("component", "leader")}, reg); err != nil {
		return nil, err
	}
	if p.mk, err = newMarket(f, peers, shared, sh.blobs, onPaid, p.job.WhileLeading(clusterReady), reg, log); err != nil {
		return nil, err
	}
	if p.evictions, err = connlimit.NewEvictions(reg); err != nil {
		return nil, err
	}
	return &p, nil
}

func newGateway(f *serveFlags, sh *shelf, shared imagestore.Store, reg prometheus.Registerer, log *slog.Logger) (*gateway.Gateway, error) {
	checkpoint := int64(f.tusCheckpointMiB) << 20
	if sh.blobs.part > 0 {
		checkpoint = sh.blobs.part
	}
	return gateway.New(gateway.Config{
		// Every tenant's share of the disk's promises (gateway/space.go).
		TenantReserveMax: f.tenantReserve,

		UploadMax:       f.uploadMax,
		MaxVirtualSize:  uint64(f.maxVirtual),
		IdleTimeout:     f.idleTimeout,
		MaxTransfers:    f.maxTransfers,
		ImagesPerTenant: f.imagesPerTenant,
		PublicURL:       f.base,
		CORSOrigin:      f.pageOrigin(),
		CheckpointBytes: checkpoint,
		Replica:         sh.replica,
		Headroom:        int64(f.headroomMiB) << 20,
		TrustedProxies:  f.trustedProxies,
		FetchQueueWait:  f.fetchQueueWait,
		Log:             log.With("plane", "data"),
	}, shared, sh.blobs.Blobs, reg)
}

func newMarket(f *serveFlags, peers *peers, shared imagestore.Store, blobs imagestore.Blobs, onPaid func(string),
	clusterReady func() error, reg *prometheus.Registry, log *slog.Logger) (*market.Server, error) {
	return market.New(market.Config{
		PublicURL:         f.base,
		TicketTTL:         f.ticketTTL,
		TicketRate:        rate.Limit(f.ticketRate),
		TicketBurst:       f.ticketBurst,
		ImagesPerTenant:   f.imagesPerTenant,
		UploadMax:         f.uploadMax,
		MaxVirtualSize:    uint64(f.maxVirtual),
		MaxTransfers:      f.maxTransfers,
		VMsEnabled:        f.vmsEnable,
		Headroom:          int64(f.headroomMiB) << 20,
		TrustedProxies:    f.trustedProxies,
		Catalogue:         f.catalogue,
		Payments:          peers.payments,
		WebhookSecret:     peers.webhookSecret,
		Currency:          f.currency,
		CheckoutReturnURL: f.pageURL(),
		VMsDomain:         f.vmsDomain,
		OnPaid:            onPaid,
		ClusterReady:      clusterReady,
		RefundDeadline:    f.refundDeadline,
		RefundClaim:       2 * f.stripeTimeout,
		Log:               log.With("plane", "control"),
	}, shared, blobs, reg, reg)
}

// leaderWork is what runs once over the replicas (planes.job): the
// sweepers, the pending removals and the provisioner.
func (p *planes) leaderWork(sh *shelf, log *slog.Logger) func(ctx context.Context) {
	return func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Go(func() { p.mk.RunSweeper(ctx, time.Minute) })
		wg.Go(func() { p.gw.RunSweeper(ctx, time.Minute) })
		wg.Go(func() {
			imagestore.RunRemovals(ctx, sh.st, sh.blobs.Blobs, time.Minute, log.With("component", "removals"))
		})
		if p.prov != nil {
			wg.Go(func() { p.prov.Run(ctx) })
		}
		wg.Wait()
	}
}

// run serves both planes until ctx ends (SIGTERM, SIGINT) or a plane
// fails, then lets the running transfers finish within shutdownBound.
func (p *planes) run(ctx context.Context, f *serveFlags, sh *shelf, log *slog.Logger) error {
	dataLn, err := net.Listen("tcp", f.dataAddr)
	if err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	ctlLn, err := net.Listen("tcp", f.controlAddr)
	if err != nil {
		dataLn.Close()
		return fmt.Errorf("control plane: %w", err)
	}
	ctl := controlServer(p.mk.Handler(), f, log)
	dataLim, ctlLim := connLimits(dataLn, ctlLn, f, p.evictions, log)
	log.Info("vmshelf serving", "data_plane", "http://"+dataLn.Addr().String(), "control_plane", "http://"+ctlLim.Addr().String(),
		"public_url", f.base, "data_dir", f.dataDir, "images", sh.blobs.where, "store", sh.st.short, "replica", sh.replica)

	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	if sh.st.local != nil {
		go sh.st.local.KeepReserve(sweepCtx, time.Minute, log)
	}
	// Every replica writes the summary of its own suppressed refusals,
	// leader or not.
	go p.mk.RunRefusalSummary(sweepCtx)
	// And every replica refunds: each attempt is claimed in the store.
	go p.mk.RunRefunds(sweepCtx, f.refundEvery)
	leadDone := make(chan struct{})
	go func() { defer close(leadDone); p.job.Run(sweepCtx, p.leaderWork(sh, log)) }()

	errs := make(chan error, 2)
	go func() { errs <- p.gw.Serve(dataLim) }()
	go func() { errs <- ctlLim.Serve(ctl) }()
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: letting running transfers finish", "bound", shutdownBound)
	case serveErr = <-errs:
	}
	stopSweep()
	// The store closes after serve returns: the provisioner's pass must
	// have ended (it ends at once when its context does), and the leader
	// lease is handed on.
	<-leadDone
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownBound)
	defer cancel()
	if err := p.gw.Shutdown(sctx); err != nil {
		log.Warn("data plane shutdown", "err", err)
	}
	if err := ctl.Shutdown(sctx); err != nil {
		log.Warn("control plane shutdown", "err", err)
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// storeLost is start-up's refusal of records that are not those of the
// image files (imagestore.StoreLostError): one line that says what was
// found and what to do, in steps that lose nothing whichever way the
// operator goes: the database found is kept aside, never overwritten, and
// files are moved, never deleted.
func storeLost(st *records, blobs *openedBlobs, lost *imagestore.StoreLostError) error {
	var found string
	switch lost.Reason {
	case imagestore.LostNoIdentity:
		found = fmt.Sprintf("%s is new or was emptied (it has no store id), but %s holds %d image files that a database with a store id recorded",
			st.name, blobs.where, lost.Files)
	case imagestore.LostOtherStore:
		found = fmt.Sprintf("%s is another store's (its store id is not the one of the %d image files in %s)", st.name, lost.Files, blobs.where)
	default:
		found = fmt.Sprintf("%s holds no image record, but %s holds %d image files that no record or pending upload or removal explains",
			st.name, blobs.where, lost.Files)
	}
	return usagef("%s; refusing to start so that none is lost: keep a copy of %s as it is now, then restore %s from a backup "+
		"(the newest made after these images were uploaded) and start again; or, to give those images up, "+
		"move the files out of %s and start again", found, st.short, st.short, blobs.where)
}

// defaultMemoryLimit is the runtime's soft memory limit unless GOMEMLIMIT
// is set: under the 64 MiB the service is sized for.
const defaultMemoryLimit = 32 << 20

// storeReserve is the emergency space kept beside the db: on a full disk
// it is released so that removes can still commit (sqlite.WithReserve).
const storeReserve = 16 << 20

// leaderLease is the lease the replicas of a shared store compete for;
// its holder runs the provisioner and the sweepers (internal/leader).
const leaderLease = "leader"

// sharedGrace is how long another replica may take from committing an
// image's bytes to recording it, as the start-up of a replica over a
// shared store assumes: a blob without a record younger than this is
// left alone (imagestore.SharedReconcile).
const sharedGrace = 10 * time.Minute

// shutdownBound is how long SIGTERM waits for running transfers.
const shutdownBound = 30 * time.Second
