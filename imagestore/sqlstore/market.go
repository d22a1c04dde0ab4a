package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The state names are written into the SQL as literals, as the schema's
// CHECK lists them, so that each query reads as the rule it implements.
// storetest drives every method with the imagestore constants, so a
// literal that drifted from its constant fails there.

// holdsSQL is imagestore.OrderState.Holds as SQL.
const holdsSQL = `state IN ('awaitingPayment', 'paid', 'active')`

// listingCols selects a listing with its derived counts: reserved by the
// orders awaiting payment, running by the paid and active ones, both
// summed from the covering index orders_listing.
const listingCols = `l.id, l.host_id, l.unit_price, l.currency, l.capacity, l.created_at, l.closed_at,
	(SELECT coalesce(sum(quantity), 0) FROM orders WHERE listing_id = l.id AND state = 'awaitingPayment'),
	(SELECT coalesce(sum(quantity), 0) FROM orders WHERE listing_id = l.id AND state IN ('paid', 'active'))`

func scanListing(r scanner) (imagestore.Listing, error) {
	var (
		l       imagestore.Listing
		created int64
		closed  sql.NullInt64
	)
	if err := r.Scan(&l.ID, &l.HostID, &l.UnitPrice, &l.Currency, &l.Capacity, &created, &closed, &l.Reserved, &l.Running); err != nil {
		return imagestore.Listing{}, err
	}
	l.CreatedAt = fromNanos(created)
	if closed.Valid {
		l.ClosedAt = fromNanos(closed.Int64)
	}
	return l, nil
}

// listing reads one listing inside tx; ErrNotFound.
func listing(ctx context.Context, tx *Tx, id string) (imagestore.Listing, error) {
	return queryOne(ctx, tx, "listing", scanListing, `SELECT `+listingCols+` FROM listings l WHERE l.id = ?`, id)
}

func queryListings(ctx context.Context, tx *Tx, query string, args ...any) ([]imagestore.Listing, error) {
	return queryAll(ctx, tx, scanListing, query, args...)
}

// CreateListing stores l open; see imagestore.MarketStore.
func (s *Store) CreateListing(ctx context.Context, l imagestore.Listing) (imagestore.Listing, error) {
	fail := func(err error) (imagestore.Listing, error) {
		return imagestore.Listing{}, fmt.Errorf("create listing: %w", err)
	}
	created, err := createdNanos(l.CreatedAt)
	if err != nil {
		return fail(err)
	}
	if l.ID == "" || l.Capacity < 1 || l.UnitPrice < 1 || l.Currency == "" {
		return fail(fmt.Errorf("id %q, capacity %d, unit price %d and currency %q do not describe a listing", l.ID, l.Capacity, l.UnitPrice, l.Currency))
	}
	var stored imagestore.Listing
	err = s.write(ctx, "create listing", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `
INSERT INTO listings (id, host_id, unit_price, currency, capacity, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			l.ID, l.HostID, l.UnitPrice, l.Currency, l.Capacity, created)
		switch {
		case isUnique(err):
			return fmt.Errorf("listing: %w", imagestore.ErrExists)
		case isForeignKey(err):
			return fmt.Errorf("host: %w", imagestore.ErrNotFound)
		case err != nil:
			return err
		}
		stored, err = listing(ctx, tx, l.ID)
		return err
	})
	if err != nil {
		return imagestore.Listing{}, err
	}
	return stored, nil
}

// Listing returns the listing with its derived counts; ErrNotFound.
func (s *Store) Listing(ctx context.Context, id string) (imagestore.Listing, error) {
	var l imagestore.Listing
	err := s.read(ctx, "listing", func(tx *Tx) (err error) {
		l, err = listing(ctx, tx, id)
		return err
	})
	return l, err
}

// Listings returns the host's listings, open and closed, by creation time
// and id.
func (s *Store) Listings(ctx context.Context, hostID int64) ([]imagestore.Listing, error) {
	var ls []imagestore.Listing
	err := s.readStatement(ctx, "listings", func(tx *Tx) (err error) {
		ls, err = queryListings(ctx, tx, `SELECT `+listingCols+` FROM listings l
WHERE l.host_id = ? ORDER BY l.created_at, l.id`, hostID)
		return err
	})
	return ls, err
}

// OpenListings returns every open listing by creation time and id.
func (s *Store) OpenListings(ctx context.Context) ([]imagestore.Listing, error) {
	var ls []imagestore.Listing
	err := s.readStatement(ctx, "open listings", func(tx *Tx) (err error) {
		ls, err = queryListings(ctx, tx, `SELECT `+listingCols+` FROM listings l
WHERE l.closed_at IS NULL ORDER BY l.created_at, l.id`)
		return err
	})
	return ls, err
}

// CloseListing closes the host's open listing at now; a closed one keeps
// its first closing time. ErrNotFound if the host has no such listing,
// including when another host has it.
func (s *Store) CloseListing(ctx context.Context, hostID int64, id string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("close listing: %w", err)
	}
	return s.write(ctx, "close listing", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE listings SET closed_at = ? WHERE id = ? AND host_id = ? AND closed_at IS NULL`, at, id, hostID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		_, err = queryOne(ctx, tx, "listing", scanValue[int], `SELECT 1 FROM listings WHERE id = ? AND host_id = ?`, id, hostID)
		return err
	})
}

