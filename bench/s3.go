package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/vmshelf/vmshelf/internal/testkit/gobin"
	"github.com/vmshelf/vmshelf/internal/testkit/selfsigned"
)

// The S3 phase: vmshelf over an S3 bucket (--blobs s3://…, what a
// scaled-out edge runs) against the S3 server's own PUT and GET of the
// same bytes from a Go client (minio-go), in one run on the same disk.
// The server is versitygw with its posix backend, over https with a
// self-signed certificate made in the work directory (S3 in production
// is https, and how a client protects its bytes depends on it: minio-go
// and vmshelf send unsigned payloads over https, signed ones over http);
// -s3-http runs it over plain http.
const (
	s3Vmshelf    = "vmshelf PUT → S3"
	s3Direct     = "S3 PUT (minio-go PutObject)"
	s3VmshelfGet = "vmshelf GET ← S3"
	s3DirectGet  = "S3 GET (minio-go GetObject)"
	s3Bucket     = "vmshelf-bench"
)

// s3Server is the versitygw the phase runs.
type s3Server struct {
	*proc
	endpoint, access, secret string
	client                   *minio.Client
	// certFile is the server's self-signed certificate, which vmshelf
	// trusts through SSL_CERT_FILE; "" over http.
	certFile string
}

// findVersitygw finds it as the tests do.
func findVersitygw() string {
	if p, _, err := gobin.Find("versitygw"); err == nil {
		return p
	}
	return "versitygw"
}

