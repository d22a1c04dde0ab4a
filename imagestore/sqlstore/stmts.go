package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// maxStmts bounds the statements a Stmts keeps: the records run a few
// dozen constant ones, so more means a statement built at run time,
// which runs unprepared rather than growing the set for good.
const maxStmts = 256

// Stmts keeps the statements run on a database prepared, so that running
// one again does not parse it again. SQLite (modernc's driver) parses
// every statement it is given anew, and for a ticket that was half the
// writer's CPU (the quota check is four subqueries): with the single
// writer's time the ticket route's capacity.
//
// The reads of a pool of connections gain as much: authentication
// (TenantByToken) runs on every tenant request, and a status runs half a
// dozen selects.
//
// A statement is prepared on the database, not in a transaction, which
// holds a connection (the only one of a single-writer pool; of a read
// pool, preparing would take a second while holding the first): a Tx
// meeting a statement for the first time runs it unprepared and notes it,
// and the engine prepares what was noted (PrepareNoted) once its
// transaction has ended. database/sql then finds the statement prepared
// on the connection a later transaction runs on (Tx.StmtContext), or
// prepares it there again if that connection is a new one.
type Stmts struct {
	db    *sql.DB
	mu    sync.Mutex
	ready map[string]*sql.Stmt
	noted map[string]bool // met, not prepared yet; false: preparing failed, never again
	want  int             // the entries of noted that are true
}

// NewStmts returns an empty set of statements for db.
func NewStmts(db *sql.DB) *Stmts {
	return &Stmts{db: db, ready: map[string]*sql.Stmt{}, noted: map[string]bool{}}
}

// stmt returns q prepared, or nil after noting it. A nil Stmts keeps
// nothing.
func (c *Stmts) stmt(q string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.ready[q]; ok {
		return st
	}
	if _, ok := c.noted[q]; !ok && len(c.ready)+len(c.noted) < maxStmts {
		c.noted[q] = true
		c.want++
	}
	return nil
}

// PrepareNoted prepares the statements noted since it last ran. It takes
// a connection of the database: call it outside any transaction. With
// nothing noted (every call once the statements are known) it only looks.
func (c *Stmts) PrepareNoted(ctx context.Context) {
	c.mu.Lock()
	if c.want == 0 {
		c.mu.Unlock()
		return
	}
	var qs []string
	for q, want := range c.noted {
		if want {
			qs = append(qs, q)
		}
	}
	c.mu.Unlock()
	for _, q := range qs {
		st, err := c.db.PrepareContext(ctx, q)
		c.mu.Lock()
		switch {
		case err == nil && c.ready[q] != nil: // prepared by another caller meanwhile
			_ = st.Close()
		case err == nil:
			c.ready[q] = st
			if c.noted[q] {
				c.want--
			}
			delete(c.noted, q)
		case ctx.Err() == nil && c.noted[q]:
			c.noted[q] = false // runs unprepared, as it did
			c.want--
		}
		c.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// Close closes the prepared statements.
func (c *Stmts) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, st := range c.ready {
		errs = append(errs, st.Close())
		delete(c.ready, q)
	}
	return errors.Join(errs...)
}

// Prepared is how many statements c holds prepared.
func (c *Stmts) Prepared() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ready)
}