// orderCols is every column of an order but user_data, which only
// OrderUserData reads: nothing that shows an Order can carry it.
const orderCols = `id, listing_id, buyer_id, host_id, quantity, image_kind, image, name,
	unit_price, total, fee, currency, destination, state, reason, checkout_id, checkout_url,
	reserve_until, created_at, paid_at, expires_at, ended_at, note,
	payment_intent, blocked_cause, blocked_since, ran_at, refund_from, refund_cause, refund_id,
	refund_attempts, refund_generation, refund_next_at, refund_error, refunded_at, dispute_id, disputed_at,
	dispute_status, dispute_closed_at`

func scanOrder(r scanner) (imagestore.Order, error) {
	var (
		o                      imagestore.Order
		reserve, created       int64
		paid, expires, endedAt sql.NullInt64
		blocked, refundNext    sql.NullInt64
		ran                    sql.NullInt64
		refunded, disputed     sql.NullInt64
		disputeClosed          sql.NullInt64
		kind, state, from      string
	)
	if err := r.Scan(&o.ID, &o.ListingID, &o.BuyerID, &o.HostID, &o.Quantity, &kind, &o.Image, &o.Name,
		&o.UnitPrice, &o.Total, &o.Fee, &o.Currency, &o.Destination, &state, &o.Reason, &o.CheckoutID, &o.CheckoutURL,
		&reserve, &created, &paid, &expires, &endedAt, &o.Note,
		&o.PaymentIntent, &o.BlockedCause, &blocked, &ran, &from, &o.RefundCause, &o.RefundID,
		&o.RefundAttempts, &o.RefundGeneration, &refundNext, &o.RefundError, &refunded, &o.DisputeID, &disputed,
		&o.DisputeStatus, &disputeClosed); err != nil {
		return imagestore.Order{}, err
	}
	o.ImageKind, o.State, o.RefundFrom = imagestore.ImageKind(kind), imagestore.OrderState(state), imagestore.OrderState(from)
	o.ReserveUntil, o.CreatedAt = fromNanos(reserve), fromNanos(created)
	for _, t := range []struct {
		dst *time.Time
		src sql.NullInt64
	}{{&o.PaidAt, paid}, {&o.ExpiresAt, expires}, {&o.EndedAt, endedAt},
		{&o.BlockedSince, blocked}, {&o.RanAt, ran}, {&o.RefundNextAt, refundNext}, {&o.RefundedAt, refunded}, {&o.DisputedAt, disputed},
		{&o.DisputeClosedAt, disputeClosed}} {
		if t.src.Valid {
			*t.dst = fromNanos(t.src.Int64)
		}
	}
	return o, nil
}

func queryOrders(ctx context.Context, tx *Tx, query string, args ...any) ([]imagestore.Order, error) {
	return queryAll(ctx, tx, scanOrder, query, args...)
}

// checkOrder refuses an order that no caller should build: the store
// keeps the money fields consistent whatever the handler computed.
func checkOrder(o imagestore.Order) error {
	switch {
	case o.ID == "" || o.ListingID == "":
		return errors.New("order or listing id missing")
	case o.Quantity < 1:
		return fmt.Errorf("quantity %d", o.Quantity)
	case o.ImageKind != imagestore.ImageCatalogue && o.ImageKind != imagestore.ImageUpload:
		return fmt.Errorf("image kind %q", o.ImageKind)
	case o.Image == "":
		return errors.New("image missing")
	case o.UnitPrice < 1 || o.Total != o.UnitPrice*int64(o.Quantity):
		return fmt.Errorf("total %d is not unit price %d × quantity %d", o.Total, o.UnitPrice, o.Quantity)
	case o.Fee < 0 || o.Fee > o.Total:
		return fmt.Errorf("fee %d outside 0..%d", o.Fee, o.Total)
	case o.Destination == "":
		return errors.New("destination missing")
	}
	return nil
}

