package s3_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// fullDisk answers every write (PUT, POST) as versitygw does once its disk
// is full (s3err.ErrNoSpaceLeftOnDevice: 507 with code InsufficientStorage
// in its XML error), or, with minio set, as MinIO does (XMinioStorageFull);
// reads go to the real server.
type fullDisk struct {
	rt    http.RoundTripper
	full  atomic.Bool
	minio bool
}

func (f *fullDisk) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.full.Load() || r.Method == http.MethodGet || r.Method == http.MethodHead {
		return f.rt.RoundTrip(r)
	}
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	code, msg := "InsufficientStorage", "No space left on device."
	if f.minio {
		code, msg = "XMinioStorageFull", "Storage backend has reached its minimum free drive threshold. Please delete a few objects to proceed."
	}
	return s3Error(r, http.StatusInsufficientStorage, code, msg), nil
}

// s3Error is an S3 server's error answer to r: status, and the XML body
// with code and msg.
func s3Error(r *http.Request, status int, code, msg string) *http.Response {
	body := `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<Error><Code>` + code + `</Code><Message>` + msg + `</Message><Resource>` + r.URL.Path +
		`</Resource><RequestId></RequestId><HostId></HostId></Error>`
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/xml"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}
}

// TestFullServerIsNoSpace: a bucket whose server says its storage is full
// fails a part, the tail's sync and a commit with an error that wraps
// imagestore.ErrNoSpace, so the gateway answers 507 noSpace (as for a full
// local disk), not 500; and the server's own words stay in the error.
func TestFullServerIsNoSpace(t *testing.T) {
	srv := s3test.StartServer(t)
	for _, server := range []string{"versitygw", "minio"} {
		t.Run(server, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(srv)
			cfg.MaxRetries = 1
			fd := &fullDisk{rt: http.DefaultTransport.(*http.Transport).Clone(), minio: server == "minio"}
			cfg.Transport = fd
			st := open(t, cfg)
			want := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, imagestore.ErrNoSpace) {
					t.Errorf("%s on a full server: %v; want an error wrapping ErrNoSpace", what, err)
				} else if !strings.Contains(err.Error(), "No space left on device") && !strings.Contains(err.Error(), "minimum free drive") {
					t.Errorf("%s on a full server: %q; want the server's message in it", what, err)
				}
			}
			// A whole part goes out while the upload runs.
			w, err := st.Create(ctx, imagestore.NewUploadID())
			if err != nil {
				t.Fatal(err)
			}
			fd.full.Store(true)
			_, err = w.Write(blobtest.Pattern(1, partSize+1))
			if err == nil {
				err = w.Sync()
			}
			want("a part", err)
			w.Abort()

			// The tail (less than a part) goes out at a sync, the
			// marker at the commit.
			fd.full.Store(false)
			w, err = st.Create(ctx, imagestore.NewUploadID())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(blobtest.Pattern(2, 1000)); err != nil {
				t.Fatal(err)
			}
			fd.full.Store(true)
			want("the tail's sync", w.Sync())
			want("a commit", w.Commit(ctx))
			w.Abort()
		})
	}
}
