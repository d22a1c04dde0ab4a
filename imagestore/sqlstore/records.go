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

// nanos converts t for storage. Unix nanoseconds in an int64 cover 1678 to
// 2262; a time outside that (the zero time, most likely a missing field)
// would otherwise wrap silently into a wrong date.
func nanos(field string, t time.Time) (int64, error) {
	n := t.UnixNano()
	if !time.Unix(0, n).Equal(t) {
		return 0, fmt.Errorf("%s %v out of range", field, t)
	}
	return n, nil
}

// createdNanos is nanos for a creation time, where the zero time means now.
func createdNanos(t time.Time) (int64, error) {
	if t.IsZero() {
		return time.Now().UnixNano(), nil
	}
	return nanos("created_at", t)
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

type scanner interface{ Scan(dest ...any) error }

const tenantCols = `id, name, in_mesh, sharing, hosts_vms, appliance, stripe_account, stripe_onboarded, stripe_charges, stripe_payouts, created_at`

func scanTenant(r scanner) (imagestore.Tenant, error) {
	var (
		t       imagestore.Tenant
		created int64
	)
	if err := r.Scan(&t.ID, &t.Name, &t.InMesh, &t.Sharing, &t.HostsVMs, &t.Appliance, &t.StripeAccount,
		&t.StripeOnboarded, &t.StripeChargesEnabled, &t.StripePayoutsEnabled, &created); err != nil {
		return imagestore.Tenant{}, err
	}
	t.CreatedAt = fromNanos(created)
	return t, nil
}

const ticketCols = `upload_id, tenant_id, name, efi, created_at, expires_at, used_at`

func scanTicket(r scanner) (imagestore.Ticket, error) {
	var (
		tk               imagestore.Ticket
		created, expires int64
		used             sql.NullInt64
	)
	if err := r.Scan(&tk.UploadID, &tk.TenantID, &tk.Name, &tk.EFI, &created, &expires, &used); err != nil {
		return imagestore.Ticket{}, err
	}
	tk.CreatedAt = fromNanos(created)
	tk.ExpiresAt = fromNanos(expires)
	if used.Valid {
		tk.UsedAt = fromNanos(used.Int64)
	}
	return tk, nil
}

const imageCols = `upload_id, tenant_id, name, efi, size, virtual_size, sha256, created_at, boot`

// extra receives columns selected after the image's own.
func scanImage(r scanner, extra ...any) (imagestore.Image, error) {
	var (
		img     imagestore.Image
		created int64
	)
	dest := append([]any{&img.UploadID, &img.TenantID, &img.Name, &img.EFI, &img.Size, &img.VirtualSize, &img.SHA256, &created, &img.Boot}, extra...)
	if err := r.Scan(dest...); err != nil {
		return imagestore.Image{}, err
	}
	img.CreatedAt = fromNanos(created)
	return img, nil
}

// notFound turns sql.ErrNoRows into imagestore.ErrNotFound, naming what was
// missing without the key: keys may be secret hashes.
func notFound(what string, err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, imagestore.ErrNotFound)
	}
	return err
}

// CreateTenant stores t under the token hash. A zero t.CreatedAt means now.
// ErrExists if the name or the token is taken.
func (s *Store) CreateTenant(ctx context.Context, t imagestore.Tenant, token imagestore.Hash) (imagestore.Tenant, error) {
	created, err := createdNanos(t.CreatedAt)
	if err != nil {
		return imagestore.Tenant{}, fmt.Errorf("create tenant: %w", err)
	}
	err = s.write(ctx, "create tenant", func(tx *Tx) error {
		err := tx.QueryRowContext(ctx, `
INSERT INTO tenants (name, token_hash, in_mesh, sharing, hosts_vms, appliance, stripe_account, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
RETURNING id`,
			t.Name, token[:], t.InMesh, t.Sharing, t.HostsVMs, t.Appliance, t.StripeAccount, created).Scan(&t.ID)
		if isUnique(err) {
			return fmt.Errorf("tenant name or token: %w", imagestore.ErrExists)
		}
		return err
	})
	if err != nil {
		return imagestore.Tenant{}, err
	}
	t.CreatedAt = fromNanos(created)
	return t, nil
}

