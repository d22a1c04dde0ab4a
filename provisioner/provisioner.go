// Package provisioner turns every paid VM order into KubeVirt objects and
// keeps them: a level-based reconciler that, on every pass, makes sure each
// paid or active order has its namespace, Secrets, VirtualMachines,
// Service and Ingress (a replica's disk is a DataVolume of its own, made
// before its VM), creating only what a Get reported NotFound and never
// replacing what exists; it reports each replica's state to the store, and
// halts the replicas of an order whose month is over and gives their
// capacity back. Nothing here deletes: the Cluster seam has no such method.
package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/baseurl"
)

// Config is what the provisioner needs of the command line.
type Config struct {
	// CPU, MemoryMiB and DiskGiB are a replica's size (--vm-cpu,
	// --vm-memory-mib, --vm-disk-gib); an image that needs more gets more.
	CPU, MemoryMiB, DiskGiB int
	// StorageClass is the replicas' disks' class (--vm-storage-class).
	StorageClass string
	// Domain is --vms-domain: each order gets an Ingress
	// vm-<order>.<Domain>; "" means none.
	Domain string
	// FetchBase is the data plane's public URL (serve's --public-url),
	// where CDI imports a buyer's own image from.
	FetchBase string
	// Catalogue resolves an order's catalogue image; nil means
	// catalogue.Builtin().
	Catalogue *catalogue.Catalogue
	// ConsoleAvailable: the edge serves the browser console, so the
	// catalogue's installation ISOs are provisioned (as the market offers
	// them, market.Config.ConsoleAvailable); without it an ISO order is
	// blocked as not offered.
	ConsoleAvailable bool
	// Every is the time between passes; 0 means DefaultEvery.
	Every time.Duration
	// Now is the clock; nil means time.Now. Tests control it.
	Now func() time.Time
	// Log receives a line per failed order and per order that became
	// active or expired; nil discards.
	Log *slog.Logger
}

// DefaultEvery is Config.Every's default.
const DefaultEvery = 30 * time.Second

// Backoff of an order that failed: it is tried again after Every, then
// after twice that and so on, never later than maxBackoff after its last
// failure. A success, or a Kick, ends the backoff.
const maxBackoff = 10 * time.Minute

// passTimeout bounds one pass of Run, so that a hung API server cannot
// hold the loop.
const passTimeout = 5 * time.Minute

// maxNote bounds an order's note: an API error can be long.
const maxNote = 500

// conflictRetries is how often the runStrategy patch is sent again when
// the API server reports a conflict.
const conflictRetries = 5

// notReached is Ready's answer before the first pass asked the cluster.
var notReached = errors.New("the cluster has not been reached yet")

// Provisioner is the reconciler. Build it with New and run it with Run.
type Provisioner struct {
	cfg Config
	st  Store
	c   Cluster
	log *slog.Logger
	m   *metrics

	kick chan struct{} // a pass is wanted soon; buffered, one pending

	pass sync.Mutex // one pass at a time: two would mint two fetch tokens

	mu      sync.Mutex
	ready   error                 // the last Ping's verdict
	backoff map[string]orderRetry // orders that failed, by id

	// afterPass, when set (tests only), is called after every pass of
	// Run, so that a test can wait for one without sleeping.
	afterPass func(error)
}

type orderRetry struct {
	failures int
	next     time.Time // not tried before this
}

