// Package s3 is imagestore.Blobs on an S3-compatible object store, so
// that several vmshelf replicas can share the image bytes.
//
// Layout under <prefix>/ in the bucket:
//
//	images/<id>.qcow2          the bytes: a completed multipart upload
//	committed/<id>             empty marker written by Commit
//	partial/<id>/tail.<k>      bytes of part k short of a full part, put by Sync
//	partial/<id>/durable       the offset the last Sync (or Resume) made durable
//	quarantine/<id>.qcow2      quarantined blobs
//	store-id                   the store's identity (imagestore.StoreIdentity)
//	probe/ready                the readiness probe's object (Ping), there for an instant
//
// A blob is visible by its marker, never by its bytes' key appearing: List
// and Open see only ids with a marker. An images/ object without a marker
// is staged: its writer completed the upload (to read it back for the
// structure check) but never committed it. Commit writes one empty object,
// so it costs the same for any size; nothing is ever copied on the way in.
//
// The state of an unfinished write lives in S3, never only in the process:
// the multipart upload (found by ListMultipartUploads), its parts
// (ListObjectParts), the tail of the part in progress and the durable
// offset. So a tus upload cut off on one replica resumes on another, and a
// kill -9 loses at most what was written since the last Sync.
//
// Part k covers [(k-1)·P, k·P) for the store's part size P, so part
// numbers follow from offsets. A writer holds the part in progress in
// memory (P bytes at most): S3 wants each part's length before its first
// byte, and only the end of the blob (or a Sync) says how long the last
// one is. Parts go to the server as they fill, streamed from that buffer
// (minio-go never copies the part) with a checksum the server verifies:
// over https the part's CRC32C and an unsigned payload, TLS keeping the
// bytes from tampering; over http the part's SHA-256, signed (see
// PayloadSigning). They are sent in the background while the next part
// fills: a writer holds at most 1 + Config.PartsInFlight part buffers,
// and those beyond its first come from Config.SpareParts shared by the
// Store (see writer).
//
// Measured once on a 2-core box against versitygw (posix backend, same
// host), 1 GiB: this writer 8.4 s (122 MiB/s) with 8 MiB parts, peak Go
// heap 19 MiB for the whole test process; 16 MiB parts were no faster
// (119 MiB/s) at twice the memory, hence DefaultPartFloor. minio-go's own
// PutObject of the same bytes took 13.0 s (79 MiB/s). Reading back with
// one Section 1.1 s (951 MiB/s), minio-go's GetObject 1.4 s.
//
// Resume is asked at offsets a Sync made durable (the gateway records
// only those): the bytes of a part already sent cannot be read back from
// an unfinished upload, so only where a Sync kept the part's tail can a
// write resume mid-part.
//
// Why minio-go v7: a small dependency tree (no AWS SDK modules), and
// minio.Core exposes the multipart calls one by one (NewMultipartUpload,
// PutObjectPart, ListObjectParts, ListMultipartUploads,
// CompleteMultipartUpload, CopyObjectPart), which the resumable writer
// needs; aws-sdk-go-v2 would do it too, with four times the modules.
package s3

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Store is the Blobs on one bucket and prefix. It is safe for concurrent
// use; each BlobWriter it returns is used by one goroutine at a time.
type Store struct {
	core     minio.Core
	bucket   string
	prefix   string // "" or "folder/" (with the slash)
	partSize int64
	capacity int64
	grace    time.Duration
	now      func() time.Time
	secrets  []string // scrubbed from every error text

	callTimeout time.Duration
	idleTimeout time.Duration

	// unsigned: parts go with UNSIGNED-PAYLOAD and their CRC32C, not
	// their signed SHA-256 (Config.PayloadSigning).
	unsigned bool

	// partsInFlight: how many full parts one writer sends at once; spare
	// holds a token for every part buffer a writer holds beyond its first
	// (see writer); partBufs counts the part buffers writers hold.
	partsInFlight int
	spare         chan struct{}
	partBufs      atomic.Int64

	usage  usage
	health *imagestore.HealthProbe
}

var _ imagestore.Blobs = (*Store)(nil)

