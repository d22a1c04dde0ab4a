package uploadclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// The tus 1.0.0 client side of the upload, and the control-plane request
// every call here makes. URLs here are capabilities (the ticket's upload
// URL, the session URL): no error message or log line may carry one.

const (
	tusResumable = "1.0.0"
	// shortCall bounds a request without a body to stream.
	shortCall = 30 * time.Second
	// stallTimeout ends a PATCH whose body has not been read for this long:
	// the connection is dead even if TCP has not noticed.
	stallTimeout = 90 * time.Second
	// answerLimit caps what is read of an answer's body.
	answerLimit = 4 << 20
)

// uploadClient talks to the control and data planes.
type uploadClient struct {
	hc *http.Client
}

func newUploadClient() *uploadClient {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ExpectContinueTimeout: 2 * time.Second,
		// After the last byte the edge checks the whole image and makes
		// it durable before it answers.
		ResponseHeaderTimeout: 5 * time.Minute,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
	}
	return &uploadClient{hc: &http.Client{Transport: tr, CheckRedirect: noRedirect}}
}

// clientFor is an uploadClient on hc (nil: newUploadClient's), which
// never follows a redirect whatever hc says.
func clientFor(hc *http.Client) *uploadClient {
	if hc == nil {
		return newUploadClient()
	}
	c := *hc
	c.CheckRedirect = noRedirect
	return &uploadClient{hc: &c}
}

// noRedirect: a redirect would resend a capability somewhere else.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// apiError is an answer other than the one asked for.
type apiError struct {
	Status     int
	Reason     string // the error body's reason code, if any
	Msg        string // the error body's sentence, if any
	RetryAfter time.Duration
	Offset     int64 // the answer's Upload-Offset; -1 if none
}

func (e *apiError) Error() string {
	msg := e.Msg
	if msg == "" {
		msg = "the answer was " + http.StatusText(e.Status)
	}
	if e.Reason != "" {
		return fmt.Sprintf("%s (%d %s)", msg, e.Status, e.Reason)
	}
	return fmt.Sprintf("%s (%d)", msg, e.Status)
}

// is reports whether the answer is the table's entry r: its status and
// its reason code. The edge answers from that table, so the client keys
// its decisions on the same entries, never on a name written again here.
func (e *apiError) is(r reason.Code) bool {
	return e.Status == r.Status() && e.Reason == r.Name()
}

// transientError is a request that failed on the way: no answer.
type transientError struct{ msg string }

func (e *transientError) Error() string { return e.msg }

var secretShape = regexp.MustCompile(`[0-9a-fA-F]{64}`)

// scrub hides anything capability-shaped in a text from the network.
func scrub(s string) string { return secretShape.ReplaceAllString(s, "…") }

// netFailure turns a failed round trip into a transientError whose text
// names no URL.
func netFailure(err error, cause error) error {
	if cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &transientError{"timed out"}
	}
	return &transientError{scrub(err.Error())}
}

// isTransient: worth a retry (no answer, or the edge asked to come back).
func isTransient(err error) bool {
	var te *transientError
	if errors.As(err, &te) {
		return true
	}
	var ae *apiError
	if errors.As(err, &ae) {
		switch ae.Status {
		case http.StatusRequestTimeout, http.StatusLocked, http.StatusTooEarly, http.StatusTooManyRequests,
			http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
	}
	return false
}

// retryAfter is the wait an answer asked for, if any.
func retryAfter(err error) time.Duration {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.RetryAfter
	}
	return 0
}

// answerError reads a failure answer: the JSON error shape if it is one.
func answerError(resp *http.Response) *apiError {
	e := &apiError{Status: resp.StatusCode, Offset: -1}
	if v := resp.Header.Get("Upload-Offset"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			e.Offset = n
		}
	}
	if v := resp.Header.Get("Retry-After"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		} else if t, err := http.ParseTime(v); err == nil {
			e.RetryAfter = max(time.Until(t), 0)
		}
	}
	var body struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, answerLimit))
	if json.Unmarshal(b, &body) == nil {
		e.Msg, e.Reason = scrub(strings.TrimSpace(body.Error)), scrub(body.Reason)
	}
	return e
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, answerLimit))
	resp.Body.Close()
}