// Tenant returns the tenant called name; ErrNotFound if there is none.
func (s *Store) Tenant(ctx context.Context, name string) (imagestore.Tenant, error) {
	return readOne(ctx, s, "tenant", "tenant", scanTenant, `SELECT `+tenantCols+` FROM tenants WHERE name = ?`, name)
}

// TenantByToken returns the tenant whose token hashes to token; ErrNotFound
// if there is none.
func (s *Store) TenantByToken(ctx context.Context, token imagestore.Hash) (imagestore.Tenant, error) {
	return readOne(ctx, s, "tenant by token", "tenant", scanTenant, `SELECT `+tenantCols+` FROM tenants WHERE token_hash = ?`, token[:])
}

// TenantByID returns the tenant with id; ErrNotFound if there is none.
func (s *Store) TenantByID(ctx context.Context, id int64) (imagestore.Tenant, error) {
	return readOne(ctx, s, "tenant by id", "tenant", scanTenant, `SELECT `+tenantCols+` FROM tenants WHERE id = ?`, id)
}

// Tenants returns all tenants ordered by name.
func (s *Store) Tenants(ctx context.Context) ([]imagestore.Tenant, error) {
	var ts []imagestore.Tenant
	err := s.readStatement(ctx, "tenants", func(tx *Tx) (err error) {
		ts, err = queryAll(ctx, tx, scanTenant, `SELECT `+tenantCols+` FROM tenants ORDER BY name`)
		return err
	})
	return ts, err
}

// UpdateTenant writes t's attributes to the tenant called t.Name; ID,
// CreatedAt and the token are left alone. ErrNotFound if there is none.
// An account other than the stored one is the operator's, made outside
// onboarding: what onboarding and Stripe's events said of the old one
// (onboarded, charges, payouts) is cleared with it, in the same
// statement, so that no flag of one account ever stands for another.
func (s *Store) UpdateTenant(ctx context.Context, t imagestore.Tenant) error {
	return s.write(ctx, "update tenant", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE tenants SET in_mesh = ?1, sharing = ?2, hosts_vms = ?3, appliance = ?4,
	stripe_onboarded = CASE WHEN stripe_account = ?5 THEN stripe_onboarded ELSE 0 END,
	stripe_charges = CASE WHEN stripe_account = ?5 THEN stripe_charges ELSE 0 END,
	stripe_payouts = CASE WHEN stripe_account = ?5 THEN stripe_payouts ELSE 0 END,
	stripe_account = ?5
WHERE name = ?6`,
			t.InMesh, t.Sharing, t.HostsVMs, t.Appliance, t.StripeAccount, t.Name)
		if err != nil {
			return err
		}
		return mustChange(res, "tenant")
	})
}

// SetTenantToken replaces the tenant's token hash, so the old token stops
// working at once. ErrNotFound if there is no such tenant, ErrExists if
// another tenant has this token.
func (s *Store) SetTenantToken(ctx context.Context, name string, token imagestore.Hash) error {
	return s.write(ctx, "set tenant token", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE tenants SET token_hash = ? WHERE name = ?`, token[:], name)
		if isUnique(err) {
			return fmt.Errorf("tenant token: %w", imagestore.ErrExists)
		}
		if err != nil {
			return err
		}
		return mustChange(res, "tenant")
	})
}

// mustChange reports ErrNotFound when a statement touched no row.
func mustChange(res sql.Result, what string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", what, imagestore.ErrNotFound)
	}
	return nil
}

