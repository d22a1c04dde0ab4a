package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// sentPart is what went out on the wire for one part PUT.
type sentPart struct {
	num                  int
	scheme               string
	contentSHA256, crc32 string
	signedHeaders        string
	sum                  [32]byte // SHA-256 of the body as it left
	crc                  uint32   // CRC32C of the body as it left
}

// wire stands between a Store and the server and records every part PUT
// (headers and a digest of the body as sent); alter, if set, may change
// a part's body after the Store computed its checksums, as a bit flipped
// on the way would.
type wire struct {
	rt    http.RoundTripper
	alter func(num int, body []byte)

	mu    sync.Mutex
	parts []sentPart
}

// newWire is a wire over a transport that trusts cfg.RootCAs (the test
// server's own certificate): verification stays on.
func newWire(cfg s3.Config) *wire {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
	return &wire{rt: tr}
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	num, err := strconv.Atoi(q.Get("partNumber"))
	if r.Method != http.MethodPut || !q.Has("uploadId") || err != nil || r.Body == nil {
		return w.rt.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	if w.alter != nil {
		w.alter(num, body)
	}
	_, signed, _ := strings.Cut(r.Header.Get("Authorization"), "SignedHeaders=")
	signed, _, _ = strings.Cut(signed, ",")
	w.mu.Lock()
	w.parts = append(w.parts, sentPart{
		num: num, scheme: r.URL.Scheme,
		contentSHA256: r.Header.Get("X-Amz-Content-Sha256"),
		crc32:         r.Header.Get("X-Amz-Checksum-Crc32c"),
		signedHeaders: signed,
		sum:           sha256.Sum256(body),
		crc:           crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)),
	})
	w.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return w.rt.RoundTrip(r)
}

func (w *wire) sent() []sentPart {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]sentPart(nil), w.parts...)
}

// crc32cHeader is what x-amz-checksum-crc32c must say for a body whose
// CRC32C is c: the 4 bytes big-endian, base64.
func crc32cHeader(c uint32) string {
	return base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, c))
}

// TestPayloadSigning: what each part carries on the wire, for each
// endpoint scheme and setting, and that the blob reads back whole.
// Unsigned: x-amz-content-sha256 UNSIGNED-PAYLOAD and the part's CRC32C
// in a signed x-amz-checksum-crc32c; signed: the part's SHA-256 and no
// CRC. Auto is unsigned over https only: over plain http a man in the
// middle could alter an unsigned part and fix its CRC.
func TestPayloadSigning(t *testing.T) {
	srvs := map[bool]*s3test.Server{false: s3test.StartServer(t), true: s3test.StartServerTLS(t)}
	for _, tc := range []struct {
		name     string
		https    bool
		signing  s3.PayloadSigning
		unsigned bool
	}{
		{"auto over https", true, s3.PayloadAuto, true},
		{"auto over http", false, s3.PayloadAuto, false},
		{"signed over https", true, s3.PayloadSigned, false},
		{"unsigned over http", false, s3.PayloadUnsigned, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(srvs[tc.https])
			cfg.PayloadSigning = tc.signing
			wr := newWire(cfg)
			cfg.Transport = wr
			st := open(t, cfg)
			id := imagestore.NewUploadID()
			data := blobtest.Pattern(3, 2*partSize+4321)
			commitAll(t, st, id, data)
			sent := wr.sent()
			if len(sent) != 3 {
				t.Fatalf("%d part PUTs went out, want 3", len(sent))
			}
			scheme := map[bool]string{false: "http", true: "https"}[tc.https]
			for _, p := range sent {
				if p.scheme != scheme {
					t.Errorf("part %d went over %s, want %s", p.num, p.scheme, scheme)
				}
				if tc.unsigned {
					if p.contentSHA256 != "UNSIGNED-PAYLOAD" {
						t.Errorf("part %d: x-amz-content-sha256 %q, want UNSIGNED-PAYLOAD", p.num, p.contentSHA256)
					}
					if want := crc32cHeader(p.crc); p.crc32 != want {
						t.Errorf("part %d: x-amz-checksum-crc32c %q, want %q", p.num, p.crc32, want)
					}
					if !strings.Contains(";"+p.signedHeaders+";", ";x-amz-checksum-crc32c;") {
						t.Errorf("part %d: x-amz-checksum-crc32c is not signed (SignedHeaders=%s)", p.num, p.signedHeaders)
					}
				} else {
					if want := hex.EncodeToString(p.sum[:]); p.contentSHA256 != want {
						t.Errorf("part %d: x-amz-content-sha256 %q, want the body's SHA-256 %s", p.num, p.contentSHA256, want)
					}
					if p.crc32 != "" {
						t.Errorf("part %d: x-amz-checksum-crc32c %q sent with a signed payload", p.num, p.crc32)
					}
				}
			}
			if got := blobtest.Committed(t, open(t, cfg), id); !bytes.Equal(got, data) {
				t.Fatalf("committed %d bytes that differ from the %d written", len(got), len(data))
			}
		})
	}
}

