package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// rawClient reaches the test server directly, to look at the keys.
func rawClient(t *testing.T, cfg s3.Config) *minio.Client {
	t.Helper()
	c, err := s3test.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPartBoundaries: blobs of every size around the part size come back
// whole, through a fresh Store, with ranged reads across the boundaries.
func TestPartBoundaries(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	st := open(t, cfg)
	ctx := context.Background()
	for _, size := range []int{0, 1, partSize - 1, partSize, partSize + 1, 3*partSize + 12345} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			id := imagestore.NewUploadID()
			data := blobtest.Pattern(byte(size), size)
			w, err := st.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			// Odd write sizes, so that no write lines up with a part.
			for rest := data; len(rest) > 0; {
				n := min(len(rest), 777777)
				if _, err := w.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			if err := w.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			fresh := open(t, cfg)
			b, err := fresh.Open(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if b.Size() != int64(size) {
				t.Fatalf("Size = %d, want %d", b.Size(), size)
			}
			if got := blobtest.Committed(t, fresh, id); sha256.Sum256(got) != sha256.Sum256(data) {
				t.Fatalf("read back %d bytes that differ", len(got))
			}
			for _, off := range []int64{partSize - 3, partSize, 2*partSize - 1, int64(size) - 2} {
				if off < 0 || off+2 > int64(size) {
					continue
				}
				p := make([]byte, 2)
				if n, err := b.ReadAt(p, off); err != nil || n != 2 || !bytes.Equal(p, data[off:off+2]) {
					t.Errorf("ReadAt(%d) = %d, %v", off, n, err)
				}
				r, err := b.Section(off, 2)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, data[off:off+2]) {
					t.Errorf("Section(%d, 2) = %v, %v", off, got, err)
				}
			}
		})
	}
}

// TestResumeOnAnotherReplica: an upload synced at various offsets (mid-part
// and on boundaries) and then dropped (no Close: the process died) resumes
// on a fresh Store, and loses nothing below the synced offset.
func TestResumeOnAnotherReplica(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	// One part buffer: a Write that fills a part waits for the one before
	// it, so no part of the killed writer is still in flight when the
	// other replica resumes (a killed process's requests die with it; a
	// dropped writer's goroutines would not, and could land late).
	cfg.SpareParts = -1
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		syncs []int64 // offsets at which the first writer syncs
		at    int64   // where the second resumes
	}{
		{"mid first part", []int64{1000}, 1000},
		{"on a boundary", []int64{partSize}, partSize},
		{"mid third part", []int64{2*partSize + 17}, 2*partSize + 17},
		{"an earlier sync mid-part", []int64{partSize + 5, 3*partSize + 9}, partSize + 5},
		{"one short of a part", []int64{partSize - 1}, partSize - 1},
		{"at zero, nothing synced", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := open(t, cfg)
			id := imagestore.NewUploadID()
			total := 4 * partSize
			data := blobtest.Pattern(3, total)
			w, err := first.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			at := int64(0)
			for _, s := range tc.syncs {
				if _, err := w.Write(data[at:s]); err != nil {
					t.Fatal(err)
				}
				if err := w.Sync(); err != nil {
					t.Fatal(err)
				}
				at = s
			}
			// More bytes past the last sync, a whole part of them sent:
			// lost to the crash, and cut by Resume.
			if _, err := w.Write(blobtest.Pattern(99, partSize+3)); err != nil {
				t.Fatal(err)
			}
			w = nil // killed: never closed

			resumeCommit(t, open(t, cfg), id, tc.at, data[tc.at:]) // on a fresh Store
			if got := blobtest.Committed(t, open(t, cfg), id); sha256.Sum256(got) != sha256.Sum256(data) {
				t.Fatalf("resumed blob of %d bytes differs from the %d sent", len(got), len(data))
			}
			// Committed: no upload, tail or offset is left behind.
			left := listAll(t, cfg, cfg.Prefix+"/partial/")
			if len(left) != 0 {
				t.Errorf("partial objects after Commit: %v", left)
			}
		})
	}
}

