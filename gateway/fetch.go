package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// handleFetch is GET|HEAD /market/vm-images/fetch/{token} and, with the
// token in Authorization, /market/vm-images/fetch/{upload_id} (see
// fetchCapability): what CDI's importer (nbdkit curl, qemu-img's http
// driver) reads images with. It needs Content-Length, Accept-Ranges and
// exact 206 answers to its range reads.
func (g *Gateway) handleFetch(ctx *fasthttp.RequestCtx, last string) {
	start := g.cfg.Now()
	fc, aerr := fetchCapabilityOf(ctx, last)
	var img imagestore.Image
	var blob imagestore.Blob
	if aerr == nil {
		img, blob, aerr = g.openForToken(ctx, fc, start)
	}
	if aerr != nil {
		g.refused(dirFetch, aerr)
		writeError(ctx, aerr)
		return
	}
	imageHeaders(&ctx.Response.Header, img)
	part, ok := g.choosePart(ctx, blob, img)
	if !ok {
		return
	}
	// HEAD holds no slot: it moves no image bytes. fasthttp writes the
	// headers of a body stream for HEAD and closes it without reading.
	if ctx.IsHead() {
		ctx.SetStatusCode(part.status)
		ctx.SetBodyStream(&fetchStream{g: g, ctx: ctx, src: eofReader{}, size: part.n, blob: blob}, int(part.n))
		return
	}
	g.sendPart(ctx, fc.token, img, blob, part, start)
}

// The names and fixed values of the headers every fetch answer carries,
// already canonical: a small range read sets them per request, and
// fasthttp's Set would copy and normalise each name every time.
var (
	hdrAcceptRanges = []byte("Accept-Ranges")
	hdrETag         = []byte("ETag")
	hdrLastModified = []byte("Last-Modified")
	hdrCacheControl = []byte("Cache-Control")
	valBytes        = []byte("bytes")
	valCacheControl = []byte("private, no-transform")
	valOctetStream  = []byte("application/octet-stream")
)

// imageHeaders sets the headers every answer about img carries.
func imageHeaders(h *fasthttp.ResponseHeader, img imagestore.Image) {
	h.SetCanonical(hdrAcceptRanges, valBytes)
	var etag [2 + 64]byte // a quoted SHA-256 in hex
	h.SetCanonical(hdrETag, append(append(append(etag[:0], '"'), img.SHA256...), '"'))
	var date [len(http.TimeFormat)]byte
	h.SetCanonical(hdrLastModified, fasthttp.AppendHTTPDate(date[:0], img.CreatedAt))
	h.SetCanonical(hdrCacheControl, valCacheControl)
	h.SetContentTypeBytes(valOctetStream)
}

// etagOf is img's ETag, as imageHeaders sends it.
func etagOf(img imagestore.Image) string { return `"` + img.SHA256 + `"` }

// fetchPart is the part of the image an answer sends: n bytes from off,
// with status 200 (the whole image) or 206.
type fetchPart struct {
	off, n int64
	status int
}

// choosePart reads If-None-Match, Range and If-Range into the part to
// send. When they decide the answer themselves (304, 416) it answers,
// closes blob and returns false.
func (g *Gateway) choosePart(ctx *fasthttp.RequestCtx, blob imagestore.Blob, img imagestore.Image) (fetchPart, bool) {
	size := blob.Size()
	if noneMatch(ctx, etagOf(img)) {
		blob.Close()
		ctx.SetStatusCode(fasthttp.StatusNotModified)
		return fetchPart{}, false
	}
	whole := fetchPart{off: 0, n: size, status: fasthttp.StatusOK}
	rng := string(ctx.Request.Header.Peek("Range"))
	if rng == "" || !g.ifRange(ctx, img) {
		return whole, true
	}
	off, n, ok, satisfiable := parseRange(rng, size)
	switch {
	case ok && !satisfiable:
		blob.Close()
		aerr := apierr.New(reason.RangeNotSatisfiable).
			WithHeader("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		g.refused(dirFetch, aerr)
		writeError(ctx, aerr)
		return fetchPart{}, false
	case ok:
		ctx.Response.Header.Set("Content-Range", "bytes "+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+n-1, 10)+"/"+strconv.FormatInt(size, 10))
		return fetchPart{off: off, n: n, status: fasthttp.StatusPartialContent}, true
	}
	return whole, true // a form we do not serve (several ranges): the whole image, as RFC 9110 allows
}

