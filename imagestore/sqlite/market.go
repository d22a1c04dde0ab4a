package sqlite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The market's records follow in the next commits; until then every
// method says so instead of pretending to have stored anything.
var errMarketPending = fmt.Errorf("sqlite: market records: %w", errors.ErrUnsupported)

func (s *Store) CreateListing(ctx context.Context, l imagestore.Listing) (imagestore.Listing, error) {
	return imagestore.Listing{}, errMarketPending
}
func (s *Store) Listing(ctx context.Context, id string) (imagestore.Listing, error) {
	return imagestore.Listing{}, errMarketPending
}
func (s *Store) Listings(ctx context.Context, hostID int64) ([]imagestore.Listing, error) {
	return nil, errMarketPending
}
func (s *Store) OpenListings(ctx context.Context) ([]imagestore.Listing, error) {
	return nil, errMarketPending
}
func (s *Store) CloseListing(ctx context.Context, hostID int64, id string, now time.Time) error {
	return errMarketPending
}
func (s *Store) CreateOrder(ctx context.Context, o imagestore.Order, userData string) error {
	return errMarketPending
}
func (s *Store) SetCheckout(ctx context.Context, orderID, checkoutID, checkoutURL string) error {
	return errMarketPending
}
func (s *Store) Order(ctx context.Context, id string) (imagestore.Order, error) {
	return imagestore.Order{}, errMarketPending
}
func (s *Store) Orders(ctx context.Context, buyerID int64) ([]imagestore.Order, error) {
	return nil, errMarketPending
}
func (s *Store) OrdersInState(ctx context.Context, state imagestore.OrderState) ([]imagestore.Order, error) {
	return nil, errMarketPending
}
func (s *Store) OrderUserData(ctx context.Context, id string) (string, error) {
	return "", errMarketPending
}
func (s *Store) MarkOrderPaid(ctx context.Context, id string, paidAt, expiresAt time.Time) error {
	return errMarketPending
}
func (s *Store) CancelOrder(ctx context.Context, id, reason string, now time.Time) error {
	return errMarketPending
}
func (s *Store) OverdueOrders(ctx context.Context, now time.Time) ([]imagestore.Order, error) {
	return nil, errMarketPending
}
func (s *Store) OrderCounts(ctx context.Context) (map[imagestore.OrderState]int64, error) {
	return nil, errMarketPending
}
func (s *Store) WebhookEventSeen(ctx context.Context, id string) (bool, error) {
	return false, errMarketPending
}
func (s *Store) RecordWebhookEvent(ctx context.Context, ev imagestore.WebhookEvent) error {
	return errMarketPending
}
