package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/gateway"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/leader"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/internal/connlimit"
	"github.com/vmshelf/vmshelf/internal/headwatch"
	"github.com/vmshelf/vmshelf/internal/memtrim"
	"github.com/vmshelf/vmshelf/market"
	"github.com/vmshelf/vmshelf/provisioner"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: f.logLevel}))
	cli.WarnUnknownEnv(ctx, log, os.Environ()) // a misspelt VMSHELF_* would be ignored without a word
	for _, w := range f.withoutEffect {
		log.Warn(w)
	}
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
	return p.run(ctx, f, sh, log, stdout)
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
	// devToken is the dev tenant's token file with --dev, else "".
	devToken string
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
	st, err := openRecords(ctx, f.dataDir, true, os.Getenv, f.storeTimeout, sqlite.WithReserve(storeReserve))
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
	// fetch-url, run beside this serve without flags of its own, mints
	// URLs on the base this serve hands out, not on the default address.
	if err := writePrivateFile(filepath.Join(f.dataDir, publicURLFile), f.base); err != nil {
		return nil, err
	}
	if f.dev {
		if err := ensureDevTenant(ctx, st, f.dataDir); err != nil {
			return nil, err
		}
		sh.devToken = filepath.Join(f.dataDir, devToken)
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
		machines     machineAccess
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
			// The page opens every replica's console (market/web's
			// console.js), so installers can be sold.
			ConsoleAvailable: true,
			Log:              log.With("component", "provisioner"),
		}, shared, peers.cluster, reg)
		if err != nil {
			return nil, err
		}
		onPaid, clusterReady, machines = p.prov.Kick, p.prov.Ready, p.prov
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
	if p.mk, err = newMarket(f, peers, shared, sh.blobs, onPaid, p.job.WhileLeading(clusterReady), machines, reg, log); err != nil {
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
		CORSOrigins:     f.corsOrigins(),
		CheckpointBytes: checkpoint,
		Replica:         sh.replica,
		Headroom:        int64(f.headroomMiB) << 20,
		TrustedProxies:  f.trustedProxies,
		FetchQueueWait:  f.fetchQueueWait,
		StoreTimeout:    f.storeTimeout,
		Log:             log.With("plane", "data"),
	}, shared, sh.blobs.Blobs, reg)
}

// machineAccess is what the control plane asks of the cluster for a
// buyer: a replica's console and its power (the provisioner's).
type machineAccess interface {
	market.Consoles
	market.Power
}

func newMarket(f *serveFlags, peers *peers, shared imagestore.Store, blobs *openedBlobs, onPaid func(string),
	clusterReady func() error, machines machineAccess, reg *prometheus.Registry, log *slog.Logger) (*market.Server, error) {
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
		Replica:           market.ReplicaSize{VCPU: f.vmCPU, MemoryMiB: f.vmMemoryMiB, DiskGiB: f.vmDiskGiB},
		OnPaid:            onPaid,
		OnPower:           onPaid, // the provisioner's Kick: the replicas' new states soon
		ClusterReady:      clusterReady,
		RefundDeadline:    f.refundDeadline,
		RefundClaim:       2 * f.stripeTimeout,
		Consoles:          machines,
		Power:             machines,
		ConsoleAvailable:  machines != nil,
		ConsoleBase:       f.consoleBase(),
		ConsoleIdle:       f.consoleIdle,
		ConsoleTimeout:    f.consoleTimeout,
		ConsolesPerTenant: f.consolesPerTenant,
		ConsolesPerEdge:   f.consolesPerEdge,
		UnfinishedWrites:  blobs.unfinished,
		DemoPayments:      f.demoPayments(),
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
func (p *planes) run(ctx context.Context, f *serveFlags, sh *shelf, log *slog.Logger, stdout io.Writer) error {
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
	dataLim, ctlLim := connLimits(dataLn, headwatch.Listen(ctlLn), f, p.evictions, log)
	// Start-up is over: what only it needed (most of the binary's code and
	// constants it touched, the heap it left free) need not stay resident.
	if _, err := memtrim.AfterStartup(); err != nil {
		log.Warn("start-up memory not given back", "err", err.Error())
	}
	log.Info("vmshelf serving", "data_plane", "http://"+dataLn.Addr().String(), "control_plane", "http://"+ctlLim.Addr().String(),
		"public_url", f.base, "data_dir", f.dataDir, "images", sh.blobs.where, "store", sh.st.short, "replica", sh.replica)
	if sh.devToken != "" {
		devNextStep(stdout, sh.devToken, f.browserPageURL(ctlLim.Addr()))
	}

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
	if err := p.mk.Shutdown(sctx); err != nil {
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
// its holder runs the provisioner and the sweepers (imagestore/leader).
const leaderLease = "leader"

// sharedGrace is how long another replica may take from committing an
// image's bytes to recording it, as the start-up of a replica over a
// shared store assumes: a blob without a record younger than this is
// left alone (imagestore.SharedReconcile).
const sharedGrace = 10 * time.Minute

// shutdownBound is how long SIGTERM waits for running transfers.
const shutdownBound = 30 * time.Second
