package uploadclient

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/vmshelf/vmshelf/internal/reason"
)

// AllReplicas is Power's replica for an action on every replica of the
// order.
const AllReplicas = -1

// powerTries bounds Power's requests: the first and three retries, over
// about 4 s (or what the edge's Retry-After asks).
const powerTries = 4

// PowerOutcome is what became of a power action on one replica.
type PowerOutcome struct {
	Replica int    `json:"replica"`
	Name    string `json:"name"`
	// Outcome is "accepted", or the reason code the replica was refused
	// with; Error says it in words.
	Outcome string `json:"outcome"`
	Error   string `json:"error"`
}

// Accepted reports whether the cluster took the action on the replica.
func (o PowerOutcome) Accepted() bool { return o.Outcome == "accepted" }

// Power asks the control plane to start, stop or restart replica (its
// index, or AllReplicas) of one of the tenant's orders, and returns each
// replica's outcome. The edge answers once the cluster has taken the
// action; the machine stops, starts or restarts after it.
//
// It sends a request id of its own, and while the edge does not answer,
// or answers with a refusal that passes (busy, its store or cluster did
// not answer, the first try still running), it asks again with the same
// id, powerTries times in all: a retry after a lost answer gets the first
// answer, so a machine is never restarted twice by one call. A refusal of
// the whole action (an order not the tenant's, not running or ended, a
// machine not in a state that takes it) is a *RefusedError in the edge's
// words; retries used up, a *StoppedError.
func (c Control) Power(ctx context.Context, orderID string, replica int, action string) ([]PowerOutcome, error) {
	// 26 random letters and digits (130 bits): as the edge's request id
	// pattern allows.
	body := map[string]any{"order_id": orderID, "action": action, "request_id": rand.Text()}
	if replica != AllReplicas {
		body["replica"] = replica
	}
	what := fmt.Sprintf("%s of order %s", action, orderID)
	if replica != AllReplicas {
		what = fmt.Sprintf("%s of replica %d of order %s", action, replica, orderID)
	}
	hc := clientFor(c.HTTPClient)
	for attempt := 1; ; attempt++ {
		out, err := hc.power(ctx, c.URL, c.Token, body)
		if err == nil {
			return out, nil
		}
		var ae *apiError
		passing := isTransient(err) || (errors.As(err, &ae) && ae.is(reason.PowerInProgress))
		if !passing || attempt == powerTries || ctx.Err() != nil {
			if passing {
				return nil, &StoppedError{fmt.Sprintf("%s failed (%v); look at the order's status before running the command again", what, err)}
			}
			return nil, c.refusal(err, what)
		}
		if err := sleepCtx(ctx, retryDelay(attempt, retryAfter(err))); err != nil {
			return nil, &StoppedError{what + " interrupted; look at the order's status before running the command again"}
		}
	}
}

// power sends one power request and reads its 202.
func (c *uploadClient) power(ctx context.Context, control, token string, body map[string]any) ([]PowerOutcome, error) {
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	resp, err := c.controlCall(ctx, control, "/market/vms/orders/power", token, body)
	if err != nil {
		return nil, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusAccepted {
		return nil, answerError(resp)
	}
	var ans struct {
		Replicas []PowerOutcome `json:"replicas"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, answerLimit)).Decode(&ans); err != nil {
		return nil, netFailure(fmt.Errorf("reading the answer: %w", err), nil)
	}
	return ans.Replicas, nil
}