// TestAlteredPartRefused: a part whose bytes change after its checksum
// (CRC32C, or SHA-256 when signed) was computed is refused by the server;
// the write fails saying which part and why, nothing is committed, and
// Abort leaves no upload behind.
func TestAlteredPartRefused(t *testing.T) {
	srvs := map[bool]*s3test.Server{false: s3test.StartServer(t), true: s3test.StartServerTLS(t)}
	for _, tc := range []struct {
		name     string
		https    bool
		wantCode string // the server's S3 error code
	}{
		{"unsigned over https", true, "BadDigest"},
		{"signed over http", false, "XAmzContentSHA256Mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := srvs[tc.https]
			cfg := testConfig(srv)
			cfg.MaxRetries = 1 // the altered part is final, not retried whole
			wr := newWire(cfg)
			wr.alter = func(num int, body []byte) {
				if num == 2 {
					body[12345] ^= 0x20
				}
			}
			cfg.Transport = wr
			st := open(t, cfg)
			ctx := context.Background()
			id := imagestore.NewUploadID()
			w, err := st.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			err = writeAll(w, blobtest.Pattern(9, 3*partSize+99))
			if err == nil {
				err = w.Commit(ctx)
			}
			if err == nil {
				t.Fatal("the upload with an altered part 2 was committed")
			}
			t.Logf("refused: %v", err)
			if !strings.Contains(err.Error(), "upload part 2") {
				t.Errorf("error %q does not name part 2", err)
			}
			var resp minio.ErrorResponse
			if !errors.As(err, &resp) || resp.StatusCode != http.StatusBadRequest || resp.Code != tc.wantCode {
				t.Errorf("error %q (%d %s) is not the server's 400 %s", err, resp.StatusCode, resp.Code, tc.wantCode)
			}
			if err := w.Abort(); err != nil {
				t.Fatalf("Abort: %v", err)
			}
			if _, err := st.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
				t.Errorf("Open after the failed upload: %v, want ErrNotFound", err)
			}
			raw := rawClient(t, cfg)
			for o := range raw.ListObjects(ctx, cfg.Bucket, minio.ListObjectsOptions{Prefix: cfg.Prefix + "/", Recursive: true}) {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				if !strings.HasSuffix(o.Key, "/store-id") {
					t.Errorf("object %s left behind", o.Key)
				}
			}
			core := minio.Core{Client: raw}
			ups, err := core.ListMultipartUploads(ctx, cfg.Bucket, cfg.Prefix+"/", "", "", "", 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(ups.Uploads) != 0 {
				t.Errorf("%d multipart uploads left behind", len(ups.Uploads))
			}
		})
	}
}

// TestResumeAcrossSettings: an upload keeps the protection it was created
// with when a replica with the other setting resumes it: S3 wants every
// part of an upload created with CRC32C to carry one (and the completion
// to list them all), and refuses one on an upload created without. So a
// signed replica resuming an unsigned upload signs and sends the CRC
// too, and an unsigned replica resuming a signed upload signs.
func TestResumeAcrossSettings(t *testing.T) {
	srv := s3test.StartServerTLS(t)
	for _, tc := range []struct {
		name          string
		first, second s3.PayloadSigning
		wantCRC       bool // the second replica's parts carry a CRC32C
		wantUnsigned  bool // and go with UNSIGNED-PAYLOAD
	}{
		{"unsigned then signed", s3.PayloadUnsigned, s3.PayloadSigned, true, false},
		{"signed then unsigned", s3.PayloadSigned, s3.PayloadUnsigned, false, false},
		{"unsigned then unsigned", s3.PayloadUnsigned, s3.PayloadUnsigned, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(srv)
			// One part buffer: part 1 is in S3 when the Sync returns.
			cfg.SpareParts = -1
			cfg.PayloadSigning = tc.first
			ctx := context.Background()
			id := imagestore.NewUploadID()
			data := blobtest.Pattern(5, 3*partSize+777)
			at := int64(partSize + 1000)
			w, err := open(t, cfg).Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := writeAll(w, data[:at]); err != nil {
				t.Fatal(err)
			}
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}

			cfg2 := cfg
			cfg2.PayloadSigning = tc.second
			wr := newWire(cfg2)
			cfg2.Transport = wr
			resumeCommit(t, open(t, cfg2), id, at, data[at:])
			sent := wr.sent()
			if len(sent) != 3 { // parts 2, 3 and 4
				t.Fatalf("%d part PUTs after the resume, want 3", len(sent))
			}
			for _, p := range sent {
				if got := p.crc32 != ""; got != tc.wantCRC {
					t.Errorf("part %d: CRC32C sent %v, want %v", p.num, got, tc.wantCRC)
				}
				if got := p.contentSHA256 == "UNSIGNED-PAYLOAD"; got != tc.wantUnsigned {
					t.Errorf("part %d: x-amz-content-sha256 %q, unsigned want %v", p.num, p.contentSHA256, tc.wantUnsigned)
				}
			}
			if got := blobtest.Committed(t, open(t, cfg), id); !bytes.Equal(got, data) {
				t.Fatalf("committed %d bytes that differ from the %d written", len(got), len(data))
			}
		})
	}
}