// CreateOrder reserves o.Quantity replicas of the listing and stores the
// order; see imagestore.MarketStore for the errors.
//
// The free capacity and the buyer's unpaid orders are counted and the
// order inserted in one write transaction, which the engine makes serial
// with every other (SQLite: BEGIN IMMEDIATE on one writer; PostgreSQL:
// SERIALIZABLE): no other CreateOrder, in this process or another, can
// insert between the counts and the insert. storetest's
// CreateOrderConcurrent and CreateOrderUnpaidLimit overbook a store that
// does not.
func (s *Store) CreateOrder(ctx context.Context, o imagestore.Order, userData string, maxUnpaid int) error {
	fail := func(err error) error { return fmt.Errorf("create order: %w", err) }
	if err := checkOrder(o); err != nil {
		return fail(err)
	}
	created, err := createdNanos(o.CreatedAt)
	if err != nil {
		return fail(err)
	}
	reserve, err := nanos("reserve_until", o.ReserveUntil)
	if err != nil {
		return fail(err)
	}
	return s.write(ctx, "create order", func(tx *Tx) error {
		// A retry after a lost answer must hear that its order exists,
		// not that its own reservation took the last replica.
		if err := absent(ctx, tx, "order", `SELECT 1 FROM orders WHERE id = ?`, o.ID); err != nil {
			return err
		}
		if maxUnpaid > 0 {
			var unpaid int
			err := tx.QueryRowContext(ctx, `
SELECT count(*) FROM (SELECT 1 FROM orders WHERE buyer_id = ? AND state = 'awaitingPayment' LIMIT ?) AS u`,
				o.BuyerID, maxUnpaid).Scan(&unpaid)
			if err != nil {
				return err
			}
			if unpaid >= maxUnpaid {
				return imagestore.ErrTooManyUnpaid
			}
		}
		l, err := listing(ctx, tx, o.ListingID)
		if err != nil {
			return err
		}
		var account string
		err = tx.QueryRowContext(ctx, `SELECT stripe_account FROM tenants WHERE id = ?`, l.HostID).Scan(&account)
		if err != nil {
			return fmt.Errorf("host of the listing: %w", err)
		}
		switch {
		case o.HostID != l.HostID || o.UnitPrice != l.UnitPrice || o.Currency != l.Currency:
			return fmt.Errorf("order (host %d, %d %s) does not match its listing (host %d, %d %s)",
				o.HostID, o.UnitPrice, o.Currency, l.HostID, l.UnitPrice, l.Currency)
		case o.Destination != account:
			// Stripe account ids are not secrets; they are still left
			// out, since the error says enough to find the bug.
			return errors.New("order destination is not the host's Stripe account")
		case o.BuyerID == l.HostID:
			return imagestore.ErrOwnListing
		case l.Free() < o.Quantity:
			return fmt.Errorf("listing has %d free, order wants %d: %w", l.Free(), o.Quantity, imagestore.ErrNoCapacity)
		}
		if o.ImageKind == imagestore.ImageUpload {
			if _, err := queryOne(ctx, tx, "image", scanValue[int], `SELECT 1 FROM images WHERE upload_id = ? AND tenant_id = ?`, o.Image, o.BuyerID); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, `
INSERT INTO orders (id, listing_id, buyer_id, host_id, quantity, image_kind, image, name,
	unit_price, total, fee, currency, destination, state, reserve_until, created_at, user_data)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'awaitingPayment', ?, ?, ?)`,
			o.ID, o.ListingID, o.BuyerID, o.HostID, o.Quantity, string(o.ImageKind), o.Image, o.Name,
			o.UnitPrice, o.Total, o.Fee, o.Currency, o.Destination, reserve, created, userData)
		switch {
		case isUnique(err):
			return fmt.Errorf("order: %w", imagestore.ErrExists)
		case isForeignKey(err):
			return fmt.Errorf("buyer: %w", imagestore.ErrNotFound)
		}
		return err
	})
}

// orderState reads an order's state inside tx, for a state change whose
// conditional UPDATE changed nothing; ErrNotFound.
func orderState(ctx context.Context, tx *Tx, id string) (imagestore.OrderState, error) {
	st, err := queryOne(ctx, tx, "order", scanValue[string], `SELECT state FROM orders WHERE id = ?`, id)
	return imagestore.OrderState(st), err
}

// transition runs one conditional UPDATE of order id and, when it changed
// no row, reads the state it met: left reports whether that state is one
// the change leaves alone (nil), otherwise it is ErrOrderState. The
// decision is the UPDATE's WHERE, never the read: of two concurrent
// changes exactly one applies.
func transition(ctx context.Context, tx *Tx, id string, left func(imagestore.OrderState) bool, update string, args ...any) error {
	_, err := transitionMoved(ctx, tx, id, left, update, args...)
	return err
}