// Open connects to cfg's bucket and checks that it exists. The part size
// is cfg.PartSize, or chosen from cfg.MaxImageBytes (see partSizeFor).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3: no bucket")
	}
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, errors.New("s3: no credentials: the access key id and the secret key must both be set")
	}
	if strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("s3: prefix %q: no leading or trailing slash", cfg.Prefix)
	}
	if cfg.MaxImageBytes < 0 || cfg.CapacityBytes < 0 {
		return nil, errors.New("s3: negative size in the config")
	}
	partSize := cfg.PartSize
	if partSize == 0 {
		partSize = partSizeFor(cfg.MaxImageBytes, DefaultPartFloor)
	}
	if partSize < minPartSize {
		return nil, fmt.Errorf("s3: part size %d is below S3's minimum of %d", partSize, minPartSize)
	}
	if cfg.MaxImageBytes > partSize*(maxParts-1) {
		return nil, fmt.Errorf("s3: part size %d is too small for blobs of %d bytes in %d parts", partSize, cfg.MaxImageBytes, maxParts)
	}
	host, secure, lookup := "s3.amazonaws.com", true, minio.BucketLookupAuto
	if cfg.Endpoint != "" {
		var err error
		if host, secure, err = endpointHost(cfg.Endpoint); err != nil {
			return nil, err
		}
		lookup = minio.BucketLookupPath
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	retries := cfg.MaxRetries
	if retries == 0 {
		retries = DefaultMaxRetries
	}
	if _, err := ParsePayloadSigning(string(cfg.PayloadSigning)); err != nil {
		return nil, err
	}
	tr := cfg.Transport
	if tr == nil {
		var err error
		if tr, err = transport(secure, cfg.RootCAs); err != nil {
			return nil, fmt.Errorf("s3: transport for %s: %w", host, err)
		}
	}
	core, err := minio.NewCore(host, &minio.Options{
		Creds:        credentials.NewStaticV4(string(cfg.AccessKeyID), string(cfg.SecretAccessKey), string(cfg.SessionToken)),
		Secure:       secure,
		Region:       region,
		BucketLookup: lookup,
		Transport:    tr,
		MaxRetries:   retries,
	})
	if err != nil {
		return nil, fmt.Errorf("s3: client for %s: %w", host, err)
	}
	s := &Store{
		core:     *core,
		bucket:   cfg.Bucket,
		partSize: partSize,
		capacity: cfg.CapacityBytes,
		grace:    cfg.PartialGrace,
		now:      cfg.Now,

		callTimeout: cmp.Or(cfg.CallTimeout, DefaultCallTimeout),
		idleTimeout: cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout),

		unsigned: cfg.PayloadSigning.unsigned(secure),

		partsInFlight: max(1, cmp.Or(cfg.PartsInFlight, DefaultPartsInFlight)),
		spare:         make(chan struct{}, max(0, cmp.Or(cfg.SpareParts, DefaultSpareParts))),
	}
	s.health = &imagestore.HealthProbe{Check: s.ping, Timeout: cmp.Or(cfg.PingTimeout, DefaultPingTimeout), TTL: cmp.Or(cfg.PingTTL, DefaultPingTTL)}
	if cfg.Prefix != "" {
		s.prefix = cfg.Prefix + "/"
	}
	for _, c := range []Secret{cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken} {
		if c != "" {
			s.secrets = append(s.secrets, string(c))
		}
	}
	if s.grace == 0 {
		s.grace = DefaultPartialGrace
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.usage.ttl = cfg.UsageTTL
	if s.usage.ttl == 0 {
		s.usage.ttl = DefaultUsageTTL
	}
	if err := s.bucketExists(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// takeSpare takes a spare token if one is free; it never waits.
func (s *Store) takeSpare() bool {
	select {
	case s.spare <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Store) releaseSpare() { <-s.spare }

// bucketExists asks for the bucket (HEAD): the cheapest call that needs
// the server, the credentials and the bucket.
func (s *Store) bucketExists(ctx context.Context) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	ok, err := s.core.BucketExists(cctx, s.bucket)
	if err != nil {
		return s.errorf(classify(cctx, err), "bucket %s", s.bucket)
	}
	if !ok {
		return fmt.Errorf("s3: bucket %q does not exist", s.bucket)
	}
	return nil
}

// Ping says whether the bucket takes a write, for a readiness probe: a
// small probe object put and removed within the ping timeout, its verdict
// kept for the ping TTL, so that a flood of probes asks S3 at most once
// per TTL. A HEAD of the bucket is not enough: a server coming back (or
// one gone read-only) can answer HEADs while every write still fails, and
// a replica that reads as ready then fails every upload it is sent.
func (s *Store) Ping(ctx context.Context) error { return s.health.Ping(ctx) }

// ping is Ping's check; ctx carries the ping timeout.
func (s *Store) ping(ctx context.Context) error {
	err := s.probeWrite(ctx)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrNoAnswer) {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return err
}

// probeWrite puts the probe object and removes it again. Every replica
// writes the same key: one replica's removal may take another's probe,
// which only makes that one's removal find nothing, no error.
func (s *Store) probeWrite(ctx context.Context) error {
	if _, err := s.putSmall(ctx, s.probeKey(), []byte("ready\n"), false); err != nil {
		return s.errorf(err, "readiness probe: write %s", s.probeKey())
	}
	if err := s.remove(ctx, s.probeKey()); err != nil {
		return s.errorf(err, "readiness probe: remove %s", s.probeKey())
	}
	return nil
}

// PartSize is the size of every part but the last: the memory a running
// upload holds.
func (s *Store) PartSize() int64 { return s.partSize }

func (s *Store) imageKey(id string) string      { return s.prefix + "images/" + id + ".qcow2" }
func (s *Store) probeKey() string               { return s.prefix + "probe/ready" }
func (s *Store) markerKey(id string) string     { return s.prefix + "committed/" + id }
func (s *Store) partialDir(id string) string    { return s.prefix + "partial/" + id + "/" }
func (s *Store) durableKey(id string) string    { return s.partialDir(id) + "durable" }
func (s *Store) headKey(id string) string       { return s.partialDir(id) + "head" }
func (s *Store) quarantineKey(id string) string { return s.prefix + "quarantine/" + id + ".qcow2" }
func (s *Store) tailKey(id string, part int) string {
	return fmt.Sprintf("%stail.%05d", s.partialDir(id), part)
}

// checkID refuses anything that is not an upload id before it becomes
// part of a key.
func checkID(id string) error {
	if !imagestore.ValidUploadID(id) {
		return fmt.Errorf("s3: invalid upload id %q: want 24 lower-case hex characters", id)
	}
	return nil
}

// isNotFound is true only for the server's own answer that the key or
// upload does not exist. A refused connection, a timeout, a missing bucket
// or a denied request are errors: could not ask is never absent.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case "NoSuchKey", "NoSuchUpload", "NotFound":
		return true
	case "NoSuchBucket", "":
		return false
	}
	return r.StatusCode == http.StatusNotFound
}