// checkQuota returns ErrQuota when the tenant holds quota images or more;
// quota <= 0 means no limit. It is AddImage's check at commit: the upload
// being committed already holds a reservation (its ticket or session) that
// was admitted by checkReservations, so only stored images are counted
// here, and a tenant's other reservations never refuse a finished upload.
func checkQuota(ctx context.Context, tx *Tx, tenantID int64, quota int) error {
	if quota <= 0 {
		return nil
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM images WHERE tenant_id = ?`, tenantID).Scan(&n); err != nil {
		return err
	}
	if n >= int64(quota) {
		return imagestore.ErrQuota
	}
	return nil
}

// checkReservations returns ErrQuota when the tenant's stored images plus
// its reservations reach quota (quota <= 0 means no limit). A reservation
// is an unused ticket that has not expired at now, a plain upload still
// running (its ticket consumed, put_running set: whatever the ticket's
// expiry, the body is on its way), or an upload session that has not
// expired and is not finished: a finished session (offset = length) has
// become an image, or been refused, and is not counted a second time.
// A ticket is counted at most once: put_running is only ever set on a
// used ticket, and never on one that started a session.
func checkReservations(ctx context.Context, tx *Tx, tenantID int64, quota int, now int64) error {
	if quota <= 0 {
		return nil
	}
	// Each count stops at quota: whether the sum reaches quota is all
	// that is asked, so a tenant with many unused tickets costs no more
	// than one at its quota (a full count made a ticket O(tickets)).
	var n int64
	err := tx.QueryRowContext(ctx, `
SELECT (SELECT count(*) FROM (SELECT 1 FROM images WHERE tenant_id = ?1 LIMIT ?3) AS r)
     + (SELECT count(*) FROM (SELECT 1 FROM tickets WHERE tenant_id = ?1 AND used_at IS NULL AND expires_at > ?2 LIMIT ?3) AS r)
     + (SELECT count(*) FROM (SELECT 1 FROM tickets WHERE tenant_id = ?1 AND put_running = 1 LIMIT ?3) AS r)
     + (SELECT count(*) FROM (SELECT 1 FROM upload_sessions WHERE tenant_id = ?1 AND "offset" < length AND expires_at > ?2 LIMIT ?3) AS r)`,
		tenantID, now, quota).Scan(&n)
	if err != nil {
		return err
	}
	if n >= int64(quota) {
		return imagestore.ErrQuota
	}
	return nil
}

// CreateTicket stores tk under the ticket hash unless the tenant's stored
// images, unused tickets, running plain uploads and unfinished sessions
// (see checkReservations, with tk.CreatedAt as now) already reach quota
// (ErrQuota; quota <= 0 means no limit). A zero tk.CreatedAt means now;
// tk.UsedAt is ignored, a new ticket is unused. ErrExists if the hash or the
// upload id is taken, ErrNotFound if the tenant does not exist.
func (s *Store) CreateTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, quota int) error {
	created, err := createdNanos(tk.CreatedAt)
	if err != nil {
		return fmt.Errorf("create ticket: %w", err)
	}
	expires, err := nanos("expires_at", tk.ExpiresAt)
	if err != nil {
		return fmt.Errorf("create ticket: %w", err)
	}
	return s.writeGrouped(ctx, "create ticket", func(ctx context.Context, tx *Tx) error {
		if err := checkReservations(ctx, tx, tk.TenantID, quota, created); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `
INSERT INTO tickets (hash, upload_id, tenant_id, name, efi, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?)`,
			ticket[:], tk.UploadID, tk.TenantID, tk.Name, tk.EFI, created, expires)
		switch {
		case isUnique(err):
			return fmt.Errorf("ticket: %w", imagestore.ErrExists)
		case isForeignKey(err):
			return fmt.Errorf("tenant: %w", imagestore.ErrNotFound)
		}
		return err
	})
}

// Ticket returns the ticket without using it; ErrNotFound if there is none.
func (s *Store) Ticket(ctx context.Context, ticket imagestore.Hash) (imagestore.Ticket, error) {
	return readOne(ctx, s, "ticket", "ticket", scanTicket, `SELECT `+ticketCols+` FROM tickets WHERE hash = ?`, ticket[:])
}

// ConsumeTicket marks the ticket used at now and its plain upload running
// (it holds its quota place until AddImage or EndUpload). The decision is
// the single conditional UPDATE in consumeTicket, so of any number of
// concurrent callers, in this process or another, exactly one changes the
// row. A ticket both used and expired is reported as used.
func (s *Store) ConsumeTicket(ctx context.Context, ticket imagestore.Hash, now time.Time) (imagestore.Ticket, error) {
	at, err := nanos("now", now)
	if err != nil {
		return imagestore.Ticket{}, fmt.Errorf("consume ticket: %w", err)
	}
	var tk imagestore.Ticket
	err = s.write(ctx, "consume ticket", func(tx *Tx) (err error) {
		tk, err = consumeTicket(ctx, tx, ticket, at, plainUpload)
		return err
	})
	if err != nil {
		return imagestore.Ticket{}, err
	}
	return tk, nil
}

// uploadKind says what a consumed ticket starts: a plain upload holds its
// quota place through the ticket's put_running mark, a resumable one
// through its session (counted itself, so its ticket must not be too).
type uploadKind bool

const (
	plainUpload   uploadKind = true
	sessionUpload uploadKind = false
)

// consumeTicket is the one place a ticket is used, shared by ConsumeTicket
// and StartSession so that both decide alike: the conditional UPDATE either
// changes the row or not, and only a loser reads the row afterwards to say
// why (ErrNotFound, ErrTicketUsed, ErrTicketExpired). The same UPDATE marks
// a plain upload running, so a consumed ticket never lacks its mark.
func consumeTicket(ctx context.Context, tx *Tx, ticket imagestore.Hash, at int64, kind uploadKind) (imagestore.Ticket, error) {
	tk, err := scanTicket(tx.QueryRowContext(ctx, `
UPDATE tickets SET used_at = ?1, put_running = ?3
WHERE hash = ?2 AND used_at IS NULL AND expires_at > ?1
RETURNING `+ticketCols,
		at, ticket[:], bool(kind)))
	if !errors.Is(err, sql.ErrNoRows) {
		return tk, err
	}
	var used sql.NullInt64
	err = tx.QueryRowContext(ctx, `SELECT used_at FROM tickets WHERE hash = ?`, ticket[:]).Scan(&used)
	switch {
	case err != nil:
		return imagestore.Ticket{}, notFound("ticket", err)
	case used.Valid:
		return imagestore.Ticket{}, imagestore.ErrTicketUsed
	default:
		return imagestore.Ticket{}, imagestore.ErrTicketExpired
	}
}

// EndUpload clears the plain upload's running mark; a missing ticket, or
// one not marked (ended already, or a session's), is not an error, so a
// retry after a lost answer succeeds.
func (s *Store) EndUpload(ctx context.Context, uploadID string) error {
	return s.write(ctx, "end upload", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE tickets SET put_running = 0 WHERE upload_id = ? AND put_running = 1`, uploadID)
		return err
	})
}