func listAll(t *testing.T, cfg s3.Config, prefix string) []string {
	t.Helper()
	var keys []string
	for o := range rawClient(t, cfg).ListObjects(context.Background(), cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys
}

// TestResumeNeverKeepsAPartPastOffset: the part that holds the offset was
// sent whole (bytes past the offset in it); Resume must send it again
// from the tail, never complete with the old one.
func TestResumeNeverKeepsAPartPastOffset(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	// One part buffer: filling part 2 waits until part 1 is in S3, so
	// the Close below does not cancel it (see TestResumeOnAnotherReplica).
	cfg.SpareParts = -1
	ctx := context.Background()
	st := open(t, cfg)
	id := imagestore.NewUploadID()
	good := blobtest.Pattern(1, partSize/2)
	w, err := st.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(good); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	// The rest of part 1 and part 2, never recorded: different bytes.
	if _, err := w.Write(blobtest.Pattern(2, partSize+partSize/2)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rest := blobtest.Pattern(3, 100)
	resumeCommit(t, open(t, cfg), id, int64(len(good)), rest)
	want := slices.Concat(good, rest)
	if got := blobtest.Committed(t, st, id); !bytes.Equal(got, want) {
		t.Fatalf("committed %d bytes, want the %d below the offset and after it", len(got), len(want))
	}
}

// TestStagedResume: a writer that read its blob back (staged, completed
// into its key) and died before Commit resumes at the end as it is, and
// below the end by server-side copy.
func TestStagedResume(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	ctx := context.Background()
	data := blobtest.Pattern(5, 2*partSize+100)
	for _, at := range []int64{int64(len(data)), partSize + 50, partSize, 10} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			st := open(t, cfg)
			id := imagestore.NewUploadID()
			w, err := st.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			// A read past the head stages the blob (a read of the head
			// would not).
			if _, err := w.ReadAt(make([]byte, 10), int64(len(data))-10); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
				t.Fatalf("staged blob visible: %v", err)
			}
			resumeCommit(t, open(t, cfg), id, at, data[at:]) // a staged blob
			if got := blobtest.Committed(t, st, id); !bytes.Equal(got, data) {
				t.Fatalf("committed %d bytes that differ", len(got))
			}
		})
	}
}

// TestModTimeStable: every replica sees the same ModTime and Size.
func TestModTimeStable(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	ctx := context.Background()
	id := imagestore.NewUploadID()
	blobtest.Put(t, open(t, cfg), id, []byte("same everywhere"))
	var first time.Time
	for i := range 3 {
		b, err := open(t, cfg).Open(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = b.ModTime()
		} else if !b.ModTime().Equal(first) {
			t.Errorf("ModTime on replica %d = %v, on the first %v", i, b.ModTime(), first)
		}
		b.Close()
	}
	if first.IsZero() {
		t.Error("zero ModTime")
	}
}

