package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// The group commit of SQLite's records (sqlstore.GroupCommit), through
// CreateTicket, the write that uses it. imagestore/sqlite runs the shared
// store suite over the same records.

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func uploadID(n int) string { return fmt.Sprintf("%024x", n) }

// gate is the engine with a hand on the grouped writes: each one tells
// entered its op, then waits for release to be closed; fail, if set, is
// what its transaction returns after running every work in it, as a
// failed commit would.
type gate struct {
	sqlstore.Engine
	entered chan string
	release chan struct{}
	fail    error
	panics  bool // the transaction panics with fail instead
}

func (g *gate) Write(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	if !strings.HasPrefix(op, "create ticket") {
		return g.Engine.Write(ctx, op, fn)
	}
	g.entered <- op
	<-g.release
	return g.Engine.Write(ctx, op, func(tx *sqlstore.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		if g.panics && g.fail != nil {
			panic(g.fail)
		}
		return g.fail
	})
}

func open(t *testing.T) (*sqlite.Store, *gate) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	g := &gate{entered: make(chan string, 1000), release: make(chan struct{})}
	sqlstore.WrapEngine(st.Store, func(e sqlstore.Engine) sqlstore.Engine { g.Engine = e; return g })
	return st, g
}

func tenant(t *testing.T, st *sqlite.Store, name string) int64 {
	t.Helper()
	tn, err := st.CreateTenant(t.Context(), imagestore.Tenant{Name: name, Sharing: true}, imagestore.HashSecret("token "+name))
	if err != nil {
		t.Fatal(err)
	}
	return tn.ID
}

// call is one CreateTicket.
type call struct {
	tenant int64
	secret string
	id     int // upload id
	quota  int
}

func (c call) run(ctx context.Context, st *sqlite.Store) error {
	return st.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(c.id), TenantID: c.tenant, Name: c.secret,
		CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, imagestore.HashSecret(c.secret), c.quota)
}

// stored says whether c's ticket is in the records.
func stored(t *testing.T, st *sqlite.Store, c call) bool {
	t.Helper()
	_, err := st.Ticket(t.Context(), imagestore.HashSecret(c.secret))
	switch {
	case err == nil:
		return true
	case errors.Is(err, imagestore.ErrNotFound):
		return false
	}
	t.Fatalf("Ticket %s: %v", c.secret, err)
	return false
}

// waitQueued waits until n grouped writes are queued behind the batch the
// gate holds.
func waitQueued(t *testing.T, st *sqlite.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for sqlstore.Queued(st.Store) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d grouped writes queued, want %d", sqlstore.Queued(st.Store), n)
		}
		time.Sleep(time.Millisecond) // polling a condition, not waiting for time
	}
}

// hold starts c and returns once its batch is held by the gate; the
// result arrives on the channel.
func hold(t *testing.T, ctx context.Context, st *sqlite.Store, g *gate, c call) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- c.run(ctx, st) }()
	<-g.entered
	return res
}

// start runs each call in its own goroutine; the results come in order.
func start(ctx context.Context, st *sqlite.Store, calls []call) []chan error {
	res := make([]chan error, len(calls))
	for i, c := range calls {
		res[i] = make(chan error, 1)
		go func() { res[i] <- c.run(ctx, st) }()
	}
	return res
}

func TestGroupCommitConcurrentTickets(t *testing.T) {
	st, g := open(t)
	close(g.release)
	ids := []int64{tenant(t, st, "a"), tenant(t, st, "b"), tenant(t, st, "c")}
	const n = 300
	calls := make([]call, n)
	for i := range calls {
		calls[i] = call{tenant: ids[i%len(ids)], secret: fmt.Sprintf("s%d", i), id: i, quota: n}
	}
	for i, ch := range start(t.Context(), st, calls) {
		if err := <-ch; err != nil {
			t.Errorf("CreateTicket %d: %v", i, err)
		}
	}
	for _, c := range calls {
		if !stored(t, st, c) {
			t.Errorf("ticket %s answered but not stored", c.secret)
		}
	}
	if c := sqlstore.Commits(st.Store); c > n {
		t.Errorf("%d commits for %d tickets", c, n)
	}
}

