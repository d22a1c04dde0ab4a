package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
)

// writer is a blob being written as one multipart upload, from Create or
// Resume. It holds the part in progress in buf: bytes [base, base+len(buf))
// of the blob; the parts below base are uploaded (parts) or in flight
// (sending). Its methods lock, so a Close or Abort from another goroutine
// is safe.
//
// Parts in flight. A full part is handed to a goroutine that hashes and
// PUTs it, while the next one fills from the caller's Writes: at most
// Store.partsInFlight at once, in part-number order in sending. The
// memory budget is counted in part buffers, reused from part to part:
// a writer holds at most 1 + partsInFlight of them (the one filling and
// the ones in flight), whatever the client sends, and every buffer
// beyond its first takes one of the Store's spare tokens (Config.
// SpareParts), so that many uploads at once cost one part each plus the
// spares, never more; a writer that gets no spare sends one part at a
// time, as if partsInFlight were 0. A Write that needs a buffer and has
// none waits for the oldest part in flight. Every step that depends on
// the parts being in S3 waits for them first: Sync (before the durable
// offset moves), the completion (which lists parts in number order), and
// Close and Abort (which cancel them and wait, so that no part lands
// after an Abort and no goroutine outlives the writer).
type writer struct {
	mu       sync.Mutex
	s        *Store
	id       string
	key      string
	uploadID string // "" for a writer that resumed a staged blob
	// crc: the upload was created with CRC32C as its checksum algorithm
	// (see newUpload): every part carries its CRC32C, and the completion
	// lists them. Only such an upload's parts may go unsigned.
	crc   bool
	parts []minio.CompletePart
	buf   []byte
	base  int64
	// sending: the parts in flight, oldest first; ctx is theirs, cancel
	// ends them (Abort, Close, a failure).
	sending []*part
	ctx     context.Context
	cancel  context.CancelFunc
	// free: idle part buffers; held: every part buffer the writer holds
	// (buf, sending, free); spares: how many of them took a spare token.
	free   [][]byte
	held   int
	spares int
	// cut: a part request was cancelled (or failed) before its answer;
	// the server may still be storing it after the upload is aborted.
	cut bool
	// synced is how much of buf the tail object holds; durable the offset
	// the durable object records.
	synced  int
	durable int64
	life    imagestore.WriterLife
	// staged: the multipart upload is completed into key; size and etag
	// are the staged object's.
	staged bool
	size   int64
	etag   string
	// tried: a completion was sent whose outcome is unknown (an error
	// that was not the server's refusal); Abort removes what it may
	// have staged.
	tried bool
	// werr is the first failed Write or Sync: a part or tail may be
	// missing, so later Writes, Syncs and Commit refuse.
	werr error
	// fence, if set, is asked before every write that makes bytes
	// durable or visible (SetFence).
	fence func(ctx context.Context) error
}

var (
	_ imagestore.BlobWriter = (*writer)(nil)
	_ imagestore.Fenceable  = (*writer)(nil)
)

// SetFence makes every later part, tail, completion and commit ask fence
// first; its error fails that step, for good, as a failed send does.
func (w *writer) SetFence(fence func(ctx context.Context) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fence = fence
}

// fenced asks the fence, if any, within the call timeout. Its error says
// why the fence refused (the writer's right lapsed, or could not be
// checked): the words are the fence's, not a verdict of this package.
func (w *writer) fenced(ctx context.Context) error {
	if w.fence == nil {
		return nil
	}
	ctx, cancel := w.s.call(ctx)
	defer cancel()
	if err := w.fence(ctx); err != nil {
		return fmt.Errorf("write not made: %w", err)
	}
	return nil
}