// transitionMoved is transition that also reports whether update changed
// the row (false: it was left as it was). The update's own WHERE on the
// state decides, so of concurrent transactions exactly one sees true.
func transitionMoved(ctx context.Context, tx *Tx, id string, left func(imagestore.OrderState) bool, update string, args ...any) (bool, error) {
	res, err := tx.ExecContext(ctx, update, args...)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err == nil, err
	}
	st, err := orderState(ctx, tx, id)
	switch {
	case err != nil:
		return false, err
	case left(st):
		return false, nil
	}
	return false, fmt.Errorf("order is %s: %w", st, imagestore.ErrOrderState)
}

func never(imagestore.OrderState) bool { return false }

// SetCheckout records the checkout session of an order awaiting payment.
func (s *Store) SetCheckout(ctx context.Context, orderID, checkoutID, checkoutURL string) error {
	return s.write(ctx, "set checkout", func(tx *Tx) error {
		return transition(ctx, tx, orderID, never, `
UPDATE orders SET checkout_id = ?, checkout_url = ? WHERE id = ? AND state = 'awaitingPayment'`,
			checkoutID, checkoutURL, orderID)
	})
}

// Order returns the order without its user data; ErrNotFound.
func (s *Store) Order(ctx context.Context, id string) (imagestore.Order, error) {
	return readOne(ctx, s, "order", "order", scanOrder, `SELECT `+orderCols+` FROM orders WHERE id = ?`, id)
}

// Orders returns the buyer's orders, newest first (then by id, descending).
func (s *Store) Orders(ctx context.Context, buyerID int64) ([]imagestore.Order, error) {
	var orders []imagestore.Order
	err := s.readStatement(ctx, "orders", func(tx *Tx) (err error) {
		orders, err = queryOrders(ctx, tx, `SELECT `+orderCols+` FROM orders
WHERE buyer_id = ? ORDER BY created_at DESC, id DESC`, buyerID)
		return err
	})
	return orders, err
}

// OrdersInState returns the orders in state, oldest first (then by id).
func (s *Store) OrdersInState(ctx context.Context, state imagestore.OrderState) ([]imagestore.Order, error) {
	var orders []imagestore.Order
	err := s.read(ctx, "orders in state", func(tx *Tx) (err error) {
		orders, err = queryOrders(ctx, tx, `SELECT `+orderCols+` FROM orders
WHERE state = ? ORDER BY created_at, id`, string(state))
		return err
	})
	return orders, err
}

// OrderUserData returns the user data column alone; ErrNotFound.
func (s *Store) OrderUserData(ctx context.Context, id string) (string, error) {
	return readOne(ctx, s, "order user data", "order", scanValue[string], `SELECT user_data FROM orders WHERE id = ?`, id)
}

// PayOrder: awaitingPayment → paid, reporting whether this call moved
// the order; see imagestore.MarketStore.
func (s *Store) PayOrder(ctx context.Context, id string, paidAt, expiresAt time.Time) (bool, error) {
	paid, err := nanos("paid_at", paidAt)
	if err != nil {
		return false, fmt.Errorf("mark order paid: %w", err)
	}
	expires, err := nanos("expires_at", expiresAt)
	if err != nil {
		return false, fmt.Errorf("mark order paid: %w", err)
	}
	var moved bool
	err = s.write(ctx, "mark order paid", func(tx *Tx) (err error) {
		// Set on every attempt: a retried transaction says what its
		// last, committed attempt did.
		moved, err = transitionMoved(ctx, tx, id, func(st imagestore.OrderState) bool {
			return st == imagestore.OrderPaid || st == imagestore.OrderActive || st == imagestore.OrderExpired
		}, `
UPDATE orders SET state = 'paid', paid_at = ?, expires_at = ? WHERE id = ? AND state = 'awaitingPayment'`,
			paid, expires, id)
		return err
	})
	return moved && err == nil, err
}

// CancelOrder: awaitingPayment → cancelled; see imagestore.MarketStore.
func (s *Store) CancelOrder(ctx context.Context, id, reason string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("cancel order: %w", err)
	}
	return s.write(ctx, "cancel order", func(tx *Tx) error {
		return cancelAwaiting(ctx, tx, id, reason, at, func(st imagestore.OrderState) bool {
			return st == imagestore.OrderCancelled
		})
	})
}

// cancelAwaiting is the one conditional UPDATE that cancels an order
// awaiting payment, for every cancel: PayOrder's UPDATE asks for the same
// state, so of a cancel and a payment exactly one changes the row. left
// is transition's.
func cancelAwaiting(ctx context.Context, tx *Tx, id, reason string, at int64, left func(imagestore.OrderState) bool) error {
	return transition(ctx, tx, id, left, `
UPDATE orders SET state = 'cancelled', reason = ?, ended_at = ? WHERE id = ? AND state = 'awaitingPayment'`,
		reason, at, id)
}