// TestGroupCommitRefusals: refusals in one batch with tickets that pass
// are each their caller's own; the batch commits the others, in order
// (a quota counts the tickets before it in the batch).
func TestGroupCommitRefusals(t *testing.T) {
	st, g := open(t)
	a, b := tenant(t, st, "a"), tenant(t, st, "b")
	first := hold(t, t.Context(), st, g, call{tenant: a, secret: "first", id: 1})
	tests := []struct {
		name string
		c    call
		want error
	}{
		{"a's first of quota 2", call{tenant: b, secret: "b1", id: 10, quota: 2}, nil},
		{"duplicate hash", call{tenant: a, secret: "first", id: 11}, imagestore.ErrExists},
		{"a's second of quota 2", call{tenant: b, secret: "b2", id: 12, quota: 2}, nil},
		{"over quota", call{tenant: b, secret: "b3", id: 13, quota: 2}, imagestore.ErrQuota},
		{"unknown tenant", call{tenant: b + 1000, secret: "nobody", id: 14}, imagestore.ErrNotFound},
		{"duplicate upload id", call{tenant: a, secret: "again", id: 10}, imagestore.ErrExists},
		{"after the refusals", call{tenant: a, secret: "last", id: 15}, nil},
	}
	// Queued one by one, so that the batch runs them in this order.
	res := make([]chan error, len(tests))
	for i, tc := range tests {
		res[i] = start(t.Context(), st, []call{tc.c})[0]
		waitQueued(t, st, i+1)
	}
	before := sqlstore.Commits(st.Store)
	close(g.release)
	if err := <-first; err != nil {
		t.Fatalf("the held ticket: %v", err)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := <-res[i]
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("CreateTicket: %v", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("CreateTicket: %v, want %v", err, tc.want)
			}
			if tc.want == nil && !stored(t, st, tc.c) {
				t.Errorf("ticket answered but not stored")
			}
		})
	}
	if got := sqlstore.Commits(st.Store) - before; got != 2 {
		t.Errorf("%d commits after the release, want 2: the held one, then the queued ones in one", got)
	}
	for _, secret := range []string{"b3", "nobody", "again"} {
		if stored(t, st, call{secret: secret}) {
			t.Errorf("refused ticket %s stored", secret)
		}
	}
}

// TestGroupCommitFailure: a transaction that fails (or panics) fails
// every caller of its batch, refused or not, and stores none of them; the
// next batch is unaffected.
func TestGroupCommitFailure(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics %v", panics), func(t *testing.T) {
			st, g := open(t)
			a := tenant(t, st, "a")
			injected := errors.New("injected commit failure")
			g.fail, g.panics = injected, panics
			first := hold(t, t.Context(), st, g, call{tenant: a, secret: "first", id: 1})
			calls := []call{
				{tenant: a, secret: "s2", id: 2},
				{tenant: a, secret: "s3", id: 3, quota: 1}, // refused: first fills the quota
				{tenant: a, secret: "s4", id: 4},
			}
			var res []chan error
			for i, c := range calls {
				res = append(res, start(t.Context(), st, []call{c})...)
				waitQueued(t, st, i+1)
			}
			close(g.release)
			failed := func(err error) bool {
				if panics {
					return err != nil && strings.Contains(err.Error(), injected.Error())
				}
				return errors.Is(err, injected)
			}
			if err := <-first; !failed(err) {
				t.Errorf("held ticket: %v, want the injected failure", err)
			}
			for i, ch := range res {
				if err := <-ch; !failed(err) {
					t.Errorf("%s: %v, want the injected failure", calls[i].secret, err)
				}
			}
			for _, c := range append(calls, call{secret: "first"}) {
				if stored(t, st, c) {
					t.Errorf("ticket %s stored by a failed transaction", c.secret)
				}
			}
			g.fail = nil
			if err := (call{tenant: a, secret: "after", id: 5}).run(t.Context(), st); err != nil {
				t.Errorf("a ticket after the failed batch: %v", err)
			}
		})
	}
}