// New checks cfg and builds the provisioner over the store and the
// cluster. Its metrics are registered on reg.
func New(cfg Config, st Store, c Cluster, reg prometheus.Registerer) (*Provisioner, error) {
	if st == nil || c == nil || reg == nil {
		return nil, errors.New("provisioner: store, cluster and registerer are all required")
	}
	switch {
	case cfg.CPU < 1 || cfg.MemoryMiB < 64 || cfg.DiskGiB < 1:
		return nil, fmt.Errorf("provisioner: replica size %d CPU, %d MiB, %d GiB: each must be positive (memory at least 64 MiB)",
			cfg.CPU, cfg.MemoryMiB, cfg.DiskGiB)
	case cfg.StorageClass == "":
		return nil, errors.New("provisioner: a storage class is required")
	case cfg.Every < 0:
		return nil, fmt.Errorf("provisioner: the time between passes %v is negative", cfg.Every)
	}
	cfg.FetchBase = strings.TrimRight(cfg.FetchBase, "/")
	if _, err := baseurl.ParseBase(cfg.FetchBase); err != nil {
		return nil, fmt.Errorf("provisioner: fetch base %q is not an http(s) base URL", cfg.FetchBase)
	}
	if cfg.Catalogue == nil {
		cfg.Catalogue = catalogue.Builtin()
	}
	if cfg.ConsoleAvailable {
		cfg.Catalogue = cfg.Catalogue.WithConsole()
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Provisioner{cfg: cfg, st: st, c: c, log: cfg.Log, m: m, kick: make(chan struct{}, 1),
		ready: notReached, backoff: map[string]orderRetry{}}, nil
}

// Run reconciles at once, then on every Kick and every cfg.Every, until
// ctx ends. A failed pass is logged; the next one tries again.
func (p *Provisioner) Run(ctx context.Context) {
	tick := time.NewTicker(p.cfg.Every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, passTimeout)
		err := p.ReconcileOnce(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("reconcile pass", "err", err)
		}
		if p.afterPass != nil {
			p.afterPass(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-p.kick:
		}
	}
}

// Kick asks for a pass soon, for orderID above all: an order in backoff is
// tried again at once. It never blocks.
func (p *Provisioner) Kick(orderID string) {
	p.mu.Lock()
	delete(p.backoff, orderID)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default: // a pass is already due
	}
}

// Ready is nil while the cluster answered the last pass's Ping, or says
// why it cannot be reached (also before the first pass).
func (p *Provisioner) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

func (p *Provisioner) setReady(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = err
}

// due reports whether order id is out of backoff at now.
func (p *Provisioner) due(id string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.backoff[id]
	return !ok || !now.Before(r.next)
}

// retryLater puts order id in backoff after a failure at now.
func (p *Provisioner) retryLater(id string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.backoff[id]
	r.failures++
	wait := maxBackoff
	if shift := r.failures - 1; shift < 16 && p.cfg.Every<<shift < maxBackoff {
		wait = p.cfg.Every << shift
	}
	r.next = now.Add(wait)
	p.backoff[id] = r
}

func (p *Provisioner) succeeded(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.backoff, id)
}