// CancelOwnOrder: the buyer's awaitingPayment → cancelled; see
// imagestore.MarketStore.
func (s *Store) CancelOwnOrder(ctx context.Context, buyerID int64, id, reason string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("cancel own order: %w", err)
	}
	return s.write(ctx, "cancel own order", func(tx *Tx) error {
		// An order's buyer never changes, so reading it first decides
		// nothing the UPDATE's own WHERE on the state must.
		buyer, err := queryOne(ctx, tx, "order", scanValue[int64], `SELECT buyer_id FROM orders WHERE id = ?`, id)
		switch {
		case err != nil:
			return err
		case buyer != buyerID:
			return fmt.Errorf("order of another buyer: %w", imagestore.ErrNotFound)
		}
		return cancelAwaiting(ctx, tx, id, reason, at, never)
	})
}

// MarkOrderActive: paid → active; see imagestore.MarketStore.
func (s *Store) MarkOrderActive(ctx context.Context, id string) error {
	return s.write(ctx, "mark order active", func(tx *Tx) error {
		return transition(ctx, tx, id, func(st imagestore.OrderState) bool {
			return st == imagestore.OrderActive
		}, `UPDATE orders SET state = 'active' WHERE id = ? AND state = 'paid'`, id)
	})
}

// ExpireOrder: paid or active, with its month over at now → expired.
func (s *Store) ExpireOrder(ctx context.Context, id string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("expire order: %w", err)
	}
	return s.write(ctx, "expire order", func(tx *Tx) error {
		return transition(ctx, tx, id, func(st imagestore.OrderState) bool {
			return st == imagestore.OrderExpired
		}, `
UPDATE orders SET state = 'expired', ended_at = ?1
WHERE id = ?2 AND state IN ('paid', 'active') AND expires_at <= ?1`, at, id)
	})
}

