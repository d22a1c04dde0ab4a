package imagestore

import (
	"context"
	"errors"
	"time"
)

// PowerAction is what a buyer asks of a replica's power: the three
// actions KubeVirt's VirtualMachine subresources of the same names take.
type PowerAction string

const (
	PowerStart   PowerAction = "start"
	PowerStop    PowerAction = "stop"
	PowerRestart PowerAction = "restart"
)

// Valid reports whether a is one of the three actions.
func (a PowerAction) Valid() bool {
	return a == PowerStart || a == PowerStop || a == PowerRestart
}

// AllReplicas is PowerRequest.Replica for an action on every replica of
// the order.
const AllReplicas = -1

// Errors of a power action in the cluster, which the control plane tells
// the buyer apart.
var (
	// ErrPowerRefused: the machine is not in a state that takes the
	// action (starting one that runs, stopping one that is stopped,
	// restarting one that does not run): KubeVirt's 409.
	ErrPowerRefused = errors.New("the machine is not in a state that takes this action")
	// ErrNoMachine: the replica's VirtualMachine does not exist (yet).
	ErrNoMachine = errors.New("the machine does not exist")
)

// PowerRequest is one power action a buyer asked for, kept by its
// request id (the client's key) so that a retry after a lost answer gets
// the first answer instead of acting twice: a restart retried must not
// restart the machine again.
type PowerRequest struct {
	TenantID  int64
	OrderID   string
	RequestID string
	Replica   int // 0 .. Quantity-1, or AllReplicas
	Action    PowerAction
	TakenAt   time.Time
	// DoneAt is zero while the action runs; then Status and Answer are
	// the HTTP answer the buyer was given, which a retry gets again.
	DoneAt time.Time
	Status int
	Answer []byte
}

// MaxPowerAnswer bounds a stored answer (ten replicas' outcomes fit many
// times over).
const MaxPowerAnswer = 8 << 10

// PowerStore keeps the power requests, by order and request id.
type PowerStore interface {
	// TakePowerRequest records r as running at r.TakenAt and returns it
	// with taken true, unless the order already has a request of that id:
	// then it returns that one and taken false, except that one still
	// running and taken before staleBefore (its process ended before it
	// answered) is taken again, at r.TakenAt, and returned with taken
	// true. ErrNotFound if the order is not r.TenantID's.
	TakePowerRequest(ctx context.Context, r PowerRequest, staleBefore time.Time) (got PowerRequest, taken bool, err error)
	// FinishPowerRequest stores the answer of the request taken at
	// takenAt; ErrNotFound if it was taken again since, or is done. An
	// answer of status 500 or more (the store's or the cluster's fault,
	// which passes) is not kept: the request is removed, and its retry
	// runs again.
	FinishPowerRequest(ctx context.Context, orderID, requestID string, takenAt time.Time, status int, answer []byte, at time.Time) error
}