// EndRunningUploads clears every running mark in one statement and returns
// how many there were.
func (s *Store) EndRunningUploads(ctx context.Context) (int, error) {
	return s.execCount(ctx, "end running uploads", `UPDATE tickets SET put_running = 0 WHERE put_running = 1`)
}

// EndUnleasedUploads clears, in one statement, the running marks of plain
// uploads that started before startedBefore and whose lease is not held
// at now (no row, or expired, or released).
func (s *Store) EndUnleasedUploads(ctx context.Context, leasePrefix string, now, startedBefore time.Time) (int, error) {
	at, err := nanos("now", now)
	if err != nil {
		return 0, fmt.Errorf("end unleased uploads: %w", err)
	}
	before, err := nanos("startedBefore", startedBefore)
	if err != nil {
		return 0, fmt.Errorf("end unleased uploads: %w", err)
	}
	return s.execCount(ctx, "end unleased uploads", `
UPDATE tickets SET put_running = 0
WHERE put_running = 1 AND used_at < ?2
  AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.name = ?3 || tickets.upload_id AND leases.expires_at > ?1)`,
		at, before, leasePrefix)
}

// SweepTickets first counts unused tickets that expired at or before now
// and were not counted by an earlier sweep, then deletes tickets, used or
// not, that expired more than retain before now; both in writes of at most
// imagestore.SweepBatch tickets. Counting comes first so that a ticket
// which expires and ages out between two sweeps is still counted once; a
// sweep stopped between two writes leaves the rest for the next.
func (s *Store) SweepTickets(ctx context.Context, now time.Time, retain time.Duration) (int, error) {
	at, err := nanos("now", now)
	if err != nil {
		return 0, fmt.Errorf("sweep tickets: %w", err)
	}
	cutoff, err := nanos("cutoff", now.Add(-retain))
	if err != nil {
		return 0, fmt.Errorf("sweep tickets: %w", err)
	}
	counted, err := s.sweepInBatches(ctx, `
UPDATE tickets SET expiry_counted = 1
WHERE upload_id IN (SELECT upload_id FROM tickets
	WHERE used_at IS NULL AND expiry_counted = 0 AND expires_at <= ? LIMIT ?)`, at)
	if err != nil {
		return int(counted), err
	}
	if _, err := s.sweepInBatches(ctx, `
DELETE FROM tickets WHERE upload_id IN (SELECT upload_id FROM tickets WHERE expires_at < ? LIMIT ?)`, cutoff); err != nil {
		return int(counted), err
	}
	// Console tickets live a minute; the same retention keeps them
	// for the same questions.
	if _, err := s.sweepInBatches(ctx, `
DELETE FROM console_tickets WHERE hash IN (SELECT hash FROM console_tickets WHERE expires_at < ? LIMIT ?)`, cutoff); err != nil {
		return int(counted), err
	}
	// A power request's answer is kept for a retry after a lost answer:
	// a retry comes within minutes, never after the retention.
	if _, err := s.sweepInBatches(ctx, `
DELETE FROM power_requests WHERE (order_id, request_id) IN
	(SELECT order_id, request_id FROM power_requests WHERE taken_at < ? LIMIT ?)`, cutoff); err != nil {
		return int(counted), err
	}
	return int(counted), nil
}

