package imagestore

import (
	"context"
	"time"
)

// ConsoleKind is what a console shows of a replica: its screen (VNC) or
// its serial line.
type ConsoleKind string

const (
	ConsoleVNC    ConsoleKind = "vnc"
	ConsoleSerial ConsoleKind = "serial"
)

// ConsoleTicket is a single-use capability for one console of one replica
// of a buyer's order: a browser cannot send a bearer token on a WebSocket,
// so the tenant's token buys a ticket, and the ticket (in the URL) opens
// the WebSocket once, within its minute.
type ConsoleTicket struct {
	TenantID  int64
	OrderID   string
	Replica   int
	Kind      ConsoleKind
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ConsoleStore holds the console tickets, by the hash of their secret.
type ConsoleStore interface {
	// CreateConsoleTicket stores a ticket; ErrNotFound if its order or
	// tenant does not exist.
	CreateConsoleTicket(ctx context.Context, ticket Hash, ct ConsoleTicket) error
	// ConsumeConsoleTicket uses a ticket at now and returns it: one
	// conditional update, so of concurrent uses exactly one gets it.
	// ErrNotFound for a ticket unknown, used or expired at now: the
	// WebSocket answers all three alike.
	ConsumeConsoleTicket(ctx context.Context, ticket Hash, now time.Time) (ConsoleTicket, error)
}
