package sqlstore

// ErrClosed answers grouped writes after Close.
var ErrClosed = errClosed

// Commits is how many batches the group commit of s has run.
func Commits(s *Store) int64 { return s.group.commits.Load() }

// Queued is how many grouped writes wait in the queue of s, not yet taken
// into a batch.
func Queued(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// WrapEngine puts wrap's engine between the records of s (grouped or not)
// and their engine. Call it before the first write.
func WrapEngine(s *Store, wrap func(Engine) Engine) {
	s.e = wrap(s.e)
	if s.group != nil {
		s.group.e = s.e
	}
}
