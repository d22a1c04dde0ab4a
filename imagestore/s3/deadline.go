package s3

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Deadlines. A server that hangs (it accepts the connection, then never
// answers) must cost a request seconds, never its whole life: every call
// has a deadline suited to it.
//
//   - A call that moves no image bytes (HEAD, DELETE, a marker or offset
//     PUT, a listing page, the start or abort of a multipart upload) has
//     CallTimeout for all its tries.
//   - A call that moves image bytes (a part, a tail, a ranged GET) has no
//     deadline of its own, since its length and the link set how long it
//     takes: it fails once no byte has moved for IdleTimeout while it was
//     sending or the caller was waiting to read.
//   - A call whose server works through image bytes before it answers
//     (completing an upload, copying a blob) has CallTimeout plus the time
//     the bytes take at serverCopyRate.
//
// Below those, the transport gives up on a connection not made within
// dialTimeout, a TLS handshake not done within tlsTimeout and an answer
// whose headers did not follow the request within headerTimeout.
const (
	DefaultCallTimeout = 10 * time.Second
	DefaultIdleTimeout = 15 * time.Second
	// serverCopyRate is a slow disk's copy rate: a posix-backed S3 server
	// copies the parts into one file before it answers the completion.
	serverCopyRate = 32 << 20 // bytes per second
	dialTimeout    = 5 * time.Second
	tlsTimeout     = 5 * time.Second
	headerTimeout  = time.Minute
)

// ErrNoAnswer is a call the server did not answer within its deadline, or
// a transfer that made no progress within the idle timeout. It is an
// imagestore.ErrBlobsUnavailable (errors.Is), so that the planes answer it
// as the storage's passing outage, not as their own failure.
var ErrNoAnswer error = errNoAnswer{}

type errNoAnswer struct{}

func (errNoAnswer) Error() string { return "the S3 server did not answer in time" }

func (errNoAnswer) Is(target error) bool { return target == imagestore.ErrBlobsUnavailable }

// ErrUnreachable is a call the S3 server could not take: the connection
// was refused or reset, the endpoint's name did not resolve, TLS failed,
// the answer broke off, or the server answered with a failure of its own
// (a 5xx, 503 SlowDown included). Like ErrNoAnswer it is an
// imagestore.ErrBlobsUnavailable: the storage's passing outage, which a
// client may retry, never a fault of vmshelf's.
var ErrUnreachable error = errUnreachable{}

type errUnreachable struct{}

func (errUnreachable) Error() string { return "the S3 server could not be reached" }

func (errUnreachable) Is(target error) bool { return target == imagestore.ErrBlobsUnavailable }

// transport is minio-go's default transport (connection pool, no gzip
// decoding, TLS 1.2 or later) with shorter dial and TLS handshake bounds,
// trusting roots if set.
func transport(secure bool, roots *x509.CertPool) (http.RoundTripper, error) {
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	if roots != nil && tr.TLSClientConfig != nil {
		tr.TLSClientConfig.RootCAs = roots
	}
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = tlsTimeout
	tr.ResponseHeaderTimeout = headerTimeout
	return tr, nil
}

// call bounds one call that moves no image bytes, its retries included.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, s.callTimeout, fmt.Errorf("%w within %v", ErrNoAnswer, s.callTimeout))
}

// copyCall bounds a call whose server works through n bytes before it
// answers.
func (s *Store) copyCall(ctx context.Context, n int64) (context.Context, context.CancelFunc) {
	d := s.callTimeout + time.Duration(n/serverCopyRate)*time.Second
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("%w within %v", ErrNoAnswer, d))
}

// classify makes an error of a call to the server tell what it was, for
// callers that ask with errors.Is: the server's disk full
// (imagestore.ErrNoSpace: the gateway answers 507, as for a full local
// disk), ctx's deadline or stall (ErrNoAnswer: minio-go reports a
// cancelled request as "context canceled", which names nothing), or a
// server that could not be reached or failed (ErrUnreachable). Every S3
// call's error passes here, so that this is the one place that decides
// what is the storage's outage and what is ours.
func classify(ctx context.Context, err error) error {
	if isFull(err) && !errors.Is(err, imagestore.ErrNoSpace) {
		return fmt.Errorf("%w: %w", imagestore.ErrNoSpace, err)
	}
	if err == nil || errors.Is(err, imagestore.ErrBlobsUnavailable) {
		return err
	}
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrNoAnswer) {
			return fmt.Errorf("%w (%v)", cause, err)
		}
	}
	if isUnreachable(err) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

// isUnreachable is an error that says the server could not be asked or
// could not answer, rather than that it refused the request: no HTTP
// answer at all (minio-go's *url.Error: refused, reset, DNS, TLS, a
// transport timeout), a connection that failed while a body moved, an
// answer cut short, or a 5xx of the server's own. A 501 (the server lacks
// a feature) and a 4xx (a denied or malformed request) are not passing,
// and a context the caller ended is the caller's business.
func isUnreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch resp.Code {
		case "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout":
			return true
		}
		return resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented
	}
	var (
		urlErr *url.Error
		netErr net.Error
	)
	return errors.As(err, &urlErr) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF)
}

// watchdog cancels its context once no progress was reported for idle
// while it is armed: a transfer of image bytes to or from a server that
// stopped answering.
type watchdog struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

// watch returns an armed watchdog over ctx; stop releases it.
func (s *Store) watch(ctx context.Context) *watchdog {
	w := &watchdog{idle: s.idleTimeout}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	stalled := fmt.Errorf("%w: no byte moved for %v", ErrNoAnswer, w.idle)
	w.timer = time.AfterFunc(w.idle, func() { w.cancel(stalled) })
	return w
}

// progress re-arms the watchdog: bytes moved.
func (w *watchdog) progress() { w.timer.Reset(w.idle) }

// pause disarms it while the caller, not the server, holds up the
// transfer (a fetch whose client reads slowly).
func (w *watchdog) pause() { w.timer.Stop() }

func (w *watchdog) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// err is classify for the watchdog's context.
func (w *watchdog) err(err error) error { return classify(w.ctx, err) }

// sendReader is a request body that tells its watchdog of every byte the
// transport takes: a server that stops reading stalls it. It keeps
// Seek, so that minio-go can rewind it to retry.
type sendReader struct {
	io.ReadSeeker
	w *watchdog
}

func (r sendReader) Read(p []byte) (int, error) {
	n, err := r.ReadSeeker.Read(p)
	if n > 0 {
		r.w.progress()
	}
	return n, err
}

// recvReader is a response body that re-arms its watchdog with every
// byte that arrives.
type recvReader struct {
	io.Reader
	w *watchdog
}

func (r recvReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	if n > 0 {
		r.w.progress()
	}
	return n, err
}

// isFull is the server refusing a write because its storage is full:
// 507 Insufficient Storage, which versitygw answers with the code
// InsufficientStorage and MinIO with XMinioStorageFull.
func isFull(err error) bool {
	if err == nil {
		return false
	}
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case "InsufficientStorage", "XMinioStorageFull":
		return true
	}
	return r.StatusCode == http.StatusInsufficientStorage
}