// sweepInBatches runs query (its parameters: arg, then the batch size) in
// writes of its own until one changes fewer than imagestore.SweepBatch
// rows, and returns the rows changed.
func (s *Store) sweepInBatches(ctx context.Context, query string, arg int64) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.write(ctx, "sweep tickets", func(tx *Tx) error {
			res, err := tx.ExecContext(ctx, query, arg, imagestore.SweepBatch)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < imagestore.SweepBatch {
			return total, nil
		}
	}
}

// AddImage records a committed image unless the tenant already holds quota
// images (ErrQuota; quota <= 0 means no limit), and in the same
// transaction ends its plain upload's running mark, so that the upload is
// counted as the image alone from the commit on. A refused AddImage leaves
// the mark for the caller's EndUpload. A zero img.CreatedAt means now.
// ErrExists if the upload id is taken, ErrNotFound if the tenant does not
// exist.
func (s *Store) AddImage(ctx context.Context, img imagestore.Image, quota int) error {
	created, err := createdNanos(img.CreatedAt)
	if err != nil {
		return fmt.Errorf("add image: %w", err)
	}
	return s.write(ctx, "add image", func(tx *Tx) error {
		// A retried AddImage should hear that the image is already there,
		// not that the quota it fills is full.
		if err := absent(ctx, tx, "image", `SELECT 1 FROM images WHERE upload_id = ?`, img.UploadID); err != nil {
			return err
		}
		if err := checkQuota(ctx, tx, img.TenantID, quota); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `
INSERT INTO images (upload_id, tenant_id, name, efi, size, virtual_size, sha256, created_at, boot)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			img.UploadID, img.TenantID, img.Name, img.EFI, img.Size, img.VirtualSize, img.SHA256, created, img.Boot)
		switch {
		case isUnique(err):
			return fmt.Errorf("image: %w", imagestore.ErrExists)
		case isForeignKey(err):
			return fmt.Errorf("tenant: %w", imagestore.ErrNotFound)
		case err != nil:
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE tickets SET put_running = 0 WHERE upload_id = ? AND put_running = 1`, img.UploadID)
		if err != nil {
			return err
		}
		// The file is recorded: it needs no intent to explain it any more.
		_, err = tx.ExecContext(ctx, `DELETE FROM blob_intents WHERE upload_id = ? AND kind = ?`, img.UploadID, string(imagestore.IntentCommit))
		return err
	})
}