// sendPart sends a GET's part once it shares its token's slot or got one
// after a (bounded) wait. blob is closed, or handed to the body stream.
func (g *Gateway) sendPart(ctx *fasthttp.RequestCtx, token string, img imagestore.Image, blob imagestore.Blob, part fetchPart, start time.Time) {
	release, aerr := g.acquireFetchSlot(ctx, token)
	if aerr != nil {
		blob.Close()
		g.refused(dirFetch, aerr)
		writeError(ctx, aerr)
		return
	}
	inFlight := g.metrics.fetch.inFlight
	inFlight.Inc()
	partial := part.status == fasthttp.StatusPartialContent
	if part.n <= smallRange {
		// pread from the shared blob straight into the server's write
		// buffer, behind the headers: one write for the whole answer.
		ctx.SetStatusCode(part.status)
		ctx.SetBodyStream(&fetchStream{
			g: g, ctx: ctx, src: io.NewSectionReader(blob, part.off, part.n), size: part.n, blob: blob, release: release,
			start: start, uploadID: img.UploadID, remoteOf: ctx, partial: partial, small: true,
		}, int(part.n))
		return
	}
	// The shared blob must not be seeked: sendfile(2) reads from the
	// file offset, so a large transfer opens the file for itself.
	octx, cancel := g.blobOp()
	own, err := g.blobs.Open(octx, img.UploadID)
	cancel()
	blob.Close()
	var src io.Reader
	if err == nil {
		if src, err = own.Section(part.off, part.n); err != nil {
			own.Close()
		}
	}
	if err != nil {
		release()
		inFlight.Dec()
		aerr := storageFailure(err, "could not read the image")
		g.refused(dirFetch, aerr)
		writeError(ctx, aerr)
		return
	}
	ctx.SetStatusCode(part.status)
	ctx.SetBodyStream(&fetchStream{
		g: g, ctx: ctx, src: src, size: part.n, blob: own, release: release,
		start: start, uploadID: img.UploadID, remote: g.clientAddr(ctx), partial: partial,
	}, int(part.n))
}

// smallRange is the largest answer read from the blob kept open for the
// image (see openBlobs) into the server's write buffer, and sent with its
// headers in one write; the write buffer is sized for it. Importers read
// in ranges of this size or less. Above it, sendfile(2) saves the copy.
const smallRange = 128 << 10

// openForToken resolves a fetch token to its image and opens the bytes.
func (g *Gateway) openForToken(ctx *fasthttp.RequestCtx, fc fetchCapability, now time.Time) (imagestore.Image, imagestore.Blob, *apierr.Error) {
	// The limiter is asked only once the token missed: a valid token is
	// always served, whoever else guessed from the same address.
	unknown := func() *apierr.Error {
		if !g.misses.miss(g.clientAddr(ctx), now) {
			return g.tooManyMisses()
		}
		return apierr.New(reason.TokenUnknown)
	}
	if !isSecretShape(fc.token) {
		return imagestore.Image{}, nil, unknown()
	}
	octx, cancel := g.op()
	defer cancel()
	img, _, err := g.store.ImageForToken(octx, imagestore.HashSecret(fc.token), now)
	if errors.Is(err, imagestore.ErrNotFound) {
		return imagestore.Image{}, nil, unknown()
	}
	if err != nil {
		return imagestore.Image{}, nil, storeFailure(err, "could not look the token up")
	}
	// The header form names its image: a token of another image is as
	// useless there as an unknown one, and answered (and counted) alike.
	// Upload ids are names, not secrets: a plain compare is right.
	if fc.uploadID != "" && img.UploadID != fc.uploadID {
		return imagestore.Image{}, nil, unknown()
	}
	bctx, bcancel := g.blobOp()
	defer bcancel()
	blob, err := g.open.get(bctx, img.UploadID)
	if err != nil {
		// A record without its file is our fault, never the client's.
		return imagestore.Image{}, nil, storageFailure(err, "could not open the image")
	}
	return img, blob, nil
}

