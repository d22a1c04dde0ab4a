package market

import (
	"path/filepath"
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
	}{
		{"no public URL", func(c *Config) { c.PublicURL = "" }},
		{"relative public URL", func(c *Config) { c.PublicURL = "/upload" }},
		{"ftp public URL", func(c *Config) { c.PublicURL = "ftp://host" }},
		{"public URL with query", func(c *Config) { c.PublicURL = "http://host?x=1" }},
		{"zero TTL", func(c *Config) { c.TicketTTL = 0 }},
		{"zero quota", func(c *Config) { c.ImagesPerTenant = 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.mod(&cfg)
			reg := prometheus.NewRegistry()
			if _, err := New(cfg, st, blobs, reg, reg); err == nil {
				t.Error("New accepted the config")
			}
		})
	}

	// The good config works once per registry; a second server on the same
	// registry would clash on metric names, and says so.
	reg := prometheus.NewRegistry()
	if _, err := New(good, st, blobs, reg, reg); err != nil {
		t.Fatalf("New(good): %v", err)
	}
	if _, err := New(good, st, blobs, reg, reg); err == nil {
		t.Error("a second New on the same registry succeeded")
	}
	if _, err := New(good, nil, blobs, reg, reg); err == nil {
		t.Error("New accepted a nil store")
	}
}
