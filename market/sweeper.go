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
// ago, and settles unpaid orders whose checkout is overdue
// (sweepCheckouts). A failed sweep is logged and retried at the next tick.
// It acts on every record, so over a shared store only the leader runs
// it; what each replica does for itself is RunRefusalSummary's.
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

// RunRefusalSummary writes the summary of this replica's suppressed
// refusal lines (see refusalLog) every suppressedEvery, also when no
// further refusal comes to write it, and once more when ctx ends. Every
// replica runs it for its own log: the counts are its own, and the leader
// cannot write them.
func (s *Server) RunRefusalSummary(ctx context.Context) {
	s.runRefusalSummary(ctx, suppressedEvery)
}

func (s *Server) runRefusalSummary(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.flushRefusals(context.WithoutCancel(ctx))
			return
		case <-t.C:
			s.flushRefusals(ctx)
		}
	}
}

// flushRefusals writes the refusals' summary now.
func (s *Server) flushRefusals(ctx context.Context) {
	s.refusals.flush(ctx, s.cfg.Now())
}