// ifRange reports whether a Range header is to be honoured: always without
// If-Range, else only if If-Range names the current image (strong ETag or
// the exact Last-Modified date).
func (g *Gateway) ifRange(ctx *fasthttp.RequestCtx, img imagestore.Image) bool {
	ir := string(ctx.Request.Header.Peek("If-Range"))
	if ir == "" {
		return true
	}
	if strings.HasPrefix(ir, `"`) {
		return ir == etagOf(img)
	}
	modified := img.CreatedAt
	t, err := http.ParseTime(ir)
	return err == nil && t.Equal(modified.UTC().Truncate(time.Second)) && modified.Equal(modified.Truncate(time.Second))
}

// noneMatch reports whether the request's If-None-Match names etag. The
// header is a list, which may come in several lines (RFC 9110 5.3): every
// line is read, as a proxy that joined them would.
func noneMatch(ctx *fasthttp.RequestCtx, etag string) bool {
	if len(ctx.Request.Header.Peek("If-None-Match")) == 0 {
		return false
	}
	for _, line := range ctx.Request.Header.PeekAll("If-None-Match") {
		if etagMatches(string(line), etag) {
			return true
		}
	}
	return false
}

// etagMatches checks an If-None-Match list (weak comparison, RFC 9110 13.1.2).
func etagMatches(list, etag string) bool {
	for _, t := range strings.Split(list, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}

// parseRange reads a single "bytes=" range (the unit in any case) against
// size. ok is false for a header to be ignored (not bytes, malformed,
// several ranges); satisfiable is false for a well-formed range that lies
// outside the image. Positions beyond int64 are clipped like any other
// position past the end.
func parseRange(h string, size int64) (off, n int64, ok, satisfiable bool) {
	if len(h) < len("bytes=") || !strings.EqualFold(h[:len("bytes=")], "bytes=") {
		return 0, 0, false, false
	}
	spec := h[len("bytes="):]
	if strings.Contains(spec, ",") {
		return 0, 0, false, false
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false, false
	}
	if first == "" { // suffix: the last N bytes
		sfx, ok := rangePos(last)
		if !ok {
			return 0, 0, false, false
		}
		if sfx == 0 || size == 0 {
			return 0, 0, true, false
		}
		sfx = min(sfx, size)
		return size - sfx, sfx, true, true
	}
	a, ok := rangePos(first)
	if !ok {
		return 0, 0, false, false
	}
	b := size - 1
	if last != "" {
		if b, ok = rangePos(last); !ok || b < a {
			return 0, 0, false, false
		}
		b = min(b, size-1)
	}
	if a >= size {
		return 0, 0, true, false
	}
	return a, b - a + 1, true, true
}

// rangePos reads a position of a Range: ASCII digits only, saturating at
// the largest int64.
func rangePos(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var v int64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		if v > (math.MaxInt64-int64(c-'0'))/10 {
			v = math.MaxInt64
			continue
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// fetchStream is the body of a fetch. fasthttp calls WriteTo; it sends the
// image in chunks with sendfile(2), moving the write deadline on before
// each, and Close gives the slot back after the last byte (or the error).
type fetchStream struct {
	g        *Gateway
	ctx      *fasthttp.RequestCtx
	src      io.Reader
	size     int64
	blob     imagestore.Blob
	release  func() // nil for HEAD
	start    time.Time
	uploadID string
	remote   string
	// remoteOf, if set, is the request the remote address is taken from
	// when the line is logged: a range read is logged at Debug, rarely
	// enabled, and the address costs more than the read.
	remoteOf *fasthttp.RequestCtx
	sent     int64
	partial  bool // a 206 answer
	// small: the whole answer leaves in one write of the server's buffer,
	// under the write deadline fasthttp sets for it (Server.WriteTimeout);
	// moving it per read would only cost timer resets.
	small bool
	once  sync.Once
}

const (
	minChunk = 256 << 10
	maxChunk = 64 << 20
)

// WriteTo sends the section in chunks, each with its own write deadline
// one idle timeout away (see nextChunk), so a slow reader that is still
// reading never times out and a fast one costs few deadline moves.
func (s *fetchStream) WriteTo(w io.Writer) (int64, error) {
	lr, ok := s.src.(*io.LimitedReader)
	if !ok {
		// A small answer (or a Blobs whose sections are not files): plain
		// reads, each with its deadline unless the answer is small.
		// fasthttp's writer reads them into its own buffer, no copy
		// between.
		if rf, ok := w.(io.ReaderFrom); ok {
			return rf.ReadFrom(struct{ io.Reader }{s})
		}
		return io.Copy(w, struct{ io.Reader }{s})
	}
	chunk := int64(minChunk)
	var total int64
	sent := s.g.metrics.fetch.bytes
	for lr.N > 0 {
		c := min(chunk, lr.N)
		t0 := s.g.cfg.Now()
		if err := s.ctx.SetWriteDeadline(t0.Add(s.g.cfg.IdleTimeout)); err != nil {
			return total, err
		}
		// A LimitedReader straight around the *os.File is what fasthttp
		// and net.TCPConn unwrap to use sendfile.
		n, err := io.Copy(w, &io.LimitedReader{R: lr.R, N: c})
		lr.N -= n
		total += n
		s.sent += n
		sent.Add(float64(n))
		if err != nil {
			return total, err
		}
		if n < c {
			return total, io.ErrUnexpectedEOF
		}
		chunk = nextChunk(c, s.g.cfg.Now().Sub(t0), s.g.cfg.IdleTimeout)
	}
	return total, nil
}

// nextChunk sizes the chunk after one of n bytes that took el: at the
// rate that one went, it takes at most 1/16 of the idle timeout, so a
// client that stops reading mid-chunk is cut after 94..100% of it; and it
// is at most twice the last one. The doubling is what keeps a slow client
// alive: a chunk that fits into the sockets' buffers seems to go at once,
// and sizing the next one by that rate alone gave a client reading 1 MB/s
// a 64 MiB chunk it could not take within the deadline (CI saw it cut).
func nextChunk(n int64, el, idle time.Duration) int64 {
	next := 2 * n
	if el > 0 {
		next = min(next, int64(float64(n)/el.Seconds()*(idle/16).Seconds()))
	}
	return min(max(next, minChunk), maxChunk)
}

func (s *fetchStream) remoteAddr() string {
	if s.remoteOf != nil {
		return s.g.clientAddr(s.remoteOf)
	}
	return s.remote
}

// Read lets fasthttp fall back to plain reads; WriteTo is the fast path.
func (s *fetchStream) Read(p []byte) (int, error) {
	if !s.small {
		if err := s.ctx.SetWriteDeadline(s.g.cfg.Now().Add(s.g.cfg.IdleTimeout)); err != nil {
			return 0, err
		}
	}
	n, err := s.src.Read(p)
	s.sent += int64(n)
	s.g.metrics.fetch.bytes.Add(float64(n))
	return n, err
}

// CloseWithError is called by fasthttp once the body is written or has
// failed; the handler returned long before.
func (s *fetchStream) CloseWithError(err error) error {
	s.once.Do(func() {
		s.blob.Close()
		if s.release == nil { // HEAD
			s.g.metrics.fetch.ok.Inc()
			return
		}
		// The slot goes back last, when everything about this fetch is
		// counted.
		defer s.release()
		s.g.fetchDone(s.start, s.uploadID, s.remoteAddr, s.sent, s.size, s.partial, err)
	})
	return nil
}

// fetchDone counts and logs a GET that held a slot: sent of size bytes,
// err from the read or the write. remote gives the client's address; it is
// asked only if the line is logged.
func (g *Gateway) fetchDone(start time.Time, uploadID string, remote func() string, sent, size int64, partial bool, err error) {
	m := &g.metrics.fetch
	m.inFlight.Dec()
	secs := g.cfg.Now().Sub(start).Seconds()
	m.duration.Observe(secs)
	outcome := outcomeOK
	if err != nil || sent != size {
		outcome = outcomeAborted
		m.aborted.Inc()
	} else {
		m.ok.Inc()
	}
	// Importers read an image in thousands of small ranges: one line each
	// at Info would drown the log, so ranges log at Debug.
	level := slog.LevelInfo
	if partial {
		level = slog.LevelDebug
	}
	if !g.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []any{"upload_id", uploadID, "outcome", outcome, "bytes", sent, "of", size, "seconds", secs, "remote", remote()}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	g.log.Log(context.Background(), level, "fetch", attrs...)
}