// forgetOthers drops the backoff of every order not in due: an order that
// left paid and active (cancelled, refunded, expired elsewhere) is no
// longer worked on, and the map must not keep it for the process's life.
func (p *Provisioner) forgetOthers(due []imagestore.Order) {
	keep := make(map[string]bool, len(due))
	for _, o := range due {
		keep[o.ID] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.backoff {
		if !keep[id] {
			delete(p.backoff, id)
		}
	}
}

// ReconcileOnce is one pass over every paid and active order. When the
// cluster does not answer, it only notes so on the paid orders. Each order
// is handled on its own: one that fails gets a note, is counted and tried
// again after its backoff, and the others go on. The error joins what
// failed.
func (p *Provisioner) ReconcileOnce(ctx context.Context) error {
	p.pass.Lock()
	defer p.pass.Unlock()
	start := time.Now()
	p.m.runs.Inc()
	defer func() { p.m.duration.Observe(time.Since(start).Seconds()) }()

	if err := p.c.Ping(ctx); err != nil {
		p.m.errors.WithLabelValues(stepPing).Inc()
		unreached := fmt.Errorf("the cluster cannot be reached: %w", err)
		p.setReady(unreached)
		return errors.Join(unreached, p.noteUnreached(ctx, unreached))
	}
	p.setReady(nil)

	var orders []imagestore.Order
	for _, st := range []imagestore.OrderState{imagestore.OrderPaid, imagestore.OrderActive} {
		os, err := p.st.OrdersInState(ctx, st)
		if err != nil {
			p.m.errors.WithLabelValues(stepStore).Inc()
			return fmt.Errorf("reading the %s orders: %w", st, err)
		}
		orders = append(orders, os...)
	}
	p.forgetOthers(orders)
	var errs []error
	for _, o := range orders {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		now := p.cfg.Now()
		if !p.due(o.ID, now) {
			continue
		}
		err := p.reconcileOrder(ctx, o, now)
		if err == nil {
			p.succeeded(o.ID)
			continue
		}
		if ctx.Err() != nil { // the pass ends, the order did not fail
			errs = append(errs, ctx.Err())
			break
		}
		step := stepOf(err)
		p.m.errors.WithLabelValues(step).Inc()
		p.retryLater(o.ID, now)
		p.log.Warn("order not provisioned; trying again later", "order_id", o.ID, "step", step, "err", err)
		errs = append(errs, fmt.Errorf("order %s: %w", o.ID, err))
	}
	if ctx.Err() == nil {
		errs = append(errs, p.haltRefundedOrders(ctx))
	}
	return errors.Join(errs...)
}

// haltRefundedOrders halts the replicas of the orders refunded from
// active (an import that failed for good): their VMs exist, and CDI
// retrying the import must not start a machine whose money went back. An
// order whose replicas are all stored as stopped is done.
func (p *Provisioner) haltRefundedOrders(ctx context.Context) error {
	var errs []error
	for _, st := range []imagestore.OrderState{imagestore.OrderRefunding, imagestore.OrderRefundFailed, imagestore.OrderRefunded} {
		orders, err := p.st.OrdersInState(ctx, st)
		if err != nil {
			p.m.errors.WithLabelValues(stepStore).Inc()
			return fmt.Errorf("reading the %s orders: %w", st, err)
		}
		for _, o := range orders {
			if o.RefundFrom != imagestore.OrderActive {
				continue
			}
			states, err := p.st.ReplicaStates(ctx, o.ID)
			if err != nil {
				p.m.errors.WithLabelValues(stepStore).Inc()
				errs = append(errs, fmt.Errorf("order %s: reading its replicas' states: %w", o.ID, err))
				continue
			}
			if allStopped(states, o.Quantity) {
				continue
			}
			if err := p.haltRefunded(ctx, o, p.cfg.Now()); err != nil {
				p.m.errors.WithLabelValues(stepOf(err)).Inc()
				errs = append(errs, fmt.Errorf("order %s: %w", o.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// allStopped reports whether every one of quantity replicas is stored as
// stopped.
func allStopped(states []imagestore.ReplicaState, quantity int) bool {
	if len(states) != quantity {
		return false
	}
	for _, s := range states {
		if s.State != imagestore.ReplicaStopped {
			return false
		}
	}
	return true
}

// noteUnreached gives every paid order the note that the cluster cannot
// be reached. Active orders keep theirs: their machines exist.
func (p *Provisioner) noteUnreached(ctx context.Context, unreached error) error {
	paid, err := p.st.OrdersInState(ctx, imagestore.OrderPaid)
	if err != nil {
		p.m.errors.WithLabelValues(stepStore).Inc()
		return fmt.Errorf("reading the paid orders: %w", err)
	}
	var errs []error
	for _, o := range paid {
		if err := p.setNote(ctx, o, noteOf(unreached)); err != nil {
			p.m.errors.WithLabelValues(stepStore).Inc()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setNote writes o's note if it changed.
func (p *Provisioner) setNote(ctx context.Context, o imagestore.Order, note string) error {
	if o.Note == note {
		return nil
	}
	if err := p.st.SetOrderNote(ctx, o.ID, note); err != nil {
		return fmt.Errorf("order %s: setting its note: %w", o.ID, err)
	}
	return nil
}

// noteOf is err as an order's note: one line, bounded.
func noteOf(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) <= maxNote {
		return s
	}
	cut := maxNote
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// reconcileOrder expires o if its month is over at now, and otherwise
// makes sure its objects exist; its note says what failed, or is cleared,
// and its blocked cause what will not pass by itself, or is cleared.
func (p *Provisioner) reconcileOrder(ctx context.Context, o imagestore.Order, now time.Time) error {
	var (
		err   error
		cause string
	)
	if !o.ExpiresAt.After(now) {
		err = p.expire(ctx, o, now)
	} else {
		cause, err = p.provision(ctx, o, now)
		if c := blockedCause(err); c != "" {
			cause = c
		}
	}
	note := ""
	if err != nil {
		note = noteOf(err)
	}
	if nerr := p.setNote(ctx, o, note); nerr != nil {
		return errors.Join(err, failed(stepStore, "noting the order's state", nerr))
	}
	if o.BlockedCause != cause && o.ExpiresAt.After(now) {
		if berr := p.st.SetOrderBlocked(ctx, o.ID, cause, now); berr != nil && !errors.Is(berr, imagestore.ErrNotFound) {
			return errors.Join(err, failed(stepStore, "recording what keeps the order from running", berr))
		}
		if cause != "" {
			p.log.Warn("order cannot run, and will not by itself", "order_id", o.ID, "cause", cause)
		}
	}
	return err
}

// refusedForGood marks the cluster's refusal of an object as invalid (422,
// or 400 from strict field validation) as a cause that will not pass by
// itself: the same object is refused again on every pass.
func refusedForGood(err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return blocked(imagestore.BlockedClusterRefused, err)
	}
	return err
}

// haltRefunded halts every replica of an order whose money went or goes
// back, stores them as stopped and revokes its fetch tokens, as expire
// does. Its disks stay.
func (p *Provisioner) haltRefunded(ctx context.Context, o imagestore.Order, now time.Time) error {
	if err := p.haltAll(ctx, o, now); err != nil {
		return err
	}
	p.log.Info("order refunded: replicas halted, disks kept", "order_id", o.ID, "namespace", namespaceName(o.BuyerID), "replicas", o.Quantity)
	return nil
}

// haltAll halts every replica of o (runStrategy Halted; a VM that is not
// there has nothing to halt), stores them as stopped and revokes the
// order's fetch tokens. The disks stay: they hold the buyer's data, and
// removing them is the operator's decision.
func (p *Provisioner) haltAll(ctx context.Context, o imagestore.Order, now time.Time) error {
	ns := namespaceName(o.BuyerID)
	states := make([]imagestore.ReplicaState, 0, o.Quantity)
	for i := range o.Quantity {
		name := vmName(o.ID, i)
		if err := p.halt(ctx, ns, name); err != nil {
			return failed(stepHalt, "halting the VirtualMachine "+name, err)
		}
		states = append(states, imagestore.ReplicaState{Index: i, Name: name, State: imagestore.ReplicaStopped,
			Detail: string(kubevirtv1.RunStrategyHalted), ObservedAt: now})
	}
	if err := p.st.SetReplicaStates(ctx, o.ID, states); err != nil {
		return failed(stepStore, "storing the replicas' states", err)
	}
	if _, err := p.st.RevokeOrderTokens(ctx, o.ID, now); err != nil {
		return failed(stepExpire, "revoking the order's fetch tokens", err)
	}
	return nil
}

// ensure creates an object only when get says it is NotFound; an
// AlreadyExists from create is success (somebody, maybe an earlier pass,
// made it). Any other error of either is returned: could not ask is never
// absent. It returns what get found (nil when it created).
func ensure[T any](get func() (*T, error), create func() error) (*T, error) {
	obj, err := get()
	switch {
	case err == nil:
		return obj, nil
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return nil, nil
}

// provision makes sure every object of o exists, stores its replicas'
// states, and marks a paid order active once all exist. cause is what the
// replicas' states say will not pass by itself (an own image whose import
// failed); a failure that will not carries its own (blockedError).
func (p *Provisioner) provision(ctx context.Context, o imagestore.Order, now time.Time) (cause string, err error) {
	ns := namespaceName(o.BuyerID)
	if _, err := ensure(func() (*corev1.Namespace, error) { return p.c.GetNamespace(ctx, ns) },
		func() error { return p.c.CreateNamespace(ctx, namespaceObject(ns)) }); err != nil {
		return "", failed(stepNamespace, "making the namespace "+ns, err)
	}
	// An installer runs no cloud-init (its order carries no user data, and
	// its VM no cloud-init disk): no Secret for it.
	if !p.installer(o) {
		if err := p.ensureCloudInit(ctx, o); err != nil {
			return "", err
		}
	}
	if o.ImageKind == imagestore.ImageUpload {
		if err := p.ensureFetchSecret(ctx, o); err != nil {
			return "", err
		}
	}

	vms, err := p.ensureReplicas(ctx, o)
	if err != nil {
		return "", err
	}
	if err := p.ensureService(ctx, o); err != nil {
		return "", err
	}

	states, err := p.storeStates(ctx, o, vms, now)
	if err != nil {
		return "", err
	}
	if o.ImageKind == imagestore.ImageUpload && importFailed(states) {
		cause = imagestore.BlockedImportFailed
	}
	if o.State == imagestore.OrderPaid {
		if err := p.st.MarkOrderActive(ctx, o.ID); err != nil {
			if errors.Is(err, imagestore.ErrOrderState) {
				// Refunded meanwhile: the refund won, and what this
				// pass made must not run for money given back.
				return "", p.haltRefunded(ctx, o, now)
			}
			return cause, failed(stepStore, "marking the order active", err)
		}
		p.log.Info("order active: its objects exist", "order_id", o.ID, "namespace", ns, "replicas", o.Quantity)
	}
	return cause, nil
}

// ensureReplicas makes sure every replica's disk(s) and VM exist and
// returns the VMs it found (nil for one it made). The machine is resolved
// only when a VM is missing: a catalogue entry removed after the order
// was provisioned stops nothing.
func (p *Provisioner) ensureReplicas(ctx context.Context, o imagestore.Order) ([]*kubevirtv1.VirtualMachine, error) {
	ns := namespaceName(o.BuyerID)
	var m *machine
	vms := make([]*kubevirtv1.VirtualMachine, o.Quantity)
	for i := range o.Quantity {
		name := vmName(o.ID, i)
		// The disk first: the VM names it, and KubeVirt would wait for it
		// anyway. It is made only while its VM is missing: behind a VM
		// that exists, a missing DataVolume is KubeVirt's to make (the
		// dataVolumeTemplate of a VM of an earlier vmshelf) or was
		// deleted with the buyer's data, and a fresh import would pass
		// for that data. A DataVolume that exists is left as it is.
		vm, err := ensure(func() (*kubevirtv1.VirtualMachine, error) { return p.c.GetVM(ctx, ns, name) },
			func() error {
				if m == nil {
					resolved, err := p.resolve(ctx, o)
					if err != nil {
						return err
					}
					m = &resolved
				}
				if err := p.ensureVolume(ctx, ns, diskName(o.ID, i), func() *cdiv1.DataVolume { return dataVolume(*m, i) }); err != nil {
					return err
				}
				if m.iso != nil { // an installation ISO's CD-ROM, by the disk's rules
					if err := p.ensureVolume(ctx, ns, isoName(o.ID, i), func() *cdiv1.DataVolume { return isoVolume(*m, i) }); err != nil {
						return err
					}
				}
				return refusedForGood(p.c.CreateVM(ctx, virtualMachine(*m, i)))
			})
		if err != nil {
			return nil, inStep(err, stepVM, "making the VirtualMachine "+name)
		}
		vms[i] = vm
	}
	return vms, nil
}

// ensureVolume makes the DataVolume name in ns from build if it is
// missing; one that exists is left as it is.
func (p *Provisioner) ensureVolume(ctx context.Context, ns, name string, build func() *cdiv1.DataVolume) error {
	if _, err := ensure(func() (*cdiv1.DataVolume, error) { return p.c.GetDataVolume(ctx, ns, name) },
		func() error { return refusedForGood(p.c.CreateDataVolume(ctx, build())) }); err != nil {
		return failed(stepDisk, "making the DataVolume "+name, err)
	}
	return nil
}

// ensureService makes the order's Service and, with --vms-domain, its
// Ingress.
func (p *Provisioner) ensureService(ctx context.Context, o imagestore.Order) error {
	ns, svc := namespaceName(o.BuyerID), serviceName(o.ID)
	if _, err := ensure(func() (*corev1.Service, error) { return p.c.GetService(ctx, ns, svc) },
		func() error { return p.c.CreateService(ctx, service(o)) }); err != nil {
		return failed(stepService, "making the Service "+svc, err)
	}
	if p.cfg.Domain != "" {
		if _, err := ensure(func() (*networkingv1.Ingress, error) { return p.c.GetIngress(ctx, ns, svc) },
			func() error { return p.c.CreateIngress(ctx, ingress(o, p.cfg.Domain)) }); err != nil {
			return failed(stepIngress, "making the Ingress "+svc, err)
		}
	}
	return nil
}

// ensureCloudInit makes the cloud-init Secret. The user data is read only
// when the Secret is missing, and kept out of any error.
func (p *Provisioner) ensureCloudInit(ctx context.Context, o imagestore.Order) error {
	ns, name := namespaceName(o.BuyerID), cloudInitName(o.ID)
	what := "making the Secret " + name
	_, err := ensure(func() (*corev1.Secret, error) { return p.c.GetSecret(ctx, ns, name) },
		func() error {
			ud, err := p.st.OrderUserData(ctx, o.ID)
			if err != nil {
				return failed(stepStore, "reading the order's user data", err)
			}
			if err := p.c.CreateSecret(ctx, cloudInitSecret(o, ud)); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return nil
				}
				return failed(stepCloudInit, what, redact(err, ud))
			}
			return nil
		})
	return inStep(err, stepCloudInit, what)
}

// ensureFetchSecret gives an own image's order its fetch token: minted,
// stored hashed (valid until the order ends) and put in the Secret CDI
// sends as a header, only when that Secret is missing. An existing Secret
// is never replaced: it holds the token the importers use.
func (p *Provisioner) ensureFetchSecret(ctx context.Context, o imagestore.Order) error {
	ns, name := namespaceName(o.BuyerID), fetchSecretName(o.ID)
	what := "making the Secret " + name
	_, err := ensure(func() (*corev1.Secret, error) { return p.c.GetSecret(ctx, ns, name) },
		func() error {
			// The token is stored before the Secret exists: a Secret
			// whose token the store does not know would fail every
			// import, and is never replaced.
			token := imagestore.NewSecret()
			err := p.st.CreateFetchToken(ctx, imagestore.HashSecret(token),
				imagestore.FetchToken{UploadID: o.Image, OrderID: o.ID, ExpiresAt: o.ExpiresAt})
			if err != nil {
				return failed(stepFetch, "storing the image's fetch token", err)
			}
			if err := p.c.CreateSecret(ctx, fetchSecret(o, token)); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return nil // another's token is in it; ours dies with the order
				}
				return failed(stepFetch, what, redact(err, token))
			}
			return nil
		})
	return inStep(err, stepFetch, what)
}

// inStep is err as a failure of step, unless it already is one.
func inStep(err error, step, what string) error {
	var se *stepError
	if err == nil || errors.As(err, &se) {
		return err
	}
	return failed(step, what, err)
}

// redact is err with every occurrence of secret replaced, and nothing
// left to unwrap to: an API error may quote what it was sent.
func redact(err error, secret string) error {
	if secret == "" || secret == minimalUserData {
		return err
	}
	if !strings.Contains(err.Error(), secret) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), secret, "[redacted]"))
}

// installer reports whether o is for one of the catalogue's installation
// ISOs.
func (p *Provisioner) installer(o imagestore.Order) bool {
	if o.ImageKind != imagestore.ImageCatalogue {
		return false
	}
	e, ok := p.cfg.Catalogue.Lookup(o.Image)
	return ok && e.Source == catalogue.SourceISO
}

// resolve finds what o's replicas are built from: its host's appliance
// node and its image.
func (p *Provisioner) resolve(ctx context.Context, o imagestore.Order) (machine, error) {
	host, err := p.st.TenantByID(ctx, o.HostID)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return machine{}, failed(stepResolve, "reading the order's host", blocked(imagestore.BlockedHostGone, err))
	case err != nil:
		return machine{}, failed(stepResolve, "reading the order's host", err)
	case !host.InMesh || !host.HostsVMs:
		return machine{}, failed(stepResolve, "reading the order's host",
			blocked(imagestore.BlockedHostGone, errors.New("the host left the mesh or no longer hosts machines")))
	}
	var (
		entry *catalogue.Entry
		img   *imagestore.Image
	)
	switch o.ImageKind {
	case imagestore.ImageCatalogue:
		if e, ok := p.cfg.Catalogue.Lookup(o.Image); ok {
			entry = &e
		}
	case imagestore.ImageUpload:
		i, err := p.st.Image(ctx, o.Image)
		if err != nil && !errors.Is(err, imagestore.ErrNotFound) {
			return machine{}, failed(stepResolve, "reading the order's image", err)
		}
		if err == nil {
			img = &i
		}
	}
	m, err := machineFor(sizes{cpu: p.cfg.CPU, memoryMiB: p.cfg.MemoryMiB, diskGiB: p.cfg.DiskGiB,
		storageClass: p.cfg.StorageClass, fetchBase: p.cfg.FetchBase}, o, host, entry, img)
	if err != nil {
		return machine{}, failed(stepResolve, "building the replicas", err)
	}
	return m, nil
}

// storeStates reads each replica's VM (again, if this pass created it:
// vms holds what the pass found) and its DataVolume, and stores the
// replicas' states. A VM or DataVolume not there yet is a replica
// starting; an error reading either is an error, not a state.
func (p *Provisioner) storeStates(ctx context.Context, o imagestore.Order, vms []*kubevirtv1.VirtualMachine, now time.Time) ([]imagestore.ReplicaState, error) {
	ns := namespaceName(o.BuyerID)
	states := make([]imagestore.ReplicaState, 0, len(vms))
	for i, vm := range vms {
		if vm == nil {
			got, err := p.c.GetVM(ctx, ns, vmName(o.ID, i))
			switch {
			case err == nil:
				vm = got
			case !apierrors.IsNotFound(err):
				return nil, failed(stepStatus, "reading the VirtualMachine "+vmName(o.ID, i), err)
			}
		}
		var disk, iso *cdiv1.DataVolume
		if vm != nil {
			var err error
			if disk, err = p.readDataVolume(ctx, ns, diskName(o.ID, i)); err != nil {
				return nil, err
			}
			// The CD-ROM only of a VM that has one: an order of a disk
			// image costs no second read.
			if hasVolume(vm, isoName(o.ID, i)) {
				if iso, err = p.readDataVolume(ctx, ns, isoName(o.ID, i)); err != nil {
					return nil, err
				}
			}
		}
		s := replicaState(vm, disk, iso)
		states = append(states, imagestore.ReplicaState{Index: i, Name: vmName(o.ID, i), State: s.state,
			Detail: s.detail, Progress: s.progress, ObservedAt: now})
	}
	if err := p.st.SetReplicaStates(ctx, o.ID, states); err != nil {
		return nil, failed(stepStore, "storing the replicas' states", err)
	}
	return states, nil
}

// readDataVolume reads a replica's DataVolume; nil when it is not there.
func (p *Provisioner) readDataVolume(ctx context.Context, ns, name string) (*cdiv1.DataVolume, error) {
	got, err := p.c.GetDataVolume(ctx, ns, name)
	switch {
	case err == nil:
		return got, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	}
	return nil, failed(stepStatus, "reading the DataVolume "+name, err)
}

// hasVolume reports whether vm's template names the DataVolume name.
func hasVolume(vm *kubevirtv1.VirtualMachine, name string) bool {
	if vm.Spec.Template == nil {
		return false
	}
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.DataVolume != nil && v.DataVolume.Name == name {
			return true
		}
	}
	return false
}

// importFailed reports whether CDI failed the import of a replica's disk
// (its DataVolume's phase is Failed): CDI gave up on the bytes the edge
// serves, and the same bytes fail again.
func importFailed(states []imagestore.ReplicaState) bool {
	for _, s := range states {
		if s.State == imagestore.ReplicaFailed && s.Detail == detailDiskFailed {
			return true
		}
	}
	return false
}

// expire ends o's month: every replica is halted (haltAll), and the order
// expired, which gives its capacity back. The tokens are revoked before
// the order is expired so that a failure between the two is retried: an
// expired order is not visited again.
func (p *Provisioner) expire(ctx context.Context, o imagestore.Order, now time.Time) error {
	ns := namespaceName(o.BuyerID)
	if err := p.haltAll(ctx, o, now); err != nil {
		return err
	}
	if err := p.st.ExpireOrder(ctx, o.ID, now); err != nil {
		return failed(stepExpire, "expiring the order", err)
	}
	p.log.Info("order expired: replicas halted, disks kept, capacity back", "order_id", o.ID, "namespace", ns, "replicas", o.Quantity)
	return nil
}

// halt sets a VM's runStrategy to Halted, sending the patch again on a
// conflict (a bounded number of times). NotFound is success: nothing runs.
func (p *Provisioner) halt(ctx context.Context, ns, name string) error {
	var err error
	for range conflictRetries {
		err = p.c.SetRunStrategy(ctx, ns, name, kubevirtv1.RunStrategyHalted)
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return err
		}
	}
	return err
}