// Image returns the image; ErrNotFound if there is none.
func (s *Store) Image(ctx context.Context, uploadID string) (imagestore.Image, error) {
	return readOne(ctx, s, "image", "image", func(r scanner) (imagestore.Image, error) { return scanImage(r) },
		`SELECT `+imageCols+` FROM images WHERE upload_id = ?`, uploadID)
}

// Images returns the tenant's images, oldest first; ties are broken by
// upload id so the order is stable.
func (s *Store) Images(ctx context.Context, tenantID int64) ([]imagestore.Image, error) {
	var imgs []imagestore.Image
	err := s.readStatement(ctx, "images", func(tx *Tx) (err error) {
		imgs, err = queryAll(ctx, tx, func(r scanner) (imagestore.Image, error) { return scanImage(r) }, `
SELECT `+imageCols+` FROM images WHERE tenant_id = ? ORDER BY created_at, upload_id`, tenantID)
		return err
	})
	return imgs, err
}

// ImageIDs returns the upload ids of all images, sorted.
func (s *Store) ImageIDs(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.read(ctx, "image ids", func(tx *Tx) (err error) {
		ids, err = queryIDs(ctx, tx, `SELECT upload_id FROM images ORDER BY upload_id`)
		return err
	})
	return ids, err
}

// RemoveImage deletes the tenant's image, revokes its fetch tokens and
// writes its remove intent.
// ErrNotFound if the tenant has no such image, including when another
// tenant has it (which is checked first, so another tenant does not learn
// that an order uses it); ErrInUse if an order that holds capacity names
// it, asked in the same transaction, so an order placed meanwhile is
// seen (CreateOrder checks the image in its transaction as well).
func (s *Store) RemoveImage(ctx context.Context, tenantID int64, uploadID string) error {
	// revoked_at is a record for operators, not an input to any decision,
	// so the wall clock is good enough here.
	revoked := time.Now().UnixNano()
	return s.write(ctx, "remove image", func(tx *Tx) error {
		dropped, err := dropImage(ctx, tx, `tenant_id = ? AND upload_id = ?`, revoked, tenantID, uploadID)
		if err != nil {
			return err
		}
		if !dropped {
			return fmt.Errorf("image: %w", imagestore.ErrNotFound)
		}
		// The file outlives the record until the caller deletes it: the
		// intent explains it meanwhile, to start-up and to the sweep.
		return intend(ctx, tx, uploadID, imagestore.IntentRemove, revoked)
	})
}

// CreateFetchToken stores a fetch capability for an existing image;
// ErrNotFound if the image does not exist, ErrExists if the hash is taken.
func (s *Store) CreateFetchToken(ctx context.Context, token imagestore.Hash, ft imagestore.FetchToken) error {
	expires, err := nanos("expires_at", ft.ExpiresAt)
	if err != nil {
		return fmt.Errorf("create fetch token: %w", err)
	}
	return s.write(ctx, "create fetch token", func(tx *Tx) error {
		if _, err := queryOne(ctx, tx, "image", scanValue[int], `SELECT 1 FROM images WHERE upload_id = ?`, ft.UploadID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `
INSERT INTO fetch_tokens (hash, upload_id, order_id, expires_at) VALUES (?, ?, ?, ?)`,
			token[:], ft.UploadID, ft.OrderID, expires)
		if isUnique(err) {
			return fmt.Errorf("fetch token: %w", imagestore.ErrExists)
		}
		return err
	})
}

