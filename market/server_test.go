package market

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// New refuses a config that would hand out broken URLs or tickets that are
// dead on arrival, rather than failing at the first request.
func TestNewRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	blobs, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	good := Config{PublicURL: publicURL, TicketTTL: time.Hour, ImagesPerTenant: 3}
	cases := []struct {
		name string
		mod  func(*Config)
		want string // in the error: the check that refused, not another
	}{
		{"no public URL", func(c *Config) { c.PublicURL = "" }, "public URL"},
		{"relative public URL", func(c *Config) { c.PublicURL = "/upload" }, "public URL"},
		{"ftp public URL", func(c *Config) { c.PublicURL = "ftp://host" }, "public URL"},
		{"public URL with query", func(c *Config) { c.PublicURL = "http://host?x=1" }, "public URL"},
		{"public URL with user", func(c *Config) { c.PublicURL = "http://u:p@host" }, "public URL"},
		{"zero TTL", func(c *Config) { c.TicketTTL = 0 }, "ticket TTL"},
		{"negative TTL", func(c *Config) { c.TicketTTL = -time.Second }, "ticket TTL"},
		{"zero quota", func(c *Config) { c.ImagesPerTenant = 0 }, "images per tenant"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.mod(&cfg)
			reg := prometheus.NewRegistry()
			_, err := New(cfg, st, blobs, reg, reg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want the error about %q", err, c.want)
			}
		})
	}

	// Missing dependencies: each on a fresh registry, so that nothing but
	// the nil check can make New fail, and the error must be that check's.
	const required = "store, blobs, registerer and gatherer are all required"
	for _, c := range []struct {
		name string
		new  func(reg *prometheus.Registry) error
	}{
		{"nil store", func(reg *prometheus.Registry) error { _, err := New(good, nil, blobs, reg, reg); return err }},
		{"nil blobs", func(reg *prometheus.Registry) error { _, err := New(good, st, nil, reg, reg); return err }},
		{"nil registerer", func(reg *prometheus.Registry) error { _, err := New(good, st, blobs, nil, reg); return err }},
		{"nil gatherer", func(reg *prometheus.Registry) error { _, err := New(good, st, blobs, reg, nil); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := c.new(reg); err == nil || !strings.Contains(err.Error(), required) {
				t.Errorf("New = %v, want %q", err, required)
			}
			// Refused before registering anything: the registry is
			// still free for a server that has what it needs.
			if _, err := New(good, st, blobs, reg, reg); err != nil {
				t.Errorf("New on the registry of the refused call: %v", err)
			}
		})
	}

	// The good config works once per registry; a second server on the same
	// registry would clash on metric names, and says so.
	reg := prometheus.NewRegistry()
	if _, err := New(good, st, blobs, reg, reg); err != nil {
		t.Fatalf("New(good): %v", err)
	}
	var dup prometheus.AlreadyRegisteredError
	if _, err := New(good, st, blobs, reg, reg); !errors.As(err, &dup) {
		t.Errorf("a second New on the same registry = %v, want prometheus.AlreadyRegisteredError", err)
	}
}
