package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/postgres"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/internal/datadir"
)

// The layout of --data-dir.
const (
	dbFile    = "vmshelf.db"
	imagesDir = "vm-images"
	devToken  = "dev-token"
	serveLock = "serve.lock"
	// publicURLFile holds the base of the URLs the edge serving the data
	// dir hands out, for fetch-url run beside it.
	publicURLFile = "public-url"
	defaultData   = "./vmshelf-data"
)

// prepareDataDir is datadir.Prepare of dir and its image directory; what
// it refuses is a usage error: a bad --data-dir stops serve before any port
// is opened.
func prepareDataDir(dir string) error {
	if err := datadir.Prepare(dir, imagesDir); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// storeURLEnv selects the PostgreSQL store: an environment variable only,
// never a flag, since the URL may carry a password and a command line is
// visible to every user.
const storeURLEnv = "VMSHELF_STORE_URL"

// storeURLVar is its line in the help of every command that opens the
// store.
var storeURLVar = cli.EnvVar{Name: storeURLEnv, About: "postgres://user:password@host/db: the records in " +
	"PostgreSQL instead of the SQLite file in --data-dir, shared by every serve replica " +
	"(docs/scale-out.md). Never a flag: the URL may carry a password."}

// records is the store the commands open: the embedded SQLite file in
// --data-dir, or PostgreSQL when VMSHELF_STORE_URL is set (several serve
// replicas share it).
type records struct {
	imagestore.Store
	local *sqlite.Store // the embedded store; nil on PostgreSQL
	// name and short are what messages call the store ("data dir D:
	// vmshelf.db" and "vmshelf.db"); never the URL.
	name, short string
}

// shared reports whether the records live in PostgreSQL, where other
// replicas may use them at the same time.
func (r *records) shared() bool { return r.local == nil }

// openRecords opens the records: PostgreSQL if getenv(storeURLEnv) is set,
// else the SQLite file under dir, created if create is set. The CLI
// commands use it while serve runs: SQLite's WAL and busy timeout let them
// share the file. Only serve and 'tenant add' create a store, so a
// mistyped --data-dir is an error instead of a new, empty store.
// callTimeout bounds every call of the records (0: the store's default).
func openRecords(ctx context.Context, dir string, create bool, getenv func(string) string, callTimeout time.Duration, opts ...sqlite.Option) (*records, error) {
	if url := getenv(storeURLEnv); url != "" {
		st, err := postgres.Open(ctx, url, sqlstore.CallTimeout(callTimeout))
		if err != nil {
			// postgres.Open's errors never repeat the URL.
			return nil, fmt.Errorf("open the PostgreSQL store (%s): %w", storeURLEnv, err)
		}
		return &records{Store: st, name: "the PostgreSQL store (" + storeURLEnv + ")", short: "the PostgreSQL database"}, nil
	}
	if !create {
		if _, err := os.Stat(filepath.Join(dir, dbFile)); err != nil {
			return nil, usagef("no vmshelf store in %s (check --data-dir)", dir)
		}
	}
	if err := prepareDataDir(dir); err != nil {
		return nil, err
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, dbFile), append(opts, sqlite.WithCallTimeout(callTimeout))...)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return &records{Store: st, local: st, name: "data dir " + dir + ": " + dbFile, short: dbFile}, nil
}

// lockDataDir keeps a second serve off the same data dir: its start-up
// cleanup would remove the first one's uploads in progress.
func lockDataDir(dir string) (*os.File, error) {
	f, err := datadir.Lock(dir, serveLock)
	if errors.Is(err, datadir.ErrInUse) {
		return nil, usagef("data dir %s is in use by another vmshelf serve", dir)
	}
	return f, err
}