// Create starts a multipart upload for id. It refuses (ErrExists) an id
// that is committed, staged or already being written: two uploads never
// share an id, and a committed blob is never written again.
func (s *Store) Create(ctx context.Context, id string) (imagestore.BlobWriter, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("s3: create %s: %w", id, err)
	}
	key := s.imageKey(id)
	for _, k := range []string{s.markerKey(id), key} {
		_, found, err := s.stat(ctx, k)
		if err != nil {
			return nil, s.errorf(err, "create %s", id)
		}
		if found {
			return nil, fmt.Errorf("s3: create %s: %w", id, imagestore.ErrExists)
		}
	}
	ups, err := s.uploadsFor(ctx, key)
	if err != nil {
		return nil, s.errorf(err, "create %s", id)
	}
	if len(ups) > 0 {
		return nil, fmt.Errorf("s3: create %s: an unfinished upload exists: %w", id, imagestore.ErrExists)
	}
	// Debris of an earlier write of this id (a cleanup that failed) must
	// not be mistaken for this write's tails by a later Resume.
	if err := s.removeAll(ctx, s.partialDir(id)); err != nil {
		return nil, s.errorf(err, "create %s: old partial objects", id)
	}
	uploadID, err := s.newUpload(ctx, key, s.unsigned)
	if err != nil {
		return nil, s.errorf(err, "create %s", id)
	}
	w := s.newWriter(id, key, uploadID)
	w.crc = s.unsigned
	return w, nil
}

// newWriter is a writer of id's key through multipart upload uploadID
// ("" if staged), with no part yet and no buffer.
func (s *Store) newWriter(id, key, uploadID string) *writer {
	w := &writer{s: s, id: id, life: imagestore.NewWriterLife("s3", id), key: key, uploadID: uploadID}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w
}

// part is one part in flight: buf is its goroutine's until done is
// closed; then etag (and crc, its CRC32C if sent) or err is its answer.
type part struct {
	num  int
	buf  []byte
	done chan struct{}
	etag string
	crc  string
	err  error
}

// newUpload starts a multipart upload of key, with CRC32C as its checksum
// algorithm if crc. S3 (AWS, and versitygw once an algorithm is declared)
// wants every part of such an upload to carry that checksum and the
// completion to list them, and refuses a part checksum an upload was not
// created for; minio-go's own PutObject, asked for a checksum, declares
// it the same way.
func (s *Store) newUpload(ctx context.Context, key string, crc bool) (string, error) {
	cctx, cancel := s.call(ctx)
	defer cancel()
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	if crc {
		opts.UserMetadata = map[string]string{"X-Amz-Checksum-Algorithm": minio.ChecksumCRC32C.String()}
	}
	id, err := s.core.NewMultipartUpload(cctx, s.bucket, key, opts)
	return id, classify(cctx, err)
}

// abortUpload ends multipart upload uploadID of key; a missing one is not
// an error.
func (s *Store) abortUpload(ctx context.Context, key, uploadID string) error {
	cctx, cancel := s.call(ctx)
	defer cancel()
	err := s.core.AbortMultipartUpload(cctx, s.bucket, key, uploadID)
	if err != nil && !isNotFound(err) {
		return classify(cctx, err)
	}
	return nil
}

// removeAll deletes every object under prefix.
func (s *Store) removeAll(ctx context.Context, prefix string) error {
	objs, err := s.listObjects(ctx, prefix)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := s.remove(ctx, o.Key); err != nil {
			return err
		}
	}
	return nil
}

// Write appends p. Each part is sent as soon as it is full, in the
// background while the next one fills (see writer); a failed send is
// final (a part is missing), so this or a later Write, Sync or Commit
// returns the error, and only Abort or Close is left.
func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.Usable("write"); err != nil {
		return 0, err
	}
	if w.staged { // the upload is completed: no byte may follow
		return 0, w.life.Refused("write")
	}
	if w.werr != nil {
		return 0, w.werr
	}
	if err := w.landed(); err != nil {
		return 0, w.fail("write", err)
	}
	n := 0
	for len(p) > 0 {
		if w.buf == nil {
			b, err := w.takeBuffer()
			if err != nil {
				return n, w.fail("write", err)
			}
			w.buf = b
		}
		c := min(int(w.s.partSize)-len(w.buf), len(p))
		w.buf = append(w.buf, p[:c]...)
		w.s.usage.buffered.Add(int64(c))
		p, n = p[c:], n+c
		if int64(len(w.buf)) == w.s.partSize {
			if err := w.sendPart(); err != nil {
				return n, w.fail("write", err)
			}
		}
	}
	return n, nil
}