// TestGrace: a start-up on one replica leaves another replica's upload in
// flight alone, and takes it once it has been idle for the grace.
func TestGrace(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	cfg.PartialGrace = time.Hour
	ctx := context.Background()
	writerReplica := open(t, cfg)
	id := imagestore.NewUploadID()
	w, err := writerReplica.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if _, err := w.Write(blobtest.Pattern(1, partSize+10)); err != nil {
		t.Fatal(err)
	}
	staged := imagestore.NewUploadID()
	ws, err := writerReplica.Create(ctx, staged)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Abort()
	if _, err := ws.Write([]byte("checking")); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.ReadAt(make([]byte, 8), 0); err != nil {
		t.Fatal(err)
	}

	if n, err := open(t, cfg).RemovePartials(ctx, nil); err != nil || n != 0 {
		t.Fatalf("RemovePartials on another replica = %d, %v; want the live uploads left", n, err)
	}
	if _, err := w.Write(blobtest.Pattern(2, 10)); err != nil {
		t.Fatalf("the writer after another replica's start-up: %v", err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := ws.Commit(ctx); err != nil {
		t.Fatalf("the staged blob after another replica's start-up: %v", err)
	}

	// Two hours later nobody wrote: the upload is abandoned.
	later := cfg
	later.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if n, err := open(t, later).RemovePartials(ctx, nil); err != nil || n != 1 {
		t.Fatalf("RemovePartials after the grace = %d, %v; want 1", n, err)
	}
	if _, err := open(t, cfg).Resume(ctx, id, partSize+20); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Resume of the removed upload: %v, want ErrNotFound", err)
	}
	if got := blobtest.Committed(t, open(t, cfg), staged); string(got) != "checking" {
		t.Fatalf("committed blob after the sweep: %q", got)
	}
}

// TestCredentialsNeverInErrors: a wrong secret, a wrong key id and a
// server that is down all give errors that name neither.
func TestCredentialsNeverInErrors(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	ctx := context.Background()
	check := func(what string, err error, c s3.Config) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, s := range []string{string(c.AccessKeyID), string(c.SecretAccessKey), string(c.SessionToken)} {
			if s != "" && strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q names a credential", what, err)
			}
		}
		if f := fmt.Sprintf("%v %+v %#v", c, c, c); strings.Contains(f, string(c.SecretAccessKey)) {
			t.Errorf("a printed Config shows the secret: %s", f)
		}
	}
	bad := cfg
	bad.SecretAccessKey = "wrong-secret-" + s3.Secret(strings.Repeat("x", 20))
	_, err := s3.Open(ctx, bad)
	check("wrong secret", err, bad)
	bad = cfg
	bad.AccessKeyID = "AKWRONGWRONGWRONG"
	bad.SessionToken = "session-token-value"
	_, err = s3.Open(ctx, bad)
	check("wrong key id", err, bad)

	st := open(t, cfg)
	srv.Stop()
	_, err = st.Create(ctx, imagestore.NewUploadID())
	check("server down", err, cfg)
}

