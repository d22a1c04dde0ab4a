package postgres_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/postgres"
	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/storetest"
)

// cluster is the test binary's one PostgreSQL server; each test takes a
// database of its own in it.
var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	c, skip, err := pgtest.StartMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if skip != "" {
		fmt.Println(skip)
		os.Exit(0)
	}
	cluster = c
	code := m.Run()
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func open(t *testing.T, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) imagestore.Store {
		return open(t, cluster.NewDatabase(t))
	})
}