// fail records err as the writer's first failure, for good, and ends the
// parts in flight: the upload misses a part, none of them can help it.
func (w *writer) fail(op string, err error) error {
	w.werr = fmt.Errorf("s3: %s %s: %w", op, w.id, err)
	w.cancel()
	return w.werr
}

// takeBuffer returns an empty part buffer: an idle one, a new one within
// the budget (the writer's first, or one more with a spare token), or
// else the buffer of the oldest part in flight once it is answered.
func (w *writer) takeBuffer() ([]byte, error) {
	for {
		if n := len(w.free); n > 0 {
			b := w.free[n-1]
			w.free = w.free[:n-1]
			return b[:0], nil
		}
		if w.held == 0 || (w.held <= w.s.partsInFlight && w.s.takeSpare()) {
			if w.held > 0 {
				w.spares++
			}
			w.held++
			w.s.partBufs.Add(1)
			return make([]byte, 0, w.s.partSize), nil
		}
		if len(w.sending) == 0 {
			// Unreachable while the counts are right; a writer that
			// waited here would wait for ever.
			return nil, fmt.Errorf("no part buffer: %d held, none idle or in flight", w.held)
		}
		if err := w.awaitOldest(context.Background()); err != nil {
			return nil, err
		}
	}
}

// adoptBuffer makes b (a part buffer of the writer's budget, holding
// bytes below any Write: a resumed tail) the part in progress.
func (w *writer) adoptBuffer(b []byte) {
	w.buf = b
	w.held++
	w.s.partBufs.Add(1)
	w.s.usage.buffered.Add(int64(len(b)))
}

// sendPart hands buf to a goroutine as the next part, after the fence
// (and, for part 1, the head) and once fewer than partsInFlight parts are
// in flight; the next Write takes another buffer.
func (w *writer) sendPart() error {
	num := len(w.parts) + len(w.sending) + 1
	if num > maxParts {
		return fmt.Errorf("the blob needs more than %d parts of %d bytes", maxParts, w.s.partSize)
	}
	ctx := context.Background() // each call below has its own deadline
	for len(w.sending) > 0 && len(w.sending) >= w.s.partsInFlight {
		if err := w.awaitOldest(ctx); err != nil {
			return err
		}
	}
	if err := w.fenced(ctx); err != nil {
		return err
	}
	if num == 1 {
		// The head, readable before the upload completes: a resumed
		// upload re-reads its QCOW2 header (see ReadAt), and S3 serves no
		// byte of a part until the upload is completed.
		if _, err := w.s.putSmall(ctx, w.s.headKey(w.id), w.buf[:min(len(w.buf), headSize)], false); err != nil {
			return w.s.errorf(err, "head of the upload")
		}
	}
	p := &part{num: num, buf: w.buf, done: make(chan struct{})}
	w.sending = append(w.sending, p)
	go w.s.putPart(w.ctx, w.key, w.uploadID, w.crc, p)
	w.base += int64(len(w.buf))
	w.buf = nil
	w.synced = 0
	return nil
}

// putPart uploads p and closes p.done. It touches nothing but p. crc:
// the upload wants each part's CRC32C (writer.crc).
func (s *Store) putPart(ctx context.Context, key, uploadID string, crc bool, p *part) {
	defer close(p.done)
	opts := s.partOptions(p.buf, crc)
	// A bytes.Reader: minio-go streams it (and may seek it back to
	// retry), no copy of the part is made.
	wd := s.watch(ctx)
	res, err := s.core.PutObjectPart(wd.ctx, s.bucket, key, uploadID, p.num,
		sendReader{ReadSeeker: bytes.NewReader(p.buf), w: wd}, int64(len(p.buf)), opts)
	err = wd.err(err)
	wd.stop()
	if err != nil {
		p.err = s.errorf(err, "upload part %d", p.num)
		return
	}
	p.etag, p.crc = res.ETag, opts.CustomHeader.Get(minio.ChecksumCRC32C.Key())
}

