package s3_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

const partSize = 5 << 20 // S3's minimum: boundaries cost little data

// breakable fails every write request (PUT, POST, DELETE) while broken.
type breakable struct {
	rt     http.RoundTripper
	broken atomic.Bool
}

func (b *breakable) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.broken.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New("broken on purpose")
	}
	return b.rt.RoundTrip(r)
}

// testConfig is a Config for a fresh prefix on srv.
func testConfig(srv *s3test.Server) s3.Config {
	cfg := srv.Config
	var b [6]byte
	_, _ = rand.Read(b[:])
	cfg.Prefix = "t" + hex.EncodeToString(b[:])
	cfg.PartSize = partSize
	cfg.MaxImageBytes = 1 << 30
	cfg.CapacityBytes = 1 << 30
	return cfg
}

func open(t *testing.T, cfg s3.Config) *s3.Store {
	t.Helper()
	s, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBlobtest runs the blob suite over plain http (parts signed) and
// over https (parts unsigned, with their CRC32C).
func TestBlobtest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testing.TB) *s3test.Server
	}{
		{"http", s3test.StartServer},
		{"https", s3test.StartServerTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.start(t)
			blobtest.Run(t, func(t *testing.T) blobtest.Target {
				cfg := testConfig(srv)
				// The suite's start-ups come long after its writes (as
				// blobfs's, which have no grace): the clock is two hours
				// ahead.
				cfg.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
				tr := http.DefaultTransport.(*http.Transport).Clone()
				tr.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
				br := &breakable{rt: tr}
				cfg.Transport = br
				return blobtest.Target{
					Blobs:    open(t, cfg),
					Reopen:   func(t *testing.T) imagestore.Blobs { return open(t, cfg) },
					Unit:     partSize,
					Capacity: cfg.CapacityBytes,
					Break:    br.broken.Store,
				}
			})
		})
	}
}