// isPreconditionFailed is the server refusing a conditional write
// (If-None-Match: *) because the key exists.
func isPreconditionFailed(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed"
}

// scrubbed is an error whose text had credentials taken out; errors.Is
// and errors.As still see the original.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// errorf wraps err with "s3: <what>" and removes any credential from the
// text: no known server echoes one, but a proxy in between might, and a
// log line must never carry it.
func (s *Store) errorf(err error, format string, args ...any) error {
	wrapped := fmt.Errorf("s3: "+format+": %w", append(args, err)...)
	msg := wrapped.Error()
	clean := msg
	for _, c := range s.secrets {
		clean = strings.ReplaceAll(clean, c, "[redacted]")
	}
	if clean == msg {
		return wrapped
	}
	return &scrubbed{msg: clean, err: wrapped}
}

// stat is StatObject; found is false only on the server's NotFound.
func (s *Store) stat(ctx context.Context, key string) (info minio.ObjectInfo, found bool, err error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	info, err = s.core.StatObject(cctx, s.bucket, key, minio.StatObjectOptions{})
	if isNotFound(err) {
		return minio.ObjectInfo{}, false, nil
	}
	if err != nil {
		return minio.ObjectInfo{}, false, classify(cctx, err)
	}
	return info, true, nil
}

// remove deletes key; a missing one is not an error.
func (s *Store) remove(ctx context.Context, key string) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	err := s.core.RemoveObject(cctx, s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && !isNotFound(err) {
		return classify(cctx, err)
	}
	return nil
}

// smallBody is the largest object written under the deadline of a call
// that moves no image bytes; a larger one (a part's tail, the head) is a
// transfer, bounded by the idle timeout.
const smallBody = 64 << 10