// TestGroupCommitContext: a caller whose context ends while its work is
// queued gets the context's error, and its work never runs; one whose work
// was taken into a batch stops waiting at once, told that its batch still
// runs, and the batch commits its work all the same.
func TestGroupCommitContext(t *testing.T) {
	st, g := open(t)
	a := tenant(t, st, "a")

	done, cancel := context.WithCancel(t.Context())
	cancel()
	early := call{tenant: a, secret: "cancelled before", id: 1}
	if err := early.run(done, st); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled before the call: %v", err)
	}

	takenCtx, cancelTaken := context.WithCancel(t.Context())
	taken := call{tenant: a, secret: "taken", id: 2}
	takenRes := hold(t, takenCtx, st, g, taken)
	queuedCtx, cancelQueued := context.WithCancel(t.Context())
	queued := call{tenant: a, secret: "queued", id: 3}
	queuedRes := start(queuedCtx, st, []call{queued})[0]
	waitQueued(t, st, 1)
	other := call{tenant: a, secret: "other", id: 4}
	otherRes := start(t.Context(), st, []call{other})[0]
	waitQueued(t, st, 2)

	cancelQueued()
	if err := <-queuedRes; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled while queued: %v", err)
	}
	waitQueued(t, st, 1) // out of the queue
	cancelTaken()
	if err := <-takenRes; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "no answer yet") {
		t.Errorf("cancelled once taken: %v, want at once that its batch has not answered yet", err)
	}
	close(g.release)
	if err := <-otherRes; err != nil {
		t.Errorf("queued beside a cancelled one: %v", err)
	}
	for _, tc := range []struct {
		c    call
		want bool
	}{{early, false}, {taken, true}, {queued, false}, {other, true}} {
		if got := stored(t, st, tc.c); got != tc.want {
			t.Errorf("ticket %q stored: %v, want %v", tc.c.secret, got, tc.want)
		}
	}
}

// TestGroupCommitClose: Close fails the queued writes, lets the batch
// being committed finish, and refuses writes after it.
func TestGroupCommitClose(t *testing.T) {
	st, g := open(t)
	a := tenant(t, st, "a")
	held := call{tenant: a, secret: "held", id: 1}
	heldRes := hold(t, t.Context(), st, g, held)
	queued := []call{{tenant: a, secret: "q1", id: 2}, {tenant: a, secret: "q2", id: 3}}
	res := start(t.Context(), st, queued)
	waitQueued(t, st, len(queued))

	closed := make(chan error, 1)
	go func() { closed <- st.Close() }()
	for i, ch := range res {
		if err := <-ch; !errors.Is(err, sqlstore.ErrClosed) {
			t.Errorf("%s queued at Close: %v", queued[i].secret, err)
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a batch was committing", err)
	default:
	}
	close(g.release)
	if err := <-heldRes; err != nil {
		t.Errorf("the batch committing at Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := (call{tenant: a, secret: "late", id: 4}).run(t.Context(), st); !errors.Is(err, sqlstore.ErrClosed) {
		t.Errorf("CreateTicket after Close: %v", err)
	}
}

// TestGroupCommitDeadline: a grouped write whose batch does not commit
// within the store's call deadline fails with ErrStoreUnavailable within
// it, queued or taken, and so does a write of its own behind it; the
// batch's own transaction is bounded by the same deadline.
func TestGroupCommitDeadline(t *testing.T) {
	const limit = 200 * time.Millisecond
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "vmshelf.db"), sqlite.WithCallTimeout(limit))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	g := &gate{entered: make(chan string, 1000), release: make(chan struct{})}
	sqlstore.WrapEngine(st.Store, func(e sqlstore.Engine) sqlstore.Engine { g.Engine = e; return g })
	a := tenant(t, st, "a")

	began := time.Now()
	taken := hold(t, t.Context(), st, g, call{tenant: a, secret: "taken", id: 1})
	queued := start(t.Context(), st, []call{{tenant: a, secret: "queued", id: 2}})[0]
	for name, res := range map[string]<-chan error{"taken": taken, "queued": queued} {
		if err := <-res; !errors.Is(err, imagestore.ErrStoreUnavailable) {
			t.Errorf("%s past the deadline: %v, want ErrStoreUnavailable", name, err)
		}
	}
	if took := time.Since(began); took > limit+time.Second {
		t.Errorf("the writes failed after %v, want within the %v deadline", took, limit)
	}
	close(g.release)
}
