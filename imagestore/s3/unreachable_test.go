package s3_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// failing answers every request with status and an S3 error of code
// while on is set, as a server that fails on its side does; otherwise
// the real server answers.
type failing struct {
	rt     http.RoundTripper
	on     atomic.Bool
	status int
	code   string
}

func (f *failing) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.on.Load() {
		return f.rt.RoundTrip(r)
	}
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return s3Error(r, f.status, f.code, "failing on purpose"), nil
}

// TestServerFailureIsUnavailable: a server that answers with a failure of
// its own (5xx, 503 SlowDown) is the storage's passing outage
// (imagestore.ErrBlobsUnavailable: the planes answer 503
// blobStoreUnreachable), for a HEAD, a listing and a write alike; a
// refusal of the request itself (403, 501) is not, and a 404 is still
// absence.
func TestServerFailureIsUnavailable(t *testing.T) {
	srv := s3test.StartServer(t)
	for _, tc := range []struct {
		status      int
		code        string
		unavailable bool
	}{
		{http.StatusServiceUnavailable, "SlowDown", true},
		{http.StatusServiceUnavailable, "ServiceUnavailable", true},
		{http.StatusInternalServerError, "InternalError", true},
		{http.StatusBadGateway, "BadGateway", true},
		{http.StatusGatewayTimeout, "GatewayTimeout", true},
		{http.StatusForbidden, "AccessDenied", false},
		{http.StatusNotImplemented, "NotImplemented", false},
	} {
		t.Run(tc.code, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(srv)
			cfg.MaxRetries = 1
			f := &failing{rt: http.DefaultTransport.(*http.Transport).Clone(), status: tc.status, code: tc.code}
			cfg.Transport = f
			st := open(t, cfg)
			id := imagestore.NewUploadID()
			f.on.Store(true)
			_, openErr := st.Open(ctx, id)
			_, listErr := st.List(ctx)
			_, createErr := st.Create(ctx, id)
			for what, err := range map[string]error{"Open": openErr, "List": listErr, "Create": createErr, "Ping": st.Ping(ctx)} {
				if err == nil || errors.Is(err, imagestore.ErrNotFound) {
					t.Errorf("%s while the server answers %d %s: %v; want an error, not absence", what, tc.status, tc.code, err)
					continue
				}
				if got := errors.Is(err, imagestore.ErrBlobsUnavailable); got != tc.unavailable {
					t.Errorf("%s while the server answers %d %s: %v; unavailable %v, want %v", what, tc.status, tc.code, err, got, tc.unavailable)
				}
			}
		})
	}
}

// TestResetIsUnavailable: a server that takes the connection and resets
// it (or closes it before any answer) is unreachable, as one that
// refuses (TestServerDown) or hangs (TestServerHangs) is.
func TestResetIsUnavailable(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	cfg.MaxRetries = 1
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST
			}
			c.Close()
		}
	}()
	var reset atomic.Bool
	real := http.DefaultTransport.(*http.Transport).Clone()
	resetting := http.DefaultTransport.(*http.Transport).Clone()
	resetting.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, l.Addr().String())
	}
	cfg.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if reset.Load() {
			return resetting.RoundTrip(r)
		}
		return real.RoundTrip(r)
	})
	st := open(t, cfg)
	reset.Store(true)
	_, err = st.Open(context.Background(), imagestore.NewUploadID())
	if !errors.Is(err, imagestore.ErrBlobsUnavailable) {
		t.Errorf("Open on a server that resets the connection: %v; want an ErrBlobsUnavailable", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPingProvesWrite: readiness is a write, not a HEAD. A server that
// answers reads but refuses writes (versitygw --readonly: one coming back
// whose storage does not take writes yet) fails Ping although the bucket
// answers its HEAD; once it takes writes again Ping passes, and the probe
// leaves no object behind. A server that refuses connections fails Ping
// as unavailable.
func TestPingProvesWrite(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	cfg.PingTTL = time.Nanosecond // every Ping asks
	ctx := context.Background()
	st := open(t, cfg)
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("Ping of a server that takes writes: %v", err)
	}
	c, err := s3test.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for o := range c.ListObjects(ctx, cfg.Bucket, minio.ListObjectsOptions{Prefix: cfg.Prefix + "/", Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		left = append(left, o.Key)
	}
	if len(left) != 0 {
		t.Errorf("Ping left objects behind: %q", left)
	}

	srv.Restart(t, "--readonly")
	if ok, err := c.BucketExists(ctx, cfg.Bucket); !ok || err != nil {
		t.Fatalf("the read-only server does not answer the bucket's HEAD: %v, %v", ok, err)
	}
	if err := st.Ping(ctx); err == nil {
		t.Error("Ping of a server that refuses writes passed; want the write's failure")
	}

	srv.Restart(t)
	if err := st.Ping(ctx); err != nil {
		t.Errorf("Ping once the server takes writes again: %v", err)
	}

	srv.Stop()
	if err := st.Ping(ctx); !errors.Is(err, imagestore.ErrBlobsUnavailable) {
		t.Errorf("Ping of a server that refuses connections: %v; want an ErrBlobsUnavailable", err)
	}
}