// putSmall writes an object from memory (a marker, a tail, the durable
// offset). ifAbsent makes it conditional: the write fails with a
// PreconditionFailed answer if the key exists.
func (s *Store) putSmall(ctx context.Context, key string, data []byte, ifAbsent bool) (minio.UploadInfo, error) {
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true}
	if ifAbsent {
		opts.SetMatchETagExcept("*")
	}
	if len(data) <= smallBody {
		cctx, cancel := s.call(ctx)
		defer cancel()
		info, err := s.core.PutObject(cctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), "", "", opts)
		return info, classify(cctx, err)
	}
	w := s.watch(ctx)
	defer w.stop()
	body := sendReader{ReadSeeker: bytes.NewReader(data), w: w}
	info, err := s.core.PutObject(w.ctx, s.bucket, key, body, int64(len(data)), "", "", opts)
	return info, w.err(err)
}

// listObjects lists every object under prefix, recursively. Each page
// must come within the call timeout of the one before.
func (s *Store) listObjects(ctx context.Context, prefix string) ([]minio.ObjectInfo, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil) // stops the lister if we return early
	late := fmt.Errorf("%w within %v", ErrNoAnswer, s.callTimeout)
	page := time.AfterFunc(s.callTimeout, func() { cancel(late) })
	defer page.Stop()
	var out []minio.ObjectInfo
	for o := range s.core.Client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, classify(ctx, o.Err)
		}
		page.Reset(s.callTimeout)
		out = append(out, o)
	}
	return out, nil
}

// uploads lists the unfinished multipart uploads whose key starts with
// prefix.
func (s *Store) uploads(ctx context.Context, prefix string) ([]minio.ObjectMultipartInfo, error) {
	var out []minio.ObjectMultipartInfo
	keyMarker, idMarker := "", ""
	for range 100000 { // bounded: 100 000 pages of 1 000
		cctx, cancel := s.call(ctx)
		res, err := s.core.ListMultipartUploads(cctx, s.bucket, prefix, keyMarker, idMarker, "", 1000)
		err = classify(cctx, err)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, res.Uploads...)
		if !res.IsTruncated {
			return out, nil
		}
		if res.NextKeyMarker == keyMarker && res.NextUploadIDMarker == idMarker {
			return nil, errors.New("listing of multipart uploads does not advance")
		}
		keyMarker, idMarker = res.NextKeyMarker, res.NextUploadIDMarker
	}
	return nil, errors.New("too many multipart uploads")
}

// uploadsFor are the unfinished multipart uploads of exactly key.
func (s *Store) uploadsFor(ctx context.Context, key string) ([]minio.ObjectMultipartInfo, error) {
	all, err := s.uploads(ctx, key)
	if err != nil {
		return nil, err
	}
	var out []minio.ObjectMultipartInfo
	for _, u := range all {
		if u.Key == key {
			out = append(out, u)
		}
	}
	return out, nil
}

// parts lists the uploaded parts of one multipart upload.
func (s *Store) parts(ctx context.Context, key, uploadID string) ([]minio.ObjectPart, error) {
	parts, _, err := s.listParts(ctx, key, uploadID)
	return parts, err
}

// listParts is parts, and the checksum algorithm the upload was created
// with (CRC32C, or "" or "null" for none).
func (s *Store) listParts(ctx context.Context, key, uploadID string) ([]minio.ObjectPart, string, error) {
	var out []minio.ObjectPart
	algo := ""
	marker := 0
	for range maxParts + 1 {
		cctx, cancel := s.call(ctx)
		res, err := s.core.ListObjectParts(cctx, s.bucket, key, uploadID, marker, 1000)
		err = classify(cctx, err)
		cancel()
		if err != nil {
			return nil, "", err
		}
		algo = cmp.Or(algo, res.ChecksumAlgorithm)
		out = append(out, res.ObjectParts...)
		if !res.IsTruncated {
			sort.Slice(out, func(i, j int) bool { return out[i].PartNumber < out[j].PartNumber })
			return out, algo, nil
		}
		if res.NextPartNumberMarker <= marker {
			return nil, "", errors.New("listing of parts does not advance")
		}
		marker = res.NextPartNumberMarker
	}
	return nil, "", errors.New("too many parts")
}