// SetOrderNote sets an order's note, in any state; ErrNotFound.
func (s *Store) SetOrderNote(ctx context.Context, id, note string) error {
	return s.write(ctx, "set order note", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE orders SET note = ? WHERE id = ?`, note, id)
		if err != nil {
			return err
		}
		return mustChange(res, "order")
	})
}

// SetReplicaStates replaces an order's replica states in one transaction:
// a reader sees the old set or the new one, never a mix.
func (s *Store) SetReplicaStates(ctx context.Context, orderID string, states []imagestore.ReplicaState) error {
	fail := func(err error) error { return fmt.Errorf("set replica states: %w", err) }
	observed := make([]int64, len(states))
	seen := make(map[int]bool, len(states))
	for i, rs := range states {
		switch {
		case rs.Index < 0 || seen[rs.Index]:
			return fail(fmt.Errorf("replica index %d is negative or repeated", rs.Index))
		case !slices.Contains(imagestore.ReplicaStateNames, rs.State):
			return fail(fmt.Errorf("replica %d: state %q is not one of %v", rs.Index, rs.State, imagestore.ReplicaStateNames))
		}
		seen[rs.Index] = true
		var err error
		if observed[i], err = nanos("observed_at", rs.ObservedAt); err != nil {
			return fail(err)
		}
	}
	return s.write(ctx, "set replica states", func(tx *Tx) error {
		quantity, err := queryOne(ctx, tx, "order", scanValue[int], `SELECT quantity FROM orders WHERE id = ?`, orderID)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM replica_states WHERE order_id = ?`, orderID); err != nil {
			return err
		}
		for i, rs := range states {
			if rs.Index >= quantity {
				return fmt.Errorf("replica index %d, but the order has %d replicas", rs.Index, quantity)
			}
			_, err := tx.ExecContext(ctx, `
INSERT INTO replica_states (order_id, replica, name, state, detail, progress, observed_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				orderID, rs.Index, rs.Name, rs.State, rs.Detail, rs.Progress, observed[i])
			if err != nil {
				return err
			}
		}
		// The first replica seen running marks the order as having run:
		// from then on it is never refunded. On the order's own row, so
		// it and StartRefund's move from active exclude each other.
		for i, rs := range states {
			if rs.State == imagestore.ReplicaRunning {
				_, err := tx.ExecContext(ctx, `
UPDATE orders SET ran_at = ? WHERE id = ? AND ran_at IS NULL AND state IN ('paid', 'active', 'expired')`, observed[i], orderID)
				return err
			}
		}
		return nil
	})
}

// ReplicaStates returns an order's replica states by index; ErrNotFound.
func (s *Store) ReplicaStates(ctx context.Context, orderID string) ([]imagestore.ReplicaState, error) {
	var states []imagestore.ReplicaState
	err := s.read(ctx, "replica states", func(tx *Tx) error {
		if _, err := queryOne(ctx, tx, "order", scanValue[int], `SELECT 1 FROM orders WHERE id = ?`, orderID); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `
SELECT replica, name, state, detail, progress, observed_at FROM replica_states WHERE order_id = ? ORDER BY replica`, orderID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				rs       imagestore.ReplicaState
				observed int64
			)
			if err := rows.Scan(&rs.Index, &rs.Name, &rs.State, &rs.Detail, &rs.Progress, &observed); err != nil {
				return err
			}
			rs.ObservedAt = fromNanos(observed)
			states = append(states, rs)
		}
		return rows.Err()
	})
	return states, err
}

// OverdueOrders returns the orders awaiting payment with reserve_until <=
// now, by creation time and id.
func (s *Store) OverdueOrders(ctx context.Context, now time.Time) ([]imagestore.Order, error) {
	at, err := nanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("overdue orders: %w", err)
	}
	var orders []imagestore.Order
	err = s.read(ctx, "overdue orders", func(tx *Tx) (err error) {
		orders, err = queryOrders(ctx, tx, `SELECT `+orderCols+` FROM orders
WHERE state = 'awaitingPayment' AND reserve_until <= ? ORDER BY created_at, id`, at)
		return err
	})
	return orders, err
}

// OrderCounts counts the orders by state, every state present.
func (s *Store) OrderCounts(ctx context.Context) (map[imagestore.OrderState]int64, error) {
	counts := make(map[imagestore.OrderState]int64, len(imagestore.OrderStates))
	for _, st := range imagestore.OrderStates {
		counts[st] = 0
	}
	err := s.read(ctx, "order counts", func(tx *Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT state, count(*) FROM orders GROUP BY state`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				st string
				n  int64
			)
			if err := rows.Scan(&st, &n); err != nil {
				return err
			}
			counts[imagestore.OrderState(st)] = n
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return counts, nil
}

// SetOrderPaymentIntent records the order's PaymentIntent once.
func (s *Store) SetOrderPaymentIntent(ctx context.Context, id, paymentIntent string) error {
	if paymentIntent == "" {
		return errors.New("set order payment intent: payment intent missing")
	}
	return s.write(ctx, "set order payment intent", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE orders SET payment_intent = ? WHERE id = ? AND payment_intent IN ('', ?)`, paymentIntent, id, paymentIntent)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		if _, err := orderState(ctx, tx, id); err != nil {
			return err
		}
		return fmt.Errorf("order is paid by another PaymentIntent: %w", imagestore.ErrOrderState)
	})
}

// OrderByPaymentIntent returns the order paid by paymentIntent; ErrNotFound.
func (s *Store) OrderByPaymentIntent(ctx context.Context, paymentIntent string) (imagestore.Order, error) {
	if paymentIntent == "" {
		return imagestore.Order{}, fmt.Errorf("order by payment intent: %w", imagestore.ErrNotFound)
	}
	return readOne(ctx, s, "order by payment intent", "order", scanOrder,
		// The repeated "<> ''" lets SQLite use the partial index.
		`SELECT `+orderCols+` FROM orders WHERE payment_intent = ? AND payment_intent <> ''`, paymentIntent)
}

// SetOrderBlocked records or clears the cause that keeps an order from
// running; the first time the cause appeared is kept while it stays.
func (s *Store) SetOrderBlocked(ctx context.Context, id, cause string, now time.Time) error {
	if cause != "" && !slices.Contains(imagestore.BlockedCauses, cause) {
		return fmt.Errorf("set order blocked: cause %q is not one of %v", cause, imagestore.BlockedCauses)
	}
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("set order blocked: %w", err)
	}
	return s.write(ctx, "set order blocked", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE orders SET blocked_cause = ?1,
	blocked_since = CASE WHEN ?1 = '' THEN NULL WHEN blocked_cause = ?1 THEN blocked_since ELSE ?2 END
WHERE id = ?3`, cause, at, id)
		if err != nil {
			return err
		}
		return mustChange(res, "order")
	})
}

// StartRefund: paid, or cancelled with a payment, not disputed →
// refunding. The WHERE on the state is what excludes MarkOrderActive's
// move from paid, the one on disputed_at MarkOrderDisputed's mark.
func (s *Store) StartRefund(ctx context.Context, id, cause string, now time.Time) (bool, error) {
	if !slices.Contains(imagestore.RefundCauses, cause) {
		return false, fmt.Errorf("start refund: cause %q is not one of %v", cause, imagestore.RefundCauses)
	}
	at, err := nanos("now", now)
	if err != nil {
		return false, fmt.Errorf("start refund: %w", err)
	}
	var moved bool
	err = s.write(ctx, "start refund", func(tx *Tx) (err error) {
		moved, err = disputeTransition(ctx, tx, id, func(met stateDisputed) error {
			switch {
			case met.state.Refunded():
				return nil
			case met.disputed:
				return fmt.Errorf("order is %s: %w", met.state, imagestore.ErrDisputed)
			}
			return fmt.Errorf("order is %s: %w", met.state, imagestore.ErrOrderState)
		}, `
UPDATE orders SET refund_from = state, state = 'refunding', refund_cause = ?1, refund_next_at = ?2,
	refund_attempts = 0, refund_generation = 0, refund_id = '', refund_error = ''
WHERE id = ?3 AND payment_intent <> '' AND disputed_at IS NULL AND (state IN ('paid', 'cancelled')
	OR (state = 'active' AND ran_at IS NULL AND ?1 = 'importFailed'))`, cause, at, id)
		return err
	})
	return moved && err == nil, err
}