// partOptions says how part b is protected on the way (Config.
// PayloadSigning); the server refuses a part whose bytes do not match.
// crc: the upload wants the part's CRC32C. DisableContentSha256 keeps
// minio-go from its streaming signature (a SHA-256 and an HMAC per
// 64 KiB chunk, on both sides; measured here, 256 MiB took 2.2 s
// streaming-signed and 1.8 s signed whole).
func (s *Store) partOptions(b []byte, crc bool) minio.PutObjectPartOptions {
	opts := minio.PutObjectPartOptions{DisableContentSha256: true}
	if crc {
		// Signed with the other headers, so it is the CRC we computed.
		opts.CustomHeader = make(http.Header, 1)
		opts.CustomHeader.Set(minio.ChecksumCRC32C.Key(), minio.ChecksumCRC32C.ChecksumBytes(b).Encoded())
		if s.unsigned {
			// No Sha256Hex: minio-go then sends x-amz-content-sha256:
			// UNSIGNED-PAYLOAD, and the server checks the CRC alone.
			return opts
		}
	}
	// The part's SHA-256 in the signed x-amz-content-sha256 header, in
	// one pass: nobody without the key can alter or cut the part, even
	// over plain http. An upload without a CRC32C (created signed, or
	// restaged) is sent so by every replica, whatever its setting.
	sum := sha256.Sum256(b)
	opts.Sha256Hex = hex.EncodeToString(sum[:])
	return opts
}

// awaitOldest waits for the oldest part in flight (or ctx) and takes its
// answer: the part joins parts, in number order, and its buffer is idle.
func (w *writer) awaitOldest(ctx context.Context) error {
	p := w.sending[0]
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.sending = w.sending[1:]
	return w.took(p)
}

func (w *writer) took(p *part) error {
	n := int64(len(p.buf))
	w.free = append(w.free, p.buf[:0])
	w.s.usage.buffered.Add(-n)
	if p.err != nil {
		w.cut = true
		return p.err
	}
	w.parts = append(w.parts, minio.CompletePart{PartNumber: p.num, ETag: p.etag, ChecksumCRC32C: p.crc})
	w.s.usage.uploaded.Add(n)
	return nil
}

