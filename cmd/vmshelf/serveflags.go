package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
	"github.com/vmshelf/vmshelf/market"
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
	trustedProxiesList, forwardedHeaderName string
	trustedProxies                          clientaddr.Trust // from both by validate
	fetchQueueWait                          time.Duration
	storeTimeout                            time.Duration
	// The refunds: the deadline of a paid order that cannot run, how
	// often refunds are decided and retried, and how long one Stripe
	// call may take (a refund attempt is claimed for twice that).
	refundDeadline, refundEvery, stripeTimeout time.Duration
	// The consoles: how long one stays open with nothing passing, how long
	// the cluster may take to open one and either side to take a write,
	// and how many may be open per box and on this replica.
	consoleIdle, consoleTimeout        time.Duration
	consolesPerTenant, consolesPerEdge int

	// withoutEffect are the warnings of the settings given in a mode
	// that ignores them (settingModes), for the start-up log.
	withoutEffect []string
}

// serveHelp is "vmshelf serve -h".
var serveHelp = cli.Doc{
	Args:    "[flags]",
	Summary: "run the data plane, the control plane and the metrics",
	About: `Runs the edge over the store in --data-dir: the data plane on --data-addr (uploads ` +
		`and fetches), the control plane on --control-addr (the API, the Machines page, /metrics, ` +
		`/healthz, /readyz) and, with --vms-enable, the KubeVirt reconciler that runs the paid ` +
		`orders. Every setting is checked before a port is opened; one that acts only in a mode ` +
		`(its text below starts with the mode) and is given without it is named in a warning ` +
		`at start, or refused where being ignored would mislead. SIGTERM or SIGINT stops ` +
		`taking new work and lets the running transfers finish (at most ` + shutdownBound.String() + `).`,
	Env: append([]cli.EnvVar{storeURLVar}, append(s3Vars, []cli.EnvVar{
		{Name: "STRIPE_SECRET_KEY or STRIPE_SECRET_KEY_FILE", About: "with --vms-enable: the Stripe secret key, or a file holding it " +
			"(a mounted Secret; set one of the two). Without it the market takes no payment: " +
			"listings and orders answer 503. Never a flag: a command line is visible to every user."},
		{Name: "STRIPE_WEBHOOK_SECRET or STRIPE_WEBHOOK_SECRET_FILE", About: "with --vms-enable: the signing secret of Stripe's " +
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
	fs.DurationVar(&f.consoleIdle, "console-idle", market.DefaultConsoleIdle, "a machine's console through which nothing passed this long is closed")
	fs.DurationVar(&f.consoleTimeout, "console-timeout", market.DefaultConsoleTimeout, "the longest the cluster may take to open a machine's console, and either side of an open one to take a write")
	fs.IntVar(&f.consolesPerTenant, "consoles-per-tenant", market.DefaultConsolesPerTenant, "consoles one box may have open at once")
	fs.IntVar(&f.consolesPerEdge, "consoles-per-edge", market.DefaultConsolesPerEdge, "consoles open at once on this replica, over all boxes")
	fs.StringVar(&f.corsOrigin, "cors-origin", "", "let a web page on this origin (or * for any) upload from a browser too, besides the Machines page's own (that of --checkout-return-url)")
	fs.IntVar(&f.tusCheckpointMiB, "tus-checkpoint-mib", 256, "a resumable upload makes its progress durable every this many MiB (with --blobs s3://…, at the end of every part)")
	fs.Float64Var(&f.tenantReserveGiB, "tenant-reserve-gib", 0, "disk space one tenant's running uploads may hold beyond what they wrote, in GiB; at least --upload-max-gib (0: --upload-max-gib)")
	fs.IntVar(&f.headroomMiB, "headroom-mib", imagestore.DefaultHeadroom>>20, "free disk space an upload must leave, in MiB; below it no ticket is issued")
	fs.IntVar(&f.dataMaxConns, "data-max-conns", 0, "data-plane connections held at once; at the cap one with no request in progress makes room (default: half the descriptors beyond "+strconv.Itoa(descriptorReserve)+", at most "+strconv.Itoa(maxDefaultDataConns)+")")
	fs.IntVar(&f.controlMaxConns, "control-max-conns", defaultControlMaxConns, "control-plane connections held at once; at the cap the one longest without a sign of life and no request in progress makes room, and a new client waits only while none can")
	fs.DurationVar(&f.controlIdleTimeout, "control-idle-timeout", defaultControlIdleTimeout, "a control-plane keep-alive connection with no request for this long is closed")
	fs.DurationVar(&f.controlHeaderTimeout, "control-header-timeout", defaultControlHeaderTimeout, "a control-plane request header must arrive within this (at most 30s)")
	fs.StringVar(&f.logLevelName, "log-level", "info", "least severe log lines written: debug, info, warn or error")
	fs.StringVar(&f.trustedProxiesList, "trusted-proxies", "", "comma-separated CIDRs (or addresses) of reverse proxies whose --forwarded-header is believed; none when empty")
	fs.StringVar(&f.forwardedHeaderName, "forwarded-header", clientaddr.XForwardedFor.String(), "the one header the trusted proxies write the client's address in: X-Forwarded-For (Traefik, nginx, the common ingress controllers) or Forwarded; the other is ignored")
	fs.DurationVar(&f.fetchQueueWait, "fetch-queue-wait", 30*time.Second, "a fetch beyond --max-transfers waits this long for a slot before 503")
	fs.DurationVar(&f.storeTimeout, "store-timeout", sqlstore.DefaultCallTimeout, "the longest one call to the record store may take; a request whose call does not answer within it is answered 503 storeUnreachable (at most "+maxStoreTimeout.String()+")")
	fs.StringVar(&f.blobs, "blobs", "", "where the images live: s3://bucket/prefix for an S3 bucket shared by every replica (default <data-dir>/vm-images)")
	fs.Float64Var(&f.blobCapacityGiB, "blob-capacity-gib", 0, "what the bucket may hold for vmshelf, in GiB, in place of a disk's free space")
	fs.BoolVar(&f.dev, "dev", false, "create tenant 'dev' if missing and write its token to <data-dir>/dev-token")
	describeSettingModes(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	f.resolveDataMaxConns(fs)
	if fs.NArg() > 0 {
		return nil, usagef("serve takes no arguments, got %q; see vmshelf serve -h", fs.Arg(0))
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	var err error
	f.withoutEffect, err = f.settingsWithoutEffect(fs, os.Getenv)
	return f, err
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
	if f.trustedProxies.Proxies, err = clientaddr.Parse(f.trustedProxiesList); err != nil {
		return usagef("--trusted-proxies: %v", err)
	}
	if f.trustedProxies.Header, err = clientaddr.ParseHeader(f.forwardedHeaderName); err != nil {
		return usagef("--forwarded-header: %v", err)
	}
	for name, u := range map[string]string{"stripe-api-base": f.stripeAPIBase, "checkout-return-url": f.checkoutReturnURL} {
		if u == "" {
			continue
		}
		if _, err := baseurl.Parse(u); err != nil {
			return usagef("--%s %q is not an http(s) URL", name, u)
		}
	}
	// A Stripe on this machine is a stand-in (stripe-mock, make demo's):
	// it takes orders and no money moves. Buyers who reach the edge
	// from elsewhere must never be sold machines through it.
	if loopbackURL(f.stripeAPIBase) && !(f.dev && loopbackAddr(f.controlAddr)) {
		return usagef("--stripe-api-base %q is a stand-in on this machine, through which no money moves: it is accepted only with --dev and a loopback --control-addr", f.stripeAPIBase)
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
	case f.storeTimeout <= 0 || f.storeTimeout > maxStoreTimeout:
		return usagef("--store-timeout must be positive and at most %v (a client or a proxy waiting longer gives up before the answer)", maxStoreTimeout)
	case f.refundDeadline <= 0 || f.refundEvery <= 0 || f.stripeTimeout <= 0:
		return usagef("--refund-deadline, --refund-every and --stripe-timeout must be positive")
	case f.consoleIdle <= 0 || f.consoleTimeout <= 0 || f.consolesPerTenant < 1 || f.consolesPerEdge < f.consolesPerTenant:
		return usagef("--console-idle and --console-timeout must be positive, --consoles-per-tenant at least 1 and --consoles-per-edge at least that")
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
// own address. A control plane listening on every address has no address
// of its own to give: it takes the host of the public URL, on which the
// boxes reach this edge already.
func (f *serveFlags) pageURL() string {
	if f.checkoutReturnURL != "" {
		return f.checkoutReturnURL
	}
	host, port, err := net.SplitHostPort(f.controlAddr)
	if err == nil && isWildcard(host) {
		if u, perr := url.Parse(f.base); perr == nil && u.Hostname() != "" {
			return "http://" + net.JoinHostPort(u.Hostname(), port) + "/machines"
		}
	}
	return "http://" + f.controlAddr + "/machines"
}

// browserPageURL is the Machines page's address for a browser on this
// machine: --checkout-return-url, or the control plane's listening
// address ctl (a wildcard one as loopback, --control-addr :0 with its
// port).
func (f *serveFlags) browserPageURL(ctl net.Addr) string {
	if f.checkoutReturnURL != "" {
		return f.checkoutReturnURL
	}
	host, port, err := net.SplitHostPort(ctl.String())
	if err != nil {
		return f.pageURL()
	}
	if isWildcard(host) {
		if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + "/machines"
}

// demoPayments: the market's payments go to a Stripe stand-in on this
// machine (validate accepts one only with --dev on loopback), and the
// Machines page says that no money moves.
func (f *serveFlags) demoPayments() bool {
	return f.dev && loopbackURL(f.stripeAPIBase)
}

// loopbackURL reports whether u is an URL of a loopback host.
func loopbackURL(u string) bool {
	p, err := url.Parse(u)
	return err == nil && isLoopbackHost(p.Hostname())
}

// loopbackAddr reports whether the listen address addr is on a loopback
// host (not a wildcard one).
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && isLoopbackHost(host)
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// corsOrigins are the origins the data plane lets upload from a browser:
// the Machines page's own (the page is served by the control plane, on
// another port than the uploads, so without CORS it could not upload at
// all: the page and the data plane are one product), and --cors-origin's
// beside it. Allowing them opens nothing: every data-plane route is
// authorised by a capability in its URL or header, never by a cookie.
func (f *serveFlags) corsOrigins() []string {
	var origins []string
	if u, err := url.Parse(f.pageURL()); err == nil && u.Host != "" {
		origins = append(origins, u.Scheme+"://"+u.Host)
	}
	if f.corsOrigin != "" && !slices.Contains(origins, f.corsOrigin) {
		origins = append(origins, f.corsOrigin)
	}
	return origins
}

// isWildcard reports whether a listen address's host is every address
// ("", 0.0.0.0 or ::): no address a browser or an importer can use.
func isWildcard(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || (ip != nil && ip.IsUnspecified())
}

// consoleBase is where the page's consoles connect: the Machines page's
// own origin as a WebSocket one (ws: for http:, wss: for https:), since
// the control plane that serves the page serves the consoles too.
func (f *serveFlags) consoleBase() string {
	u, err := url.Parse(f.pageURL())
	if err != nil || u.Host == "" {
		return ""
	}
	scheme := "ws"
	if u.Scheme == "https" {
		scheme = "wss"
	}
	return scheme + "://" + u.Host
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
		host, port, err := net.SplitHostPort(dataAddr)
		if err == nil && isWildcard(host) {
			name, _ := os.Hostname()
			if name == "" {
				name = "this-box"
			}
			return "", usagef("--data-addr %s listens on every address, which is no address to hand out in upload and fetch URLs: "+
				"set --public-url to the URL browsers and importers reach the data plane at (e.g. --public-url http://%s)",
				dataAddr, net.JoinHostPort(name, port))
		}
		return "http://" + dataAddr, nil
	}
	base, err := baseurl.Base(public)
	if err != nil {
		return "", usagef("--public-url %q is not an http(s) base URL (scheme, host, optional path)", public)
	}
	return base, nil
}

// maxStoreTimeout bounds --store-timeout: a request may make a few store
// calls in a row, and its answer must come while the client, and a proxy
// before it (30 to 60 s is common), still waits for it, and within the
// control plane's own write timeout.
const maxStoreTimeout = 30 * time.Second