// ticket is the control plane's answer to a ticket request.
type ticket struct {
	Ticket    string    `json:"ticket"`
	UploadID  string    `json:"upload_id"`
	UploadURL string    `json:"upload_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// controlCall POSTs a JSON body to a control-plane route with the token.
func (c *uploadClient) controlCall(ctx context.Context, control, path, token string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, control+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, netFailure(err, context.Cause(ctx))
	}
	return resp, nil
}

// ticket asks the control plane for a single-use upload ticket.
func (c *uploadClient) ticket(ctx context.Context, control, token, name string, efi bool) (ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	resp, err := c.controlCall(ctx, control, "/market/vm-images/ticket", token, map[string]any{"name": name, "efi": efi})
	if err != nil {
		return ticket{}, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusCreated {
		return ticket{}, answerError(resp)
	}
	var tk ticket
	if err := json.NewDecoder(io.LimitReader(resp.Body, answerLimit)).Decode(&tk); err != nil {
		return ticket{}, netFailure(fmt.Errorf("reading the ticket: %w", err), nil)
	}
	if _, err := baseurl.Parse(tk.UploadURL); err != nil || tk.UploadID == "" {
		return ticket{}, &apiError{Status: resp.StatusCode, Msg: "the control plane's ticket has no usable upload URL or upload id", Offset: -1}
	}
	return tk, nil
}

// create is tus creation: POST on the upload URL with Upload-Length and no
// body. It returns the session's URL.
func (c *uploadClient) create(ctx context.Context, uploadURL string, size int64) (*url.URL, error) {
	base, err := url.Parse(uploadURL)
	if err != nil {
		return nil, errors.New("the ticket's upload URL does not parse")
	}
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, uploadURL, nil)
	if err != nil {
		return nil, errors.New("the ticket's upload URL is not usable")
	}
	req.Header.Set("Tus-Resumable", tusResumable)
	req.Header.Set("Upload-Length", strconv.FormatInt(size, 10))
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, netFailure(err, context.Cause(ctx))
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusCreated {
		return nil, answerError(resp)
	}
	loc, err := base.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" || (loc.Scheme != "http" && loc.Scheme != "https") || loc.Host == "" {
		return nil, &apiError{Status: resp.StatusCode, Msg: "the edge created an upload session without a usable Location", Offset: -1}
	}
	return loc, nil
}

// head is tus HEAD: how many bytes the edge has, of how many.
func (c *uploadClient) head(ctx context.Context, loc *url.URL) (offset, length int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, loc.String(), nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Tus-Resumable", tusResumable)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, 0, netFailure(err, context.Cause(ctx))
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return 0, 0, answerError(resp) // a HEAD answer has no body: status only
	}
	offset, oerr := strconv.ParseInt(resp.Header.Get("Upload-Offset"), 10, 64)
	length, lerr := strconv.ParseInt(resp.Header.Get("Upload-Length"), 10, 64)
	if oerr != nil || lerr != nil || offset < 0 || offset > length {
		return 0, 0, &apiError{Status: resp.StatusCode, Msg: "the edge's answer to HEAD lacks a valid Upload-Offset and Upload-Length", Offset: -1}
	}
	return offset, length, nil
}

// patch is tus PATCH: the file from off to its end, streamed from disk.
// onSent sees every chunk handed to the connection, with its file offset.
// It returns the edge's new offset, -1 if the answer did not say.
func (c *uploadClient) patch(ctx context.Context, loc *url.URL, f *os.File, off, size int64, onSent func([]byte, int64)) (int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	body := &sendReader{r: io.NewSectionReader(f, off, size-off), at: off, onSent: onSent}
	body.touch()
	stopWatch := body.watch(cancel)
	defer stopWatch()
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, loc.String(), body)
	if err != nil {
		return -1, err
	}
	req.ContentLength = size - off
	req.Header.Set("Tus-Resumable", tusResumable)
	req.Header.Set("Content-Type", "application/offset+octet-stream")
	req.Header.Set("Upload-Offset", strconv.FormatInt(off, 10))
	// The edge answers refusals it can decide before the body (a wrong
	// offset, busy, locked) without our sending a byte.
	req.Header.Set("Expect", "100-continue")
	resp, err := c.hc.Do(req)
	body.detach() // the transport may still read it after Do returns
	if err != nil {
		return -1, netFailure(err, context.Cause(ctx))
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return -1, answerError(resp)
	}
	n, err := strconv.ParseInt(resp.Header.Get("Upload-Offset"), 10, 64)
	if err != nil || n < 0 || n > size {
		return -1, nil
	}
	return n, nil
}

// terminate is tus termination, best effort: the edge frees the partial
// upload now instead of when the session expires.
func (c *uploadClient) terminate(ctx context.Context, sess *session) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, sess.url.String(), nil)
	if err != nil {
		return
	}
	req.Header.Set("Tus-Resumable", tusResumable)
	if resp, err := c.hc.Do(req); err == nil {
		drain(resp)
	}
}

// sendReader is a PATCH body: it reports what the transport takes, notices
// a stalled connection, and stops feeding anyone once detached.
type sendReader struct {
	mu       sync.Mutex
	r        io.Reader
	at       int64 // file offset of the next byte
	onSent   func([]byte, int64)
	dead     bool
	lastRead atomic.Int64 // unix nanoseconds
	finished atomic.Bool  // the whole body was read
}

var errStalled = fmt.Errorf("no byte could be sent for %v", stallTimeout)

func (s *sendReader) touch() { s.lastRead.Store(time.Now().UnixNano()) }

func (s *sendReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, errors.New("request over")
	}
	n, err := s.r.Read(p)
	if n > 0 {
		s.onSent(p[:n], s.at)
		s.at += int64(n)
	}
	if err == io.EOF {
		s.finished.Store(true)
	}
	s.touch()
	return n, err
}

func (s *sendReader) detach() {
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
}

// watch cancels the request when the body stalls (before it was all read;
// after that ResponseHeaderTimeout bounds the wait).
func (s *sendReader) watch(cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if !s.finished.Load() && now.Sub(time.Unix(0, s.lastRead.Load())) > stallTimeout {
					cancel(errStalled)
					return
				}
			}
		}
	}()
	return func() { close(done) }
}