// TestServerDown: with the server gone (connections refused) every answer
// is an error, never ErrNotFound (could not ask is not absent), and an
// imagestore.ErrBlobsUnavailable: the storage's outage, not our fault.
func TestServerDown(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	cfg.MaxRetries = 1
	ctx := context.Background()
	st := open(t, cfg)
	id := imagestore.NewUploadID()
	blobtest.Put(t, st, id, []byte("kept"))
	partial := imagestore.NewUploadID()
	blobtest.Partial(t, st, partial, []byte("half"))
	w, err := st.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	// Nothing listens on the port now: connection refused.
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(cfg.Endpoint, "http://"), time.Second); err == nil {
		c.Close()
		t.Fatal("the server still answers")
	}
	// Not absent, and the storage's outage (the planes answer 503
	// blobStoreUnreachable), never an error of ours.
	notAbsent := func(what string, err error) {
		t.Helper()
		if err == nil || errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("%s with the server down: %v; want an error, not ErrNotFound", what, err)
		} else if !errors.Is(err, imagestore.ErrBlobsUnavailable) {
			t.Errorf("%s with the server down: %v; want an ErrBlobsUnavailable", what, err)
		}
	}
	_, err = st.Open(ctx, id)
	notAbsent("Open", err)
	_, err = st.Open(ctx, imagestore.NewUploadID())
	notAbsent("Open of a missing blob", err)
	_, err = st.Resume(ctx, partial, 4)
	notAbsent("Resume", err)
	_, err = st.Resume(ctx, imagestore.NewUploadID(), 0)
	notAbsent("Resume of a missing partial", err)
	notAbsent("Quarantine", st.Quarantine(ctx, id))
	notAbsent("RemoveQuarantined", st.RemoveQuarantined(ctx, id))
	_, err = st.List(ctx)
	notAbsent("List", err)
	_, err = st.Available(ctx)
	notAbsent("Available", err)
	_, err = st.RemovePartials(ctx, nil)
	notAbsent("RemovePartials", err)
	notAbsent("Delete", st.Delete(ctx, id))
	_, err = w.Write(make([]byte, partSize))
	notAbsent("Write of a part", err)
	notAbsent("Commit", w.Commit(ctx))
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in, bucket, prefix string
		ok                 bool
	}{
		{"s3://b/p", "b", "p", true},
		{"s3://b", "b", "", true},
		{"s3://b/", "b", "", true},
		{"s3://b/a/b/", "b", "a/b", true},
		{"s3://b/a//b", "", "", false},
		{"http://b/p", "", "", false},
		{"s3:///p", "", "", false},
		{"s3://key:secret@b/p", "", "", false},
		{"s3://b/p?x=1", "", "", false},
	} {
		b, p, err := s3.ParseURL(tc.in)
		if (err == nil) != tc.ok || b != tc.bucket || p != tc.prefix {
			t.Errorf("ParseURL(%q) = %q, %q, %v", tc.in, b, p, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") && strings.Contains(tc.in, "secret") {
			t.Errorf("ParseURL(%q) error names the credential: %v", tc.in, err)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"AWS_ENDPOINT_URL":      "http://127.0.0.1:9000",
		"AWS_ENDPOINT_URL_S3":   "http://127.0.0.1:9001",
		"AWS_DEFAULT_REGION":    "eu-central-1",
		"AWS_ACCESS_KEY_ID":     "AKID",
		"AWS_SECRET_ACCESS_KEY": "SECRETVALUE",
		"AWS_SESSION_TOKEN":     "TOKENVALUE",
	}
	c, err := s3.ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "http://127.0.0.1:9001" || c.Region != "eu-central-1" || c.AccessKeyID != "AKID" ||
		c.SecretAccessKey != "SECRETVALUE" || c.SessionToken != "TOKENVALUE" {
		t.Errorf("ConfigFromEnv = %#v", c)
	}
	env["AWS_REGION"] = "us-west-2"
	delete(env, "AWS_ENDPOINT_URL_S3")
	if c, err = s3.ConfigFromEnv(func(k string) string { return env[k] }); err != nil || c.Region != "us-west-2" || c.Endpoint != "http://127.0.0.1:9000" {
		t.Errorf("ConfigFromEnv = %+v, %v", c, err)
	}
	delete(env, "AWS_SECRET_ACCESS_KEY")
	if _, err := s3.ConfigFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Error("ConfigFromEnv without a secret key succeeded")
	}
	env["AWS_SECRET_ACCESS_KEY"] = "SECRETVALUE"
	env["AWS_ENDPOINT_URL"] = "http://user:SECRETVALUE@127.0.0.1:9000"
	if _, err := s3.ConfigFromEnv(func(k string) string { return env[k] }); err == nil || strings.Contains(err.Error(), "SECRETVALUE") {
		t.Errorf("ConfigFromEnv with credentials in the endpoint: %v", err)
	}
}

// TestCommitNeverReplaces: bytes that appeared under the id's key while a
// writer was writing (another replica's, by some bug) are never replaced:
// the completion is conditional.
func TestCommitNeverReplaces(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	ctx := context.Background()
	st := open(t, cfg)
	for _, size := range []int{0, 10, partSize + 1} {
		id := imagestore.NewUploadID()
		w, err := st.Create(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(blobtest.Pattern(1, size)); err != nil {
			t.Fatal(err)
		}
		key := cfg.Prefix + "/images/" + id + ".qcow2"
		if _, err := rawClient(t, cfg).PutObject(ctx, cfg.Bucket, key, strings.NewReader("other"), 5, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(ctx); !errors.Is(err, imagestore.ErrExists) {
			t.Errorf("Commit of %d bytes over existing bytes: %v, want ErrExists", size, err)
		}
		if err := w.Abort(); err != nil {
			t.Fatal(err)
		}
		r, err := rawClient(t, cfg).GetObject(ctx, cfg.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		if err != nil {
			// Abort may remove unmarked bytes; they were never replaced.
			if minio.ToErrorResponse(err).Code != "NoSuchKey" {
				t.Fatal(err)
			}
		} else if string(got) != "other" {
			t.Errorf("the existing bytes were replaced by a %d-byte blob: %q", size, got[:min(len(got), 10)])
		}
	}
}