// Open returns a committed blob; the error wraps imagestore.ErrNotFound
// only when the server says there is no marker.
func (s *Store) Open(ctx context.Context, id string) (imagestore.Blob, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	_, found, err := s.stat(ctx, s.markerKey(id))
	if err != nil {
		return nil, s.errorf(err, "open %s", id)
	}
	if !found {
		return nil, fmt.Errorf("s3: open %s: %w", id, imagestore.ErrNotFound)
	}
	info, found, err := s.stat(ctx, s.imageKey(id))
	if err != nil {
		return nil, s.errorf(err, "open %s", id)
	}
	if !found {
		// Delete and Quarantine remove the marker first: a marker
		// without its bytes is damage, not absence.
		return nil, fmt.Errorf("s3: open %s: committed, but its bytes are missing", id)
	}
	return &blob{s: s, id: id, key: s.imageKey(id), size: info.Size, mod: info.LastModified, etag: info.ETag}, nil
}

// Delete removes a committed blob: first its marker (from then on it is
// invisible), then its bytes. A missing one is not an error; an images/
// object without a marker is some writer's staged blob and is left alone.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer s.usage.invalidate()
	_, found, err := s.stat(ctx, s.markerKey(id))
	if err != nil {
		return s.errorf(err, "delete %s", id)
	}
	if !found {
		return nil
	}
	if err := s.remove(ctx, s.markerKey(id)); err != nil {
		return s.errorf(err, "delete %s: marker", id)
	}
	// Should this fail, the bytes are left staged and unmarked:
	// RemovePartials takes them once they are older than the grace.
	if err := s.remove(ctx, s.imageKey(id)); err != nil {
		return s.errorf(err, "delete %s: bytes", id)
	}
	return nil
}

