package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/unavailable"
)

// Power starts, stops and restarts a replica in the cluster: the
// provisioner's access to KubeVirt's start, stop and restart
// subresources. The market knows orders and replicas, never namespaces
// or VM names. Its errors: imagestore.ErrPowerRefused when the machine is
// not in a state that takes the action, imagestore.ErrNoMachine when its
// VirtualMachine is not there; any other error is the cluster's.
type Power interface {
	Power(ctx context.Context, o imagestore.Order, replica int, a imagestore.PowerAction) error
}

const (
	// powerTimeout bounds one replica's action: the API server and
	// virt-api answer a subresource in well under a second.
	powerTimeout = 15 * time.Second
	// powerStale is how long a power request may run before a retry of
	// its id takes it again: longer than ten replicas' actions take, so a
	// request is taken again only when its process ended before it
	// answered.
	powerStale = 10*powerTimeout + time.Minute
	// powerOutcomeAccepted is a replica's outcome when the cluster took
	// its action; a refused replica's is the reason's name.
	powerOutcomeAccepted = "accepted"
)

// requestIDPattern is what a client's request id may be: short, and safe
// to log.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

var (
	errPowerOrder = apierr.New(reason.OrderUnknown).WithMsg(
		"you have no such order: only its buyer starts, stops and restarts its machines")
	errPowerValue = apierr.New(reason.BadValue).WithMsg(
		`action is "start", "stop" or "restart"; request_id, when given, is 1 to 64 letters, digits, '-' or '_'`)
	errRequestIDReused = apierr.New(reason.BadValue).WithMsg(
		"this request_id was used for another action on this order; send a new one")
)

type powerRequest struct {
	OrderID string `json:"order_id"`
	// Replica is the replica's index; absent, every replica of the
	// order.
	Replica   *int   `json:"replica"`
	Action    string `json:"action"`
	RequestID string `json:"request_id"`
}

// powerAnswer is the 202 of a power action: what became of it on each
// replica it was asked of.
type powerAnswer struct {
	OrderID  string         `json:"order_id"`
	Action   string         `json:"action"`
	Replicas []powerOutcome `json:"replicas"`
}