// stateDisputed is what a change of an order that changed nothing met:
// the order's state and whether its charge is disputed.
type stateDisputed struct {
	state    imagestore.OrderState
	disputed bool
}

func scanStateDisputed(r scanner) (stateDisputed, error) {
	var (
		m  stateDisputed
		st string
	)
	err := r.Scan(&st, &m.disputed)
	m.state = imagestore.OrderState(st)
	return m, err
}

// disputeTransition is transitionMoved for a change that also depends on
// the order's dispute: when update changed no row, met says what of what
// it met is an error (nil: the order is left as it is). ErrNotFound for
// no order.
func disputeTransition(ctx context.Context, tx *Tx, id string, met func(stateDisputed) error, update string, args ...any) (bool, error) {
	res, err := tx.ExecContext(ctx, update, args...)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err == nil, err
	}
	found, err := queryOne(ctx, tx, "order", scanStateDisputed, `SELECT state, disputed_at IS NOT NULL FROM orders WHERE id = ?`, id)
	if err != nil {
		return false, err
	}
	return false, met(found)
}

// DueRefunds lists the refunds whose next attempt is due at now.
func (s *Store) DueRefunds(ctx context.Context, now time.Time) ([]imagestore.Order, error) {
	at, err := nanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("due refunds: %w", err)
	}
	var orders []imagestore.Order
	err = s.read(ctx, "due refunds", func(tx *Tx) (err error) {
		orders, err = queryOrders(ctx, tx, `SELECT `+orderCols+` FROM orders
WHERE state IN ('refunding', 'refundFailed') AND refund_next_at <= ? AND disputed_at IS NULL ORDER BY created_at, id`, at)
		return err
	})
	return orders, err
}