func startS3(dir string, plain bool) (*s3Server, error) {
	root := filepath.Join(dir, "s3-root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	key := make([]byte, 20)
	_, _ = rand.Read(key)
	s := &s3Server{endpoint: "http://" + addr, access: "AKBENCH" + hex.EncodeToString(key[:4]), secret: hex.EncodeToString(key)}
	args := []string{"--port", addr, "--quiet"}
	tr, err := minio.DefaultTransport(!plain)
	if err != nil {
		return nil, err
	}
	if !plain {
		tlsDir := filepath.Join(dir, "s3-tls")
		if err := os.MkdirAll(tlsDir, 0o700); err != nil {
			return nil, err
		}
		cert, err := selfsigned.Write(tlsDir)
		if err != nil {
			return nil, err
		}
		args = append(args, "--cert", cert.CertFile, "--key", cert.KeyFile)
		s.endpoint, s.certFile = "https://"+addr, cert.CertFile
		tr.TLSClientConfig.RootCAs = cert.Pool
	}
	// The keys go in the environment, never on a command line.
	s.proc, err = startProcEnv([]string{"ROOT_ACCESS_KEY_ID=" + s.access, "ROOT_SECRET_ACCESS_KEY=" + s.secret},
		"versitygw", filepath.Join(dir, "versitygw.log"), false, append(append([]string{findVersitygw()}, args...), "posix", root)...)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("versitygw did not listen on %s: %s", addr, s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.client, err = minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(s.access, s.secret, ""),
		Region: "us-east-1", BucketLookup: minio.BucketLookupPath, Secure: !plain, Transport: tr})
	if err != nil {
		s.stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.client.MakeBucket(ctx, s3Bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		s.stop()
		return nil, fmt.Errorf("make bucket: %w", err)
	}
	return s, nil
}

func (b *bench) phaseS3() error {
	srv, err := startS3(b.dir, b.opt.s3HTTP)
	if err != nil {
		return fmt.Errorf("versitygw (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0): %w", err)
	}
	defer srv.stop()
	env := []string{"AWS_ENDPOINT_URL=" + srv.endpoint, "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + srv.access, "AWS_SECRET_ACCESS_KEY=" + srv.secret}
	transport := "plain http: both clients sign each part's SHA-256 (minio-go streaming, vmshelf in one pass)"
	if srv.certFile != "" {
		env = append(env, "SSL_CERT_FILE="+srv.certFile)
		transport = "https with a self-signed certificate both clients trust (as S3 in production is https): both send UNSIGNED-PAYLOAD, vmshelf with each part's CRC32C, which the server checks"
	}
	vm, err := startVmshelfWith(b.vmBin, b.dir, "vmshelf-s3-data", 8,
		[]string{"--blobs", "s3://" + s3Bucket + "/edge", "--blob-capacity-gib", "64"}, env)
	if err != nil {
		return err
	}
	// Not `defer vm.stop()`: that binds the process of now, and
	// s3ConcurrentRSS restarts vmshelf.
	defer func() { vm.stop() }()
	b.rep.setSetup("S3", "versitygw v1.8.0, posix backend under "+b.dir+"/s3-root (the same disk), on loopback over "+transport+"; vmshelf `--blobs s3://"+s3Bucket+"/edge` with the records in SQLite")

	t := b.rep.table("s3", fmt.Sprintf("The %d MiB test file through S3", b.size>>20),
		"vmshelf over an S3 bucket (`--blobs s3://…`, as every replica of a scaled-out edge runs) against the S3 server's own PUT and GET of the same bytes "+
			"from a Go client (minio-go, default options: its own part size, 4 parallel part uploads), one server (versitygw, posix backend, the same disk), over "+transport+". "+
			"*vmshelf PUT → S3*: `curl -T file <upload URL>`, all checks + SHA-256, 8 MiB parts sent as they fill, the structure check reading the completed upload back with ranged GETs, commit marker; "+
			"201 with the image JSON. *vmshelf GET ← S3*: `curl` of the fetch URL into nothing (one ranged GET streamed from S3). "+
			"Neither S3 path fsyncs (versitygw's posix backend writes through the page cache), so all four are answer times.",
		Metric{Key: "mbps", Label: "MB/s", Unit: "MB/s", Better: "higher", digits: 0},
	)
	for _, s := range []string{s3Vmshelf, s3Direct, s3VmshelfGet, s3DirectGet} {
		t.row(s, map[bool]string{true: "vmshelf", false: "peer"}[strings.HasPrefix(s, "vmshelf")])
	}
	var last string // the last image vmshelf stored, for its fetch
	for r := range b.opt.reps {
		for _, s := range rotate([]string{s3Vmshelf, s3Direct}, r) {
			logf("  s3 rep %d: %s", r+1, s)
			if err := warm(b.file); err != nil {
				return err
			}
			settle()
			secs, id, err := b.s3Put(s, vm, srv, r)
			if err != nil {
				b.fail("s3 %s rep %d: %v", s, r+1, err)
				secs = nan
			}
			if id != "" {
				last = id
			}
			t.add(s, map[bool]string{true: "vmshelf", false: "peer"}[s == s3Vmshelf], "mbps", float64(b.size)/secs/mb)
		}
		for _, s := range rotate([]string{s3VmshelfGet, s3DirectGet}, r) {
			logf("  s3 rep %d: %s", r+1, s)
			settle()
			secs, err := b.s3Get(s, vm, srv, last, r)
			if err != nil {
				b.fail("s3 %s rep %d: %v", s, r+1, err)
				secs = nan
			}
			t.add(s, map[bool]string{true: "vmshelf", false: "peer"}[s == s3VmshelfGet], "mbps", float64(b.size)/secs/mb)
		}
		// What the repetition stored goes before the next one: kept, 5
		// repetitions held 10 copies of the file in the bucket (20 GiB of
		// a 2 GiB file), and the concurrent uploads after them ran out of
		// disk on a machine with 45 GiB free.
		if err := b.s3Forget(vm, srv, last, r); err != nil {
			return err
		}
		last = ""
	}
	t.ratio("mbps", s3Vmshelf, s3Direct, "mbps")
	t.ratio("mbps", s3VmshelfGet, s3DirectGet, "mbps")
	return b.s3ConcurrentRSS(vm)
}

// s3Concurrent is the row of the 4 concurrent uploads through S3.
const s3Concurrent = "vmshelf, 4 concurrent PUTs → S3"

// s3ConcurrentRSS measures what 4 uploads at once through S3 cost in
// memory (each holds its part buffers): peak RSS of a fresh vmshelf from
// the first byte to the last answer, once per repetition.
func (b *bench) s3ConcurrentRSS(vm *vmshelf) error {
	t := b.rep.table("s3_rss", fmt.Sprintf("4 concurrent uploads of the %d MiB test file through S3", b.size>>20),
		"4 `curl -T file <upload URL>` at once into a fresh vmshelf process (restarted before each repetition) over the S3 bucket above; "+
			"peak RSS of the vmshelf process from the uploads' start to the last answer (VmHWM reset at the start, VmRSS sampled every 50 ms); aggregate MB/s is 4 × the file over the wall time.",
		Metric{Key: "rss", Label: "peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
		Metric{Key: "mbps", Label: "aggregate MB/s", Unit: "MB/s", Better: "higher", digits: 0},
	)
	t.row(s3Concurrent, "vmshelf")
	for r := range b.opt.reps {
		logf("  s3 rep %d: %s", r+1, s3Concurrent)
		if err := vm.restart(); err != nil {
			return err
		}
		tks := make([]ticket, 4)
		for i := range tks {
			tk, err := vm.ticket(fmt.Sprintf("s3 concurrent rep %d #%d", r, i))
			if err != nil {
				return err
			}
			tks[i] = tk
		}
		if err := warm(b.file); err != nil {
			return err
		}
		settle()
		m := startMeter(vm.pids)
		type answer struct {
			id  string
			err error
		}
		answers := make(chan answer, len(tks))
		for _, tk := range tks {
			go func() {
				res, err := curlPut(b.file, tk.UploadURL)
				if err == nil && (res.Code != 201 || !strings.Contains(res.Body, b.sha)) {
					err = fmt.Errorf("upload answered %d %s", res.Code, res.Body)
				}
				answers <- answer{tk.UploadID, err}
			}()
		}
		failed := false
		var stored []string
		for range tks {
			a := <-answers
			if a.err != nil {
				b.fail("s3 %s rep %d: %v", s3Concurrent, r+1, a.err)
				failed = true
				continue
			}
			stored = append(stored, a.id)
		}
		use := m.end()
		// The stored images go whatever the outcome (see s3Forget).
		for _, id := range stored {
			if err := vm.remove(id); err != nil {
				return err
			}
		}
		if failed {
			t.add(s3Concurrent, "vmshelf", "rss", nan)
			t.add(s3Concurrent, "vmshelf", "mbps", nan)
			continue
		}
		t.add(s3Concurrent, "vmshelf", "rss", float64(use.PeakRSS)/mib)
		t.add(s3Concurrent, "vmshelf", "mbps", 4*float64(b.size)/use.Wall/mb)
	}
	return nil
}

// s3Forget removes what repetition r stored: vmshelf's image id (if any)
// and the direct client's object.
func (b *bench) s3Forget(vm *vmshelf, srv *s3Server, id string, r int) error {
	if id != "" {
		if err := vm.remove(id); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.client.RemoveObject(ctx, s3Bucket, fmt.Sprintf("direct/%d", r), minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("remove direct/%d: %w", r, err)
	}
	return nil
}

// s3Put stores the test file once as subject and returns the seconds it
// took (and vmshelf's upload id).
func (b *bench) s3Put(subject string, vm *vmshelf, srv *s3Server, r int) (float64, string, error) {
	if subject == s3Vmshelf {
		tk, err := vm.ticket(fmt.Sprintf("s3 rep %d", r))
		if err != nil {
			return 0, "", err
		}
		pr := b.startPerf("s3-put", vm.pids())
		res, err := curlPut(b.file, tk.UploadURL)
		pr.stop()
		if err != nil {
			return 0, "", err
		}
		if res.Code != 201 || !strings.Contains(res.Body, b.sha) {
			return 0, "", fmt.Errorf("upload answered %d %s", res.Code, res.Body)
		}
		return res.Total, tk.UploadID, nil
	}
	f, err := os.Open(b.file)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	_, err = srv.client.PutObject(ctx, s3Bucket, fmt.Sprintf("direct/%d", r), f, b.size, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	return time.Since(start).Seconds(), "", err
}

// s3Get reads the stored file whole once as subject.
func (b *bench) s3Get(subject string, vm *vmshelf, srv *s3Server, id string, r int) (float64, error) {
	if subject == s3VmshelfGet {
		if id == "" {
			return 0, fmt.Errorf("no image stored by vmshelf to fetch")
		}
		u, err := vm.fetchURL(id)
		if err != nil {
			return 0, err
		}
		res, err := curlGet(u, nil)
		if err != nil {
			return 0, err
		}
		if res.Code != 200 || res.Download != b.size {
			return 0, fmt.Errorf("fetch answered %d with %d bytes", res.Code, res.Download)
		}
		return res.Total, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	obj, err := srv.client.GetObject(ctx, s3Bucket, fmt.Sprintf("direct/%d", r), minio.GetObjectOptions{})
	if err != nil {
		return 0, err
	}
	defer obj.Close()
	n, err := io.Copy(io.Discard, obj)
	if err == nil && n != b.size {
		err = fmt.Errorf("read %d bytes, want %d", n, b.size)
	}
	return time.Since(start).Seconds(), err
}