// List returns the ids of the committed blobs (those with a marker),
// sorted. Keys that are not valid ids are ignored.
func (s *Store) List(ctx context.Context) ([]string, error) {
	objs, err := s.listObjects(ctx, s.prefix+"committed/")
	if err != nil {
		return nil, s.errorf(err, "list")
	}
	ids := []string{}
	for _, o := range objs {
		id := strings.TrimPrefix(o.Key, s.prefix+"committed/")
		if imagestore.ValidUploadID(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Quarantine copies the committed blob to quarantine/ (server-side; in
// parts above 5 GiB), then removes its marker and its bytes. A crash in
// between leaves it in both places, never in neither; the next Quarantine
// then answers ErrExists and the blob stays out of nobody's way but its
// own. Quarantine is rare and an operator's concern, so the copy is fine.
func (s *Store) Quarantine(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer s.usage.invalidate()
	_, found, err := s.stat(ctx, s.markerKey(id))
	if err != nil {
		return s.errorf(err, "quarantine %s", id)
	}
	if !found {
		return fmt.Errorf("s3: quarantine %s: %w", id, imagestore.ErrNotFound)
	}
	_, found, err = s.stat(ctx, s.quarantineKey(id))
	if err != nil {
		return s.errorf(err, "quarantine %s", id)
	}
	if found {
		return fmt.Errorf("s3: quarantine %s: a quarantined blob has that id: %w", id, imagestore.ErrExists)
	}
	src, found, err := s.stat(ctx, s.imageKey(id))
	if err != nil {
		return s.errorf(err, "quarantine %s", id)
	}
	if !found {
		return fmt.Errorf("s3: quarantine %s: committed, but its bytes are missing", id)
	}
	cctx, cancel := s.copyCall(ctx, src.Size)
	defer cancel()
	_, err = s.core.ComposeObject(cctx,
		minio.CopyDestOptions{Bucket: s.bucket, Object: s.quarantineKey(id)},
		minio.CopySrcOptions{Bucket: s.bucket, Object: s.imageKey(id)})
	if err != nil {
		return s.errorf(classify(cctx, err), "quarantine %s: copy", id)
	}
	if err := s.remove(ctx, s.markerKey(id)); err != nil {
		return s.errorf(err, "quarantine %s: marker", id)
	}
	if err := s.remove(ctx, s.imageKey(id)); err != nil {
		return s.errorf(err, "quarantine %s: bytes", id)
	}
	return nil
}

// Quarantined lists quarantine/, sorted by id. QuarantinedAt is the copy's
// modification time, set by the server.
func (s *Store) Quarantined(ctx context.Context) ([]imagestore.QuarantinedBlob, error) {
	objs, err := s.listObjects(ctx, s.prefix+"quarantine/")
	if err != nil {
		return nil, s.errorf(err, "list quarantine")
	}
	out := []imagestore.QuarantinedBlob{}
	for _, o := range objs {
		id, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, s.prefix+"quarantine/"), ".qcow2")
		if !ok || !imagestore.ValidUploadID(id) {
			continue
		}
		out = append(out, imagestore.QuarantinedBlob{ID: id, Size: o.Size, QuarantinedAt: o.LastModified})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RemoveQuarantined deletes one quarantined blob, on an operator's request.
func (s *Store) RemoveQuarantined(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer s.usage.invalidate()
	_, found, err := s.stat(ctx, s.quarantineKey(id))
	if err != nil {
		return s.errorf(err, "remove quarantined %s", id)
	}
	if !found {
		return fmt.Errorf("s3: remove quarantined %s: %w", id, imagestore.ErrNotFound)
	}
	if err := s.remove(ctx, s.quarantineKey(id)); err != nil {
		return s.errorf(err, "remove quarantined %s", id)
	}
	return nil
}

// usage caches what the store holds, for Available and Unfinished.
type usage struct {
	ttl time.Duration

	mu     sync.Mutex
	at     time.Time // of the listing; zero: none yet, or invalidated
	listed holding
	base   int64 // uploaded at the start of that listing

	// uploaded counts the bytes this process's writers sent (parts and
	// tails); buffered the bytes they hold in memory, not yet sent.
	uploaded atomic.Int64
	buffered atomic.Int64
}

func (u *usage) invalidate() {
	u.mu.Lock()
	u.at = time.Time{}
	u.mu.Unlock()
}

// holding is what one listing of the prefix found.
type holding struct {
	bytes int64 // every object and every uploaded part
	// uploads are the multipart uploads neither completed nor aborted;
	// unfinished the bytes of their parts and of the partial/ objects.
	uploads    int
	unfinished int64
}

// listing returns the cached listing, made again if it is older than the
// usage TTL; the caller holds s.usage.mu.
func (s *Store) listing(ctx context.Context) (holding, error) {
	u := &s.usage
	if u.at.IsZero() || time.Since(u.at) > u.ttl {
		base := u.uploaded.Load()
		listed, err := s.stored(ctx)
		if err != nil {
			return holding{}, err
		}
		u.at, u.listed, u.base = time.Now(), listed, base
	}
	return u.listed, nil
}

// Available is the configured capacity less what the prefix holds:
// committed, staged, quarantined and partial objects, the parts of
// unfinished multipart uploads (all replicas'), and the bytes this
// process's writers hold or sent since the listing. The listing is at
// most UsageTTL old, so other replicas' writes of the last UsageTTL may
// be missing; this process's own removals refresh it at once. Bytes sent
// while the listing ran are counted twice, on the safe side.
func (s *Store) Available(ctx context.Context) (int64, error) {
	u := &s.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	listed, err := s.listing(ctx)
	if err != nil {
		return 0, s.errorf(err, "available")
	}
	used := listed.bytes + (u.uploaded.Load() - u.base) + u.buffered.Load()
	return max(s.capacity-used, 0), nil
}

// Unfinished is what unfinished writes hold in the prefix, from the
// listing behind Available: the multipart uploads neither completed nor
// aborted (every replica's, running or left by a crash) and the bytes of
// their parts and partial objects. A write left by a killed process stays
// there until a start-up's RemovePartials, once the partial grace has
// passed: this is the figure that shows it.
func (s *Store) Unfinished(ctx context.Context) (uploads int, bytes int64, err error) {
	u := &s.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	listed, err := s.listing(ctx)
	if err != nil {
		return 0, 0, s.errorf(err, "unfinished writes")
	}
	return listed.uploads, listed.unfinished, nil
}

// stored sums every object and every uploaded part under the prefix.
func (s *Store) stored(ctx context.Context) (holding, error) {
	objs, err := s.listObjects(ctx, s.prefix)
	if err != nil {
		return holding{}, err
	}
	var h holding
	for _, o := range objs {
		h.bytes += o.Size
		if strings.HasPrefix(o.Key, s.prefix+"partial/") {
			h.unfinished += o.Size
		}
	}
	ups, err := s.uploads(ctx, s.prefix)
	if err != nil {
		return holding{}, err
	}
	for _, up := range ups {
		parts, err := s.parts(ctx, up.Key, up.UploadID)
		if isNotFound(err) {
			continue // completed or aborted since the listing
		}
		if err != nil {
			return holding{}, err
		}
		h.uploads++
		for _, p := range parts {
			h.bytes += p.Size
			h.unfinished += p.Size
		}
	}
	return h, nil
}