// ImageForToken returns the image a token names and when the token
// expires, if the token is known, not revoked and not expired at now.
func (s *Store) ImageForToken(ctx context.Context, token imagestore.Hash, now time.Time) (imagestore.Image, time.Time, error) {
	at, err := nanos("now", now)
	if err != nil {
		return imagestore.Image{}, time.Time{}, fmt.Errorf("image for token: %w", err)
	}
	type found struct {
		img     imagestore.Image
		expires int64
	}
	f, err := readOne(ctx, s, "image for token", "fetch token", func(r scanner) (f found, err error) {
		f.img, err = scanImage(r, &f.expires)
		return f, err
	}, `
SELECT i.upload_id, i.tenant_id, i.name, i.efi, i.size, i.virtual_size, i.sha256, i.created_at, i.boot, f.expires_at
FROM fetch_tokens f JOIN images i ON i.upload_id = f.upload_id
WHERE f.hash = ? AND f.revoked_at IS NULL AND f.expires_at > ?`, token[:], at)
	if err != nil {
		return imagestore.Image{}, time.Time{}, err
	}
	return f.img, fromNanos(f.expires), nil
}

// RevokeOrderTokens revokes the order's live fetch tokens at now and
// counts them.
func (s *Store) RevokeOrderTokens(ctx context.Context, orderID string, now time.Time) (int, error) {
	fail := func(err error) (int, error) { return 0, fmt.Errorf("revoke order tokens: %w", err) }
	if orderID == "" {
		return fail(errors.New("order id missing (an empty one names the operators' tokens)"))
	}
	at, err := nanos("now", now)
	if err != nil {
		return fail(err)
	}
	var n int64
	err = s.write(ctx, "revoke order tokens", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE fetch_tokens SET revoked_at = ? WHERE order_id = ? AND revoked_at IS NULL`, at, orderID)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

const sessionCols = `upload_id, tenant_id, name, efi, length, "offset", hash_state, created_at, expires_at`

func scanSession(r scanner) (imagestore.UploadSession, error) {
	var (
		us               imagestore.UploadSession
		created, expires int64
	)
	if err := r.Scan(&us.UploadID, &us.TenantID, &us.Name, &us.EFI, &us.Length, &us.Offset, &us.HashState, &created, &expires); err != nil {
		return imagestore.UploadSession{}, err
	}
	us.CreatedAt = fromNanos(created)
	us.ExpiresAt = fromNanos(expires)
	return us, nil
}

// blob returns b for binding as a BLOB: the driver binds a nil slice as
// NULL, which the NOT NULL column refuses, while an empty hash state is
// merely unusual.
func blob(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// StartSession consumes the ticket at now (see consumeTicket) and creates
// the session under the session hash in the same transaction, so a ticket
// yields at most one session and a refused session leaves the ticket
// unused. UploadID, TenantID, Name and EFI come from the ticket; the rest
// from us, where a zero CreatedAt means now. Errors: those of
// ConsumeTicket, and ErrExists if the session hash is taken.
func (s *Store) StartSession(ctx context.Context, ticket, session imagestore.Hash, us imagestore.UploadSession, now time.Time) (imagestore.UploadSession, error) {
	fail := func(err error) (imagestore.UploadSession, error) {
		return imagestore.UploadSession{}, fmt.Errorf("start session: %w", err)
	}
	at, err := nanos("now", now)
	if err != nil {
		return fail(err)
	}
	created, err := createdNanos(us.CreatedAt)
	if err != nil {
		return fail(err)
	}
	expires, err := nanos("expires_at", us.ExpiresAt)
	if err != nil {
		return fail(err)
	}
	if us.Length < 0 || us.Offset < 0 || us.Offset > us.Length {
		return fail(fmt.Errorf("offset %d and length %d do not describe an upload", us.Offset, us.Length))
	}
	var stored imagestore.UploadSession
	err = s.write(ctx, "start session", func(tx *Tx) error {
		tk, err := consumeTicket(ctx, tx, ticket, at, sessionUpload)
		if err != nil {
			return err
		}
		// RETURNING hands back what was stored, so the caller sees the
		// same values a later Session would.
		stored, err = scanSession(tx.QueryRowContext(ctx, `
INSERT INTO upload_sessions (hash, upload_id, tenant_id, name, efi, length, "offset", hash_state, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING `+sessionCols,
			session[:], tk.UploadID, tk.TenantID, tk.Name, tk.EFI, us.Length, us.Offset, blob(us.HashState), created, expires))
		if isUnique(err) {
			return fmt.Errorf("upload session: %w", imagestore.ErrExists)
		}
		return err
	})
	if err != nil {
		return imagestore.UploadSession{}, err
	}
	return stored, nil
}

// Session returns the session whose id hashes to session, expired or not
// (the caller compares ExpiresAt with its clock); ErrNotFound if there is
// none.
func (s *Store) Session(ctx context.Context, session imagestore.Hash) (imagestore.UploadSession, error) {
	return readOne(ctx, s, "session", "upload session", scanSession, `SELECT `+sessionCols+` FROM upload_sessions WHERE hash = ?`, session[:])
}

// SaveProgress records offset and hashState and sets the expiry to
// expiresAt. ErrNotFound if the session has ended (or expired and been
// swept): the caller must then stop writing, its partial file may be gone.
// An offset outside [0, Length] is refused by the schema.
func (s *Store) SaveProgress(ctx context.Context, uploadID string, offset int64, hashState []byte, expiresAt time.Time) error {
	expires, err := nanos("expires_at", expiresAt)
	if err != nil {
		return fmt.Errorf("save progress: %w", err)
	}
	return s.write(ctx, "save progress", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE upload_sessions SET "offset" = ?, hash_state = ?, expires_at = ? WHERE upload_id = ?`,
			offset, blob(hashState), expires, uploadID)
		if err != nil {
			return err
		}
		return mustChange(res, "upload session")
	})
}