type powerOutcome struct {
	Replica int    `json:"replica"`
	Name    string `json:"name"`
	// Outcome is "accepted", or the reason code of the refusal, whose
	// words are Error.
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// power is POST /market/vms/orders/power: the buyer of an active order
// starts, stops or restarts one replica or all. KubeVirt does the action
// after the answer (202): a stopped machine shows as stopped on the next
// status. A request id makes a retry after a lost answer get the first
// answer, not a second restart. The host of the order, and every other
// tenant, is told the order is unknown.
func (s *Server) power(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req powerRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	action := imagestore.PowerAction(req.Action)
	if !action.Valid() || (req.RequestID != "" && !requestIDPattern.MatchString(req.RequestID)) {
		s.fail(w, r, errPowerValue)
		return
	}
	if s.cfg.Power == nil {
		s.fail(w, r, apierr.New(reason.PowerUnavailable))
		return
	}
	replica := imagestore.AllReplicas
	if req.Replica != nil {
		replica = *req.Replica
	}
	o, err := s.powerOrder(r.Context(), t.ID, req.OrderID, replica)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The action and its record run to their end whether or not the
	// buyer still waits: the answer is kept for its retry.
	ctx := context.WithoutCancel(r.Context())
	pr := imagestore.PowerRequest{TenantID: t.ID, OrderID: o.ID, RequestID: req.RequestID, Replica: replica,
		Action: action, TakenAt: s.cfg.Now().UTC()}
	if req.RequestID != "" {
		got, taken, err := s.st.TakePowerRequest(ctx, pr, pr.TakenAt.Add(-powerStale))
		switch {
		case errors.Is(err, imagestore.ErrNotFound):
			err = errPowerOrder
		case err == nil && (got.Action != action || got.Replica != replica):
			err = errRequestIDReused
		case err == nil && !taken && got.DoneAt.IsZero():
			err = apierr.New(reason.PowerInProgress)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if !taken {
			writeBody(w, got.Status, got.Answer) // the first answer, again
			return
		}
		pr.TakenAt = got.TakenAt
	}
	status, body := s.runPower(ctx, t, o, replica, action)
	if req.RequestID != "" {
		if err := s.st.FinishPowerRequest(ctx, o.ID, req.RequestID, pr.TakenAt, status, body, s.cfg.Now().UTC()); err != nil {
			// The action is done; only a retry of it would act again.
			s.log.Warn("power action's answer not kept for a retry", "order_id", o.ID, "request_id", req.RequestID, "err", err)
		}
	}
	writeBody(w, status, body)
}

// powerOrder is the tenant's order id if it has the replica (or, for
// AllReplicas, any).
func (s *Server) powerOrder(ctx context.Context, tenant int64, id string, replica int) (imagestore.Order, error) {
	if !imagestore.ValidOrderID(id) {
		return imagestore.Order{}, errPowerOrder
	}
	o, err := s.st.Order(ctx, id)
	switch {
	case errors.Is(err, imagestore.ErrNotFound) || (err == nil && o.BuyerID != tenant):
		return o, errPowerOrder
	case err != nil:
		return o, err
	case replica < imagestore.AllReplicas || replica >= o.Quantity:
		return o, apierr.New(reason.ReplicaUnknown).WithMsg(fmt.Sprintf("the order has replicas 0 to %d", o.Quantity-1))
	}
	return o, nil
}

// runPower does action on the replicas of o it names and returns the
// answer: 202 with each replica's outcome when the cluster took it on at
// least one, else the refusal of the first (for one replica, its own).
func (s *Server) runPower(ctx context.Context, t imagestore.Tenant, o imagestore.Order, replica int, action imagestore.PowerAction) (int, []byte) {
	outcomes, err := s.powerOutcomes(ctx, o, replica, action)
	if err != nil {
		e := s.logPowerFault(o, action, err)
		return e.Status, append(e.JSON(), '\n')
	}
	var first *apierr.Error
	accepted := 0
	for i, out := range outcomes {
		s.metrics.powerActions.WithLabelValues(string(action), out.outcome.Outcome).Inc()
		if out.err == nil {
			accepted++
		} else if first == nil {
			first = out.err
		}
		outcomes[i].outcome.Error = errWords(out.err)
	}
	answer := powerAnswer{OrderID: o.ID, Action: string(action)}
	for _, out := range outcomes {
		answer.Replicas = append(answer.Replicas, out.outcome)
	}
	s.log.Info("power action", "buyer", t.Name, "order_id", o.ID, "replica", replicaLabel(replica), "action", action,
		"accepted", accepted, "refused", len(outcomes)-accepted)
	if accepted > 0 && s.cfg.OnPower != nil {
		s.cfg.OnPower(o.ID)
	}
	if accepted == 0 {
		e := first
		if len(outcomes) > 1 {
			e = first.WithMsg("none of the order's machines took it; the first: " + errWords(first))
		}
		return e.Status, append(e.JSON(), '\n')
	}
	b, err := json.Marshal(answer)
	if err != nil {
		e := apierr.From(fmt.Errorf("encoding the answer: %w", err))
		return e.Status, append(e.JSON(), '\n')
	}
	return http.StatusAccepted, append(b, '\n')
}

// replicaOutcome is one replica's outcome, with its refusal.
type replicaOutcome struct {
	outcome powerOutcome
	err     *apierr.Error
}

// powerOutcomes checks o's state, then asks the cluster for action on
// each replica named: one at a time, each bounded by powerTimeout. An
// error is a refusal of the whole order (not active, ended) or a fault of
// the store.
func (s *Server) powerOutcomes(ctx context.Context, o imagestore.Order, replica int, action imagestore.PowerAction) ([]replicaOutcome, error) {
	now := s.cfg.Now()
	switch {
	case o.State == imagestore.OrderAwaitingPayment || o.State == imagestore.OrderPaid:
		return nil, apierr.New(reason.MachinesNotMade)
	case o.State != imagestore.OrderActive:
		return nil, apierr.New(reason.OrderEnded)
	case action != imagestore.PowerStop && !o.ExpiresAt.After(now):
		// The provisioner halts it at its next pass; nothing starts it
		// again meanwhile.
		return nil, apierr.New(reason.OrderEnded)
	}
	states, err := s.st.ReplicaStates(ctx, o.ID)
	if err != nil {
		return nil, err
	}
	state := map[int]string{}
	for _, rs := range states {
		state[rs.Index] = rs.State
	}
	var out []replicaOutcome
	for i := range o.Quantity {
		if replica != imagestore.AllReplicas && i != replica {
			continue
		}
		ro := replicaOutcome{outcome: powerOutcome{Replica: i, Name: fmt.Sprintf("vm-%s-%d", o.ID, i)}}
		if state[i] == imagestore.ReplicaImporting {
			ro.err = apierr.New(reason.ReplicaImporting)
		} else {
			pctx, cancel := context.WithTimeout(ctx, powerTimeout)
			ro.err = s.powerError(o, i, action, s.cfg.Power.Power(pctx, o, i, action))
			cancel()
		}
		ro.outcome.Outcome = powerOutcomeAccepted
		if ro.err != nil {
			ro.outcome.Outcome = ro.err.Reason
		}
		out = append(out, ro)
	}
	return out, nil
}

// powerError is the refusal of a replica's action from the cluster's
// error (nil for none).
func (s *Server) powerError(o imagestore.Order, replica int, action imagestore.PowerAction, err error) *apierr.Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, imagestore.ErrPowerRefused):
		return apierr.New(map[imagestore.PowerAction]reason.Code{imagestore.PowerStart: reason.AlreadyRunning,
			imagestore.PowerStop: reason.AlreadyStopped, imagestore.PowerRestart: reason.MachineStopped}[action])
	case errors.Is(err, imagestore.ErrNoMachine):
		return apierr.New(reason.MachinesNotMade)
	}
	s.log.Warn("power action not taken by the cluster", "order_id", o.ID, "replica", replica, "action", action, "err", err)
	return apierr.Wrap(err, reason.ClusterBusy)
}

// logPowerFault logs an error that refused a whole power action when it
// is the edge's own fault, and returns the error to answer.
func (s *Server) logPowerFault(o imagestore.Order, action imagestore.PowerAction, err error) *apierr.Error {
	var answered *apierr.Error
	if !errors.As(err, &answered) {
		s.log.Error("power action", "order_id", o.ID, "action", action, "err", err)
		if errors.Is(err, imagestore.ErrStoreUnavailable) {
			err = unavailable.Answer(err)
		}
	}
	return apierr.From(err)
}

// errWords is the words of a refusal, "" for none.
func errWords(e *apierr.Error) string {
	if e == nil {
		return ""
	}
	return e.Msg
}

// replicaLabel is a replica index for the log: "all" for AllReplicas.
func replicaLabel(replica int) string {
	if replica == imagestore.AllReplicas {
		return "all"
	}
	return fmt.Sprint(replica)
}
