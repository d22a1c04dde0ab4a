package sqlite

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// KeepReserve takes the store's emergency space back once the disk has
// room again, every so often until ctx ends.
func (s *Store) KeepReserve(ctx context.Context, every time.Duration, log *slog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.refill(log)
		}
	}
}

func (s *Store) refill(log *slog.Logger) {
	if err := s.RefillReserve(); err != nil && !errors.Is(err, imagestore.ErrNoSpace) {
		log.Warn("store reserve", "err", err)
	}
}

// RefillAfterDelete takes the store's emergency space back as soon as a
// deletion from blobs freed room: on a disk that something else fills
// again (another program, an upload), the next remove must find the
// reserve held, not wait for KeepReserve's next tick. Taking it is a
// no-op while it is held.
func RefillAfterDelete(blobs imagestore.Blobs, s *Store, log *slog.Logger) imagestore.Blobs {
	return refillAfterDelete{Blobs: blobs, st: s, log: log}
}

type refillAfterDelete struct {
	imagestore.Blobs
	st  *Store
	log *slog.Logger
}

func (b refillAfterDelete) Delete(ctx context.Context, id string) error {
	err := b.Blobs.Delete(ctx, id)
	b.st.refill(b.log)
	return err
}

func (b refillAfterDelete) RemovePartial(ctx context.Context, id string) error {
	err := b.Blobs.RemovePartial(ctx, id)
	b.st.refill(b.log)
	return err
}

func (b refillAfterDelete) RemoveQuarantined(ctx context.Context, id string) error {
	err := b.Blobs.RemoveQuarantined(ctx, id)
	b.st.refill(b.log)
	return err
}