// EndSession forgets the session; a missing one is not an error, so a
// retry after a lost answer, or an end racing the expiry sweep, succeeds.
// The ticket stays used.
func (s *Store) EndSession(ctx context.Context, uploadID string) error {
	return s.write(ctx, "end session", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM upload_sessions WHERE upload_id = ?`, uploadID)
		return err
	})
}

// ExpireSessions deletes the sessions with expires_at <= now (a session is
// dead at its ExpiresAt, like a ticket) and returns their upload ids,
// sorted. Deletion and listing are one statement in one transaction, so of
// two concurrent sweeps each id is returned by exactly one.
func (s *Store) ExpireSessions(ctx context.Context, now time.Time) ([]string, error) {
	at, err := nanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("expire sessions: %w", err)
	}
	var ids []string
	err = s.write(ctx, "expire sessions", func(tx *Tx) (err error) {
		ids, err = queryIDs(ctx, tx, `DELETE FROM upload_sessions WHERE expires_at <= ? RETURNING upload_id`, at)
		return err
	})
	if err != nil {
		return nil, err
	}
	// RETURNING promises no order.
	slices.Sort(ids)
	return ids, nil
}

// OpenSessions returns the tenant's sessions with offset < length and
// expires_at > now, by creation time and upload id.
func (s *Store) OpenSessions(ctx context.Context, tenantID int64, now time.Time) ([]imagestore.UploadSession, error) {
	at, err := nanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	var out []imagestore.UploadSession
	err = s.readStatement(ctx, "open sessions", func(tx *Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT `+sessionCols+` FROM upload_sessions
WHERE tenant_id = ? AND "offset" < length AND expires_at > ?
ORDER BY created_at, upload_id`, tenantID, at)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			us, err := scanSession(rows)
			if err != nil {
				return err
			}
			out = append(out, us)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SessionUploadIDs returns the upload ids of all sessions not yet ended or
// swept, expired or not, sorted.
func (s *Store) SessionUploadIDs(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.read(ctx, "session upload ids", func(tx *Tx) (err error) {
		ids, err = queryIDs(ctx, tx, `SELECT upload_id FROM upload_sessions ORDER BY upload_id`)
		return err
	})
	return ids, err
}

// queryIDs runs a query yielding one text column and collects it.
func queryIDs(ctx context.Context, tx *Tx, query string, args ...any) ([]string, error) {
	return queryAll(ctx, tx, scanValue[string], query, args...)
}

// Stats returns the number of images and their total size.
func (s *Store) Stats(ctx context.Context) (imagestore.Stats, error) {
	var st imagestore.Stats
	err := s.read(ctx, "stats", func(tx *Tx) error {
		return tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM images`).Scan(&st.Images, &st.ImageBytes)
	})
	return st, err
}
