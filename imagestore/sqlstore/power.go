package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TakePowerRequest records a power request, or finds the one of its id;
// see imagestore.PowerStore.
func (s *Store) TakePowerRequest(ctx context.Context, r imagestore.PowerRequest, staleBefore time.Time) (imagestore.PowerRequest, bool, error) {
	fail := func(err error) (imagestore.PowerRequest, bool, error) {
		return imagestore.PowerRequest{}, false, fmt.Errorf("take power request: %w", err)
	}
	if !r.Action.Valid() || r.Replica < imagestore.AllReplicas || r.RequestID == "" || len(r.RequestID) > 64 {
		return fail(fmt.Errorf("action %q, replica %d, request id of %d bytes", r.Action, r.Replica, len(r.RequestID)))
	}
	taken, err := createdNanos(r.TakenAt)
	if err != nil {
		return fail(err)
	}
	stale, err := nanos("stale before", staleBefore)
	if err != nil {
		return fail(err)
	}
	var (
		got imagestore.PowerRequest
		ok  bool
	)
	err = s.write(ctx, "take power request", func(tx *Tx) error {
		if err := boughtBy(ctx, tx, r.OrderID, r.TenantID); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `
INSERT INTO power_requests (order_id, request_id, tenant_id, replica, action, taken_at) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (order_id, request_id) DO NOTHING`, r.OrderID, r.RequestID, r.TenantID, r.Replica, string(r.Action), taken)
		if err != nil {
			return err
		}
		if ok, err = changedOne(res); err != nil {
			return err
		}
		if !ok {
			// Taken by a process that ended before it answered: its
			// action may or may not have reached the cluster, and the
			// buyer, who never had an answer, asks again.
			res, err := tx.ExecContext(ctx, `
UPDATE power_requests SET taken_at = ? WHERE order_id = ? AND request_id = ? AND done_at IS NULL AND taken_at < ?`,
				taken, r.OrderID, r.RequestID, stale)
			if err != nil {
				return err
			}
			if ok, err = changedOne(res); err != nil {
				return err
			}
		}
		got, err = powerRequest(tx.QueryRowContext(ctx, `
SELECT tenant_id, order_id, request_id, replica, action, taken_at, done_at, status, answer
FROM power_requests WHERE order_id = ? AND request_id = ?`, r.OrderID, r.RequestID))
		return err
	})
	if err != nil {
		return imagestore.PowerRequest{}, false, err
	}
	return got, ok, nil
}

// FinishPowerRequest stores a power request's answer; see
// imagestore.PowerStore.
func (s *Store) FinishPowerRequest(ctx context.Context, orderID, requestID string, takenAt time.Time, status int, answer []byte, at time.Time) error {
	fail := func(err error) error { return fmt.Errorf("finish power request: %w", err) }
	if len(answer) > imagestore.MaxPowerAnswer {
		return fail(fmt.Errorf("answer of %d bytes", len(answer)))
	}
	taken, err := nanos("taken at", takenAt)
	if err != nil {
		return fail(err)
	}
	done, err := nanos("done at", at)
	if err != nil {
		return fail(err)
	}
	return s.write(ctx, "finish power request", func(tx *Tx) error {
		query, args := `
UPDATE power_requests SET done_at = ?, status = ?, answer = ?
WHERE order_id = ? AND request_id = ? AND taken_at = ? AND done_at IS NULL`, []any{done, status, answer, orderID, requestID, taken}
		if status >= 500 {
			query, args = `
DELETE FROM power_requests WHERE order_id = ? AND request_id = ? AND taken_at = ? AND done_at IS NULL`, args[3:]
		}
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		ok, err := changedOne(res)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("power request %s of order %s taken at %v: %w", requestID, orderID, takenAt, imagestore.ErrNotFound)
		}
		return nil
	})
}

// changedOne reports whether a statement changed a row.
func changedOne(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	return n == 1, err
}

func powerRequest(row scanner) (imagestore.PowerRequest, error) {
	var (
		r      imagestore.PowerRequest
		action string
		taken  int64
		done   sql.NullInt64
	)
	err := row.Scan(&r.TenantID, &r.OrderID, &r.RequestID, &r.Replica, &action, &taken, &done, &r.Status, &r.Answer)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("power request: %w", imagestore.ErrNotFound)
	}
	if err != nil {
		return r, err
	}
	r.Action, r.TakenAt = imagestore.PowerAction(action), fromNanos(taken)
	if done.Valid {
		r.DoneAt = fromNanos(done.Int64)
	}
	return r, nil
}