// OpenConsole connects to the console kind of replica (index) of order o:
// its VirtualMachineInstance is the replica's VM's name in the buyer's
// namespace. It is the market's Consoles.
func (p *Provisioner) OpenConsole(ctx context.Context, o imagestore.Order, replica int, kind imagestore.ConsoleKind) (net.Conn, error) {
	if replica < 0 || replica >= o.Quantity {
		return nil, fmt.Errorf("provisioner: order %s has no replica %d", o.ID, replica)
	}
	return p.c.Console(ctx, namespaceName(o.BuyerID), vmName(o.ID, replica), kind)
}

// Power sends action a to replica (index) of order o, through KubeVirt's
// subresource of that name. It is the market's Power. KubeVirt's 409 (the
// machine is not in a state that takes it) is imagestore.ErrPowerRefused
// and its NotFound of the VirtualMachine imagestore.ErrNoMachine; any
// other error is the cluster's, a 404 of the route itself (no virt-api
// serving it) among them: could not ask is never absent.
func (p *Provisioner) Power(ctx context.Context, o imagestore.Order, replica int, a imagestore.PowerAction) error {
	if replica < 0 || replica >= o.Quantity {
		return fmt.Errorf("provisioner: order %s has no replica %d", o.ID, replica)
	}
	ns, name := namespaceName(o.BuyerID), vmName(o.ID, replica)
	err := p.c.Power(ctx, ns, name, a)
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return nil
	case apierrors.IsConflict(err):
		return fmt.Errorf("provisioner: %s of %s/%s: %w: %w", a, ns, name, imagestore.ErrPowerRefused, err)
	case apierrors.IsNotFound(err) && errors.As(err, &status) && status.Status().Details != nil &&
		status.Status().Details.Name == name:
		return fmt.Errorf("provisioner: %s of %s/%s: %w: %w", a, ns, name, imagestore.ErrNoMachine, err)
	}
	return fmt.Errorf("provisioner: %s of %s/%s: %w", a, ns, name, err)
}