// landed takes the answers of the parts that have one, without waiting:
// the oldest ones in order; a failure of any is returned at once.
func (w *writer) landed() error {
	for len(w.sending) > 0 {
		select {
		case <-w.sending[0].done:
			if err := w.awaitOldest(context.Background()); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	for _, p := range w.sending {
		select {
		case <-p.done:
			if p.err != nil {
				return p.err
			}
		default:
		}
	}
	return nil
}

// drain waits for every part in flight (or ctx).
func (w *writer) drain(ctx context.Context) error {
	for len(w.sending) > 0 {
		if err := w.awaitOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stopParts cancels the parts in flight and waits until their goroutines
// are done; their bytes are given up. A part cut off this way may still
// be finishing on the server; cut records that one was (see Abort).
func (w *writer) stopParts() {
	w.cancel()
	for _, p := range w.sending {
		<-p.done
		w.cut = w.cut || p.err != nil
		w.free = append(w.free, p.buf[:0])
		w.s.usage.buffered.Add(-int64(len(p.buf)))
	}
	w.sending = nil
}

// dropSpares gives the idle buffers that took a spare token back, so
// that a writer between bursts (a Sync: a tus PATCH ended) holds one part
// of memory, as a writer that never got a spare does.
func (w *writer) dropSpares() {
	for w.spares > 0 && len(w.free) > 0 {
		w.free = w.free[:len(w.free)-1]
		w.held--
		w.spares--
		w.s.partBufs.Add(-1)
		w.s.releaseSpare()
	}
}

func (w *writer) written() int64 { return w.base + int64(len(w.buf)) }

// Sync makes every byte written so far durable: the full parts are sent
// already, or in flight and waited for; the bytes short of a part go to the part's tail object, then
// the durable object records the offset. A pause mid-part loses nothing.
// A failed Sync is final, as a failed Write is.
func (w *writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.Usable("sync"); err != nil {
		return err
	}
	if w.werr != nil {
		return w.werr
	}
	if w.staged {
		return nil // the staged object holds every byte
	}
	if err := w.landed(); err != nil {
		return w.fail("sync", err)
	}
	if err := w.sync(); err != nil {
		return w.fail("sync", err)
	}
	return nil
}

func (w *writer) sync() error {
	ctx := context.Background() // each call has its own deadline
	// The parts in flight first: the durable offset below counts them.
	if err := w.drain(ctx); err != nil {
		return err
	}
	w.dropSpares()
	if err := w.fenced(ctx); err != nil {
		return err
	}
	if len(w.buf) > w.synced {
		if _, err := w.s.putSmall(ctx, w.s.tailKey(w.id, len(w.parts)+1), w.buf, false); err != nil {
			return w.s.errorf(err, "tail of part %d", len(w.parts)+1)
		}
		w.s.usage.uploaded.Add(int64(len(w.buf)))
		w.synced = len(w.buf)
	}
	if off := w.written(); off != w.durable {
		if err := w.s.putDurable(ctx, w.id, off); err != nil {
			return err
		}
		w.durable = off
	}
	return nil
}

// putDurable records off as the offset up to which the blob's bytes are
// in S3 (parts and tail).
func (s *Store) putDurable(ctx context.Context, id string, off int64) error {
	if _, err := s.putSmall(ctx, s.durableKey(id), []byte(strconv.FormatInt(off, 10)), false); err != nil {
		return s.errorf(err, "record durable offset")
	}
	return nil
}

// getDurable reads the durable offset; found is false if none was
// recorded (a write that never synced: 0 bytes are durable).
func (s *Store) getDurable(ctx context.Context, id string) (off int64, found bool, err error) {
	ctx, cancel := s.call(ctx)
	defer cancel()
	body, _, _, err := s.core.GetObject(ctx, s.bucket, s.durableKey(id), minio.GetObjectOptions{})
	if isNotFound(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, classify(ctx, err)
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, 32))
	if isNotFound(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, classify(ctx, err)
	}
	off, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || off < 0 {
		return 0, false, fmt.Errorf("durable offset object holds %q", b)
	}
	return off, true, nil
}

// Close ends the writer but keeps the unfinished blob for Resume. Bytes
// since the last Sync are dropped, as a crash would lose them: Resume
// continues at the offset recorded after a Sync. Idempotent, and a no-op
// after Commit or Abort.
func (w *writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.life.Close() {
		return nil
	}
	w.dropBuffers()
	return nil
}

// dropBuffers ends the parts in flight (waiting for them) and gives back
// every part buffer and spare token.
func (w *writer) dropBuffers() {
	w.stopParts()
	w.s.usage.buffered.Add(-int64(len(w.buf)))
	w.buf, w.free = nil, nil
	w.s.partBufs.Add(-int64(w.held))
	for range w.spares {
		w.s.releaseSpare()
	}
	w.held, w.spares = 0, 0
}

// finish completes the multipart upload into the image key: the blob is
// staged, readable, invisible. It refuses (ErrExists) if the id is
// committed: the completion must never replace a committed blob's bytes
// (the completion is conditional too, where the server supports it).
func (w *writer) finish(ctx context.Context) error {
	if w.werr != nil {
		return fmt.Errorf("earlier write or sync failed: %w", w.werr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, found, err := w.s.stat(ctx, w.s.markerKey(w.id))
	if err != nil {
		return w.s.errorf(err, "check marker")
	}
	if found {
		return imagestore.ErrExists
	}
	if err := w.fenced(ctx); err != nil {
		return err
	}
	size := w.written()
	var info minio.UploadInfo
	if size == 0 {
		// S3 completes no upload without parts: an empty blob is a plain
		// empty object.
		w.tried = true
		if info, err = w.s.putSmall(ctx, w.key, nil, true); err != nil {
			if isPreconditionFailed(err) {
				w.tried = false
				return imagestore.ErrExists
			}
			return w.s.errorf(err, "put empty blob")
		}
		if err := w.s.abortUpload(ctx, w.key, w.uploadID); err != nil {
			_ = w.s.remove(ctx, w.key)
			return w.s.errorf(err, "abort the empty upload")
		}
	} else {
		if len(w.buf) > 0 {
			if err := w.sendPart(); err != nil {
				return err
			}
		}
		// The completion lists the parts in number order, all answered.
		if err := w.drain(ctx); err != nil {
			return err
		}
		opts := minio.PutObjectOptions{}
		opts.SetMatchETagExcept("*")
		w.tried = true
		cctx, cancel := w.s.copyCall(ctx, size)
		info, err = w.s.core.CompleteMultipartUpload(cctx, w.s.bucket, w.key, w.uploadID, w.parts, opts)
		err = classify(cctx, err)
		cancel()
		if isPreconditionFailed(err) {
			w.tried = false
			return imagestore.ErrExists
		}
		if err != nil {
			return w.s.errorf(err, "complete upload")
		}
	}
	w.dropBuffers()
	w.staged, w.size, w.etag, w.uploadID = true, size, info.ETag, ""
	return nil
}

// headSize is how much of a blob's start stays readable while it is
// written: the largest QCOW2 cluster, the first of which holds the header
// and its extensions.
const headSize = 2 << 20

// ReadAt reads the blob back. Bytes within the head (headSize, and
// written) are read without ending the write: a resumed upload re-reads
// its header. Any other read is the structure check after the last byte:
// the first such call completes the upload (the blob is staged), so no
// Write may follow; reads are ranged GETs of the staged object. io.EOF is
// returned as is.
func (w *writer) ReadAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.Usable("read"); err != nil {
		return 0, err
	}
	if !w.staged && off >= 0 && off+int64(len(p)) <= min(headSize, w.written()) {
		if w.base == 0 { // still in the first part: the bytes are in buf
			return copy(p, w.buf[off:]), nil
		}
		return w.s.readAt(context.Background(), w.s.headKey(w.id), "", min(headSize, w.written()), p, off)
	}
	if !w.staged {
		if err := w.finish(context.Background()); err != nil {
			w.werr = fmt.Errorf("s3: read %s: %w", w.id, err)
			return 0, w.werr
		}
	}
	return w.s.readAt(context.Background(), w.key, w.etag, w.size, p, off)
}

// readAt is one ranged GET of key (size bytes, with etag) into p.
func (s *Store) readAt(ctx context.Context, key, etag string, size int64, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("s3: read %s: negative offset", key)
	}
	if off >= size {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	n := min(int64(len(p)), size-off)
	wd := s.watch(ctx)
	defer wd.stop()
	body, err := s.rangeGet(wd.ctx, key, etag, off, n)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	got, err := io.ReadFull(recvReader{body, wd}, p[:n])
	if err != nil {
		return got, s.errorf(wd.err(err), "read %s at %d", key, off)
	}
	if n < int64(len(p)) {
		return got, io.EOF
	}
	return got, nil
}

// rangeGet opens bytes [off, off+n) of key (n > 0); etag, if set, must
// still match, so a replaced object is an error, not other bytes.
func (s *Store) rangeGet(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	var opts minio.GetObjectOptions
	opts.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	if etag != "" {
		if err := opts.SetMatchETag(etag); err != nil {
			return nil, err
		}
	}
	body, _, _, err := s.core.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		return nil, s.errorf(classify(ctx, err), "read %s at %d", key, off)
	}
	return body, nil
}

// Commit makes the blob visible: it completes the upload if ReadAt did not
// (the blob is staged), then writes the marker, conditionally. Nothing is
// copied: Commit costs the same for any size. Any failure is final: Abort
// removes what is left. The error wraps ErrExists if the id is committed.
func (w *writer) Commit(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.StartCommit(); err != nil {
		return err
	}
	err := w.commit(ctx)
	if err != nil {
		w.dropBuffers()
	}
	return w.life.EndCommit(err)
}

func (w *writer) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !w.staged {
		if err := w.finish(ctx); err != nil {
			return err
		}
	} else if w.werr != nil {
		return fmt.Errorf("earlier read failed: %w", w.werr)
	}
	if err := w.fenced(ctx); err != nil {
		return err
	}
	if _, err := w.s.putSmall(ctx, w.s.markerKey(w.id), nil, true); err != nil {
		if isPreconditionFailed(err) {
			return imagestore.ErrExists
		}
		return w.s.errorf(err, "write marker")
	}
	defer w.s.usage.invalidate()
	// The tails and durable offset mean nothing now; should removing them
	// fail, RemovePartial at the session's end (or RemovePartials) does.
	_ = w.s.removeAll(ctx, w.s.partialDir(w.id))
	return nil
}

// Abort ends the blob without making it visible and removes its upload,
// its tails and, if staged, its bytes (also after Close). Idempotent, and
// a no-op after a successful Commit, so `defer w.Abort()` is safe.
func (w *writer) Abort() error {
	// Before the lock: a Write waiting for a part in flight holds it, and
	// the part ends sooner cancelled than at its idle deadline.
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.life.AbortNeeded() {
		return nil
	}
	// Every part in flight has ended before the upload is aborted, so
	// that none lands after it.
	w.dropBuffers()
	ctx := context.Background() // each call has its own deadline
	defer w.s.usage.invalidate()
	var errs []error
	if w.uploadID != "" {
		if err := w.s.abortUpload(ctx, w.key, w.uploadID); err != nil {
			errs = append(errs, w.s.errorf(err, "abort upload"))
		} else if err := w.s.abortAgain(ctx, w.key, w.uploadID, w.cut); err != nil {
			errs = append(errs, w.s.errorf(err, "abort upload"))
		} else {
			w.uploadID = ""
		}
	}
	if w.staged || w.tried {
		if err := w.s.removeStaged(ctx, w.id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := w.s.removeAll(ctx, w.s.partialDir(w.id)); err != nil {
		errs = append(errs, w.s.errorf(err, "remove tails"))
	}
	// A failed Abort stays to be done: a retry can finish the job.
	return w.life.EndAbort(errors.Join(errs...))
}

// abortAgain makes sure that upload uploadID of key is gone after its
// abort, if a part request was cut off (cut): S3 says a part being
// uploaded when the upload is aborted may still succeed, and then the
// upload must be aborted again to free its parts.
func (s *Store) abortAgain(ctx context.Context, key, uploadID string, cut bool) error {
	if !cut {
		return nil
	}
	for range 3 {
		_, err := s.parts(ctx, key, uploadID)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.abortUpload(ctx, key, uploadID); err != nil {
			return err
		}
	}
	return fmt.Errorf("upload %s still there after 3 aborts", uploadID)
}

// removeStaged deletes images/<id>.qcow2 unless a marker says it is
// committed (a marker write whose answer was lost, or another writer's).
func (s *Store) removeStaged(ctx context.Context, id string) error {
	_, found, err := s.stat(ctx, s.markerKey(id))
	if err != nil {
		return s.errorf(err, "check marker")
	}
	if found {
		return nil
	}
	if err := s.remove(ctx, s.imageKey(id)); err != nil {
		return s.errorf(err, "remove staged bytes")
	}
	return nil
}
