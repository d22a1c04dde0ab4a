package market

import (
	"context"
	"time"
)

// ticketRetention is how long ended tickets are kept after they end (for
// support questions about a failed upload) before the sweep forgets them.
const ticketRetention = 7 * 24 * time.Hour

// RunSweeper sweeps the tickets now and then every `every` until ctx is
// done: it counts tickets that expired unused
// (vmshelf_tickets_expired_total) and forgets those ended more than 7 days
// ago, writes the count of refusals whose log lines were suppressed, and
// settles unpaid orders whose checkout is overdue (sweepCheckouts). A
// failed sweep is logged and retried at the next tick.
func (s *Server) RunSweeper(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sweepOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sweepOnce(ctx context.Context) {
	// The refusals' summary is written at least this often, also when no
	// further refusal comes to write it.
	s.refusals.flush(ctx, s.cfg.Now())
	n, err := s.st.SweepTickets(ctx, s.cfg.Now(), ticketRetention)
	if err != nil && ctx.Err() == nil {
		s.log.Error("sweeping tickets failed", "err", err.Error())
	}
	if n > 0 {
		s.metrics.ticketsExpired.Add(float64(n))
	}
	s.sweepCheckouts(ctx)
	if s.afterSweep != nil {
		s.afterSweep(n, err)
	}
}