// ClaimRefund moves a due refund's next attempt to until for this caller
// alone: the conditional UPDATE decides, as in every state change, and
// its WHERE on disputed_at is the last look before Stripe is asked.
func (s *Store) ClaimRefund(ctx context.Context, id string, now, until time.Time) (imagestore.Order, bool, error) {
	at, err := nanos("now", now)
	if err != nil {
		return imagestore.Order{}, false, fmt.Errorf("claim refund: %w", err)
	}
	end, err := nanos("until", until)
	if err != nil {
		return imagestore.Order{}, false, fmt.Errorf("claim refund: %w", err)
	}
	var (
		o       imagestore.Order
		claimed bool
	)
	err = s.write(ctx, "claim refund", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE orders SET refund_next_at = ?1, refund_attempts = refund_attempts + 1
WHERE id = ?2 AND state IN ('refunding', 'refundFailed') AND refund_next_at <= ?3 AND disputed_at IS NULL`, end, id, at)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if o, err = queryOne(ctx, tx, "order", scanOrder, `SELECT `+orderCols+` FROM orders WHERE id = ?`, id); err != nil {
			return err
		}
		claimed = n == 1
		return nil
	})
	if err != nil {
		return imagestore.Order{}, false, err
	}
	return o, claimed, nil
}

// SettleRefund records Stripe's answer to a refund attempt.
func (s *Store) SettleRefund(ctx context.Context, id string, out imagestore.RefundOutcome, now time.Time) error {
	fail := func(err error) error { return fmt.Errorf("settle refund: %w", err) }
	at, err := nanos("now", now)
	if err != nil {
		return fail(err)
	}
	if out.Status == refundSucceeded {
		return s.write(ctx, "settle refund", func(tx *Tx) error {
			return transition(ctx, tx, id, isRefunded, `
UPDATE orders SET state = 'refunded', refunded_at = ?1, refund_next_at = NULL, refund_error = '',
	refund_id = CASE WHEN ?2 = '' THEN refund_id ELSE ?2 END
WHERE id = ?3 AND state IN ('refunding', 'refundFailed')`, at, out.RefundID, id)
		})
	}
	if out.Disputed {
		// Held: refunding for good, due never (DueRefunds and
		// ClaimRefund pass it by); refund_next_at keeps the claim's
		// time only because the schema ties it to the state.
		return s.write(ctx, "settle refund", func(tx *Tx) error {
			return transition(ctx, tx, id, isRefunded, `
UPDATE orders SET state = 'refunding', disputed_at = coalesce(disputed_at, ?1), refund_error = ?2,
	refund_id = CASE WHEN ?3 = '' THEN refund_id ELSE ?3 END
WHERE id = ?4 AND state IN ('refunding', 'refundFailed')`, at, out.Error, out.RefundID, id)
		})
	}
	retry, err := nanos("retry at", out.RetryAt)
	if err != nil {
		return fail(err)
	}
	state := "refundFailed"
	if out.Error == "" && (out.Status == refundPending || out.Status == refundRequiresAction) {
		state = "refunding"
	}
	next := 0
	if out.NewKey {
		next = 1
	}
	return s.write(ctx, "settle refund", func(tx *Tx) error {
		// A disputed order's refund is held: refunding, never
		// refundFailed, whatever became of an attempt sent before.
		return transition(ctx, tx, id, isRefunded, `
UPDATE orders SET state = CASE WHEN disputed_at IS NULL THEN ?1 ELSE 'refunding' END, refund_next_at = ?2, refund_error = ?3,
	refund_generation = refund_generation + ?4,
	refund_id = CASE WHEN ?5 = '' THEN refund_id ELSE ?5 END
WHERE id = ?6 AND state IN ('refunding', 'refundFailed')`, state, retry, out.Error, next, out.RefundID, id)
	})
}

// Stripe's refund statuses the store tells apart (billing names them too;
// the store does not import billing).
const (
	refundSucceeded      = "succeeded"
	refundPending        = "pending"
	refundRequiresAction = "requires_action"
)

func isRefunded(st imagestore.OrderState) bool { return st == imagestore.OrderRefunded }

// MarkOrderDisputed records the first dispute of an order's charge, and
// holds its refund if it has one: refundFailed becomes refunding, never
// due again (DueRefunds and ClaimRefund pass a disputed order by).
func (s *Store) MarkOrderDisputed(ctx context.Context, id, disputeID string, now time.Time) (bool, error) {
	at, err := nanos("now", now)
	if err != nil {
		return false, fmt.Errorf("mark order disputed: %w", err)
	}
	if disputeID == "" {
		return false, errors.New("mark order disputed: dispute id missing")
	}
	var moved bool
	err = s.write(ctx, "mark order disputed", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE orders SET dispute_id = ?1, disputed_at = coalesce(disputed_at, ?2),
	state = CASE WHEN state = 'refundFailed' THEN 'refunding' ELSE state END
WHERE id = ?3 AND dispute_id = ''`, disputeID, at, id)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			if _, err := orderState(ctx, tx, id); err != nil {
				return err
			}
		}
		moved = n == 1
		return nil
	})
	return moved && err == nil, err
}

// CloseOrderDispute records the bank's first decision on the order's
// dispute.
func (s *Store) CloseOrderDispute(ctx context.Context, id, outcome string, now time.Time) (bool, error) {
	if !slices.Contains(imagestore.DisputeOutcomes, outcome) {
		return false, fmt.Errorf("close order dispute: outcome %q is not one of %v", outcome, imagestore.DisputeOutcomes)
	}
	at, err := nanos("now", now)
	if err != nil {
		return false, fmt.Errorf("close order dispute: %w", err)
	}
	var moved bool
	err = s.write(ctx, "close order dispute", func(tx *Tx) (err error) {
		moved, err = disputeTransition(ctx, tx, id, func(met stateDisputed) error {
			if !met.disputed {
				return fmt.Errorf("order (%s) has no dispute recorded: %w", met.state, imagestore.ErrOrderState)
			}
			return nil // closed before: the first decision stays
		}, `
UPDATE orders SET dispute_status = ?, dispute_closed_at = ?
WHERE id = ? AND disputed_at IS NOT NULL AND dispute_closed_at IS NULL`, outcome, at, id)
		return err
	})
	return moved && err == nil, err
}

// WebhookEventSeen reports whether the event id was recorded.
func (s *Store) WebhookEventSeen(ctx context.Context, id string) (bool, error) {
	var seen bool
	err := s.read(ctx, "webhook event seen", func(tx *Tx) error {
		return tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_events WHERE id = ?)`, id).Scan(&seen)
	})
	return seen, err
}

// RecordWebhookEvent inserts the event unless its id is recorded; the
// first record is kept.
func (s *Store) RecordWebhookEvent(ctx context.Context, ev imagestore.WebhookEvent) error {
	at, err := createdNanos(ev.At)
	if err != nil {
		return fmt.Errorf("record webhook event: %w", err)
	}
	if ev.ID == "" {
		return errors.New("sqlite: record webhook event: id missing")
	}
	return s.write(ctx, "record webhook event", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `
INSERT INTO webhook_events (id, type, result, at) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
			ev.ID, ev.Type, ev.Result, at)
		return err
	})
}
