// Package uploadclient is a box's client of the edge: the resumable tus
// 1.0.0 upload behind 'vmshelf upload', and the control-plane calls a
// tenant's command line makes besides (its image list, removing an image).
//
// It is its own package because the upload is most of what a box runs
// against the edge and has rules of its own: it checks the image locally
// first (qcow2, the gateway's checks), streams from the file
// without holding it in memory, keeps its progress in FILE.vmshelf-upload
// (mode 0600: the session's URL is a capability) so that a rerun resumes
// where the edge stopped storing, retries what may pass (no answer, busy,
// restarting) with backoff and Retry-After, and compares the stored
// image's SHA-256 with the file's at the end. The Machines page has its own
// uploader in JavaScript (market/web); the two meet the same routes.
//
// Errors say what happened in words and never carry a secret (the token,
// a ticket, a session URL). Their types tell the caller what to do next:
// *RefusedError (the same call would be refused again), *StoppedError
// (stopped by something that may pass: run it again, an upload resumes),
// *FileError (the local file or its state file stands in the way).
package uploadclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// Config is one upload.
type Config struct {
	// Control is the control plane and the tenant's token.
	Control
	// Name and EFI are the image's, as the ticket asks for them.
	Name string
	EFI  bool
	// Retries is the number of attempts after a failure that may pass
	// before Upload gives up with a *StoppedError; it starts again
	// whenever bytes got through.
	Retries int
	// MaxVirtual is the largest virtual disk size the local check
	// accepts, in bytes.
	MaxVirtual uint64
	// Progress gets the progress (a line redrawn in place on a terminal,
	// a line every 10 % or 5 s otherwise) and what the upload has to say
	// (retries, resuming); nil: nothing is shown.
	Progress io.Writer
}

// Upload checks file, takes a ticket and uploads it resumably, resuming the
// session of an earlier run that FILE.vmshelf-upload (next to file, named
// after file.Name()) records. It returns the stored image, once its SHA-256
// is the file's; the state file is gone then. While it runs the file is
// locked against a second Upload of it.
func Upload(ctx context.Context, cfg Config, file *os.File) (Image, error) {
	path := file.Name()
	fi, err := file.Stat()
	if err != nil {
		return Image{}, fileErrorf("cannot read %s: %v", path, unwrapPath(err))
	}
	if !fi.Mode().IsRegular() {
		return Image{}, fileErrorf("%s is not a regular file", path)
	}
	// Two uploads of one file would fight over one session.
	if err := syscall.Flock(int(file.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return Image{}, fileErrorf("another vmshelf upload of %s is running", path)
	}
	defer func() { _ = syscall.Flock(int(file.Fd()), syscall.LOCK_UN) }()
	if err := checkImage(file, path, fi.Size(), cfg.MaxVirtual); err != nil {
		return Image{}, err
	}
	stderr := cfg.Progress
	if stderr == nil {
		stderr = io.Discard
	}
	u := &uploader{
		cfg:       cfg,
		path:      path,
		file:      file,
		size:      fi.Size(),
		mtime:     fi.ModTime(),
		statePath: path + stateSuffix,
		client:    clientFor(cfg.HTTPClient),
		stderr:    stderr,
		prog:      newProgress(stderr, fi.Size()),
		sleep:     sleepCtx,
		hash:      newFileHash(file),
	}
	img, err := u.run(ctx)
	u.prog.done()
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || isTransient(err)) {
			return Image{}, u.stopped("upload interrupted")
		}
		return Image{}, err
	}
	return img, nil
}

// ReadTokenFile reads a tenant token from the file at path (the token is
// never taken from a flag or the environment, where ps or a log would show
// it). An unreadable or empty file, or one with more than the token, is a
// *FileError.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fileErrorf("cannot read the token file %s: %v", path, unwrapPath(err))
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fileErrorf("the token file %s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fileErrorf("the token file %s holds more than one word; it should hold the token only", path)
	}
	return tok, nil
}

// OpenImage opens the image file to upload; one that cannot be read is a
// *FileError.
func OpenImage(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileErrorf("cannot read %s: %v", path, unwrapPath(err))
	}
	return f, nil
}

// unwrapPath drops the path an *os.PathError repeats.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// uploader is one run of Upload.
type uploader struct {
	cfg       Config
	path      string // the file's name, as the caller opened it
	file      *os.File
	size      int64
	mtime     time.Time
	statePath string
	client    *uploadClient
	stderr    io.Writer
	prog      *progress
	sleep     func(context.Context, time.Duration) error
	hash      *fileHash
	saved     bool // the state file names the current session: a rerun resumes
}

// say writes an information line to stderr (never a secret).
func (u *uploader) say(format string, args ...any) {
	u.prog.interrupt()
	fmt.Fprintf(u.stderr, format+"\n", args...)
}

// session is an upload session on the data plane.
type session struct {
	url      *url.URL // a capability: never printed
	uploadID string
}

// run uploads the file, resuming a session the state file names, and
// returns the stored image.
func (u *uploader) run(ctx context.Context) (Image, error) {
	sess, err := u.resumable(ctx)
	if err != nil {
		return Image{}, err
	}
	offset := int64(-1) // unknown: ask with HEAD
	restarted := false
	for {
		if sess == nil {
			var err error
			if sess, err = u.start(ctx); err != nil {
				return Image{}, err
			}
			offset = 0
		} else if offset < 0 {
			u.say("resuming the upload of %s", u.path)
		}
		err := u.transfer(ctx, sess, offset)
		if errors.Is(err, errSessionGone) && !restarted {
			restarted = true
			u.forget()
			u.say("the upload session is gone (it ended or expired on the edge); starting over with a new ticket")
			sess = nil
			continue
		}
		if errors.Is(err, errSessionGone) {
			u.forget()
			return Image{}, refusedf("the edge ended the upload session again; upload %s again later", u.path)
		}
		if err != nil {
			return Image{}, err
		}
		return u.finish(ctx, sess)
	}
}

// resumable returns the session of an earlier run of this command on this
// file, if the state file matches; otherwise nil, after saying why.
func (u *uploader) resumable(ctx context.Context) (*session, error) {
	st, err := loadState(u.statePath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		u.say("ignoring %s (%v); starting a new upload", u.statePath, err)
		u.forget()
		return nil, nil
	}
	loc, perr := baseurl.Parse(st.SessionURL)
	if perr != nil {
		u.say("ignoring %s (no usable session in it); starting a new upload", u.statePath)
		u.forget()
		return nil, nil
	}
	sess := &session{url: loc, uploadID: st.UploadID}
	if st.Control != u.cfg.Control.URL || st.Size != u.size || !st.MTime.Equal(u.mtime) {
		why := "the file changed since"
		if st.Control != u.cfg.Control.URL {
			why = "it was for another control plane (" + st.Control + ")"
		}
		u.say("not resuming the earlier upload of %s: %s; starting a new upload", u.path, why)
		u.client.terminate(ctx, sess) // best effort: frees the edge's partial file now
		u.forget()
		return nil, nil
	}
	if st.Name != u.cfg.Name || st.EFI != u.cfg.EFI {
		// Not a silent restart: the earlier progress would be lost to what
		// may be a typo.
		efi := " without --efi"
		if st.EFI {
			efi = " with --efi"
		}
		return nil, fileErrorf("%s holds an unfinished upload of this file as --name %q%s; run again so to resume it, or delete %s to start over",
			u.statePath, st.Name, efi, u.statePath)
	}
	u.saved = true
	return sess, nil
}

// forget removes the state file.
func (u *uploader) forget() {
	u.saved = false
	if err := os.Remove(u.statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
		u.say("could not remove %s: %v", u.statePath, unwrapPath(err))
	}
}

// start takes a ticket and creates an upload session, recorded in the
// state file before the first byte is sent.
func (u *uploader) start(ctx context.Context) (*session, error) {
	for fresh := 0; ; fresh++ {
		var tk ticket
		err := u.retry(ctx, "asking the control plane for a ticket", func() error {
			var err error
			tk, err = u.client.ticket(ctx, u.cfg.Control.URL, u.cfg.Token, u.cfg.Name, u.cfg.EFI)
			return err
		})
		if err != nil {
			return nil, u.cfg.Control.refusal(err, "the ticket")
		}
		var loc *url.URL
		lost := false // a create request whose answer was lost may have used the ticket
		err = u.retry(ctx, "creating the upload session", func() error {
			var err error
			loc, err = u.client.create(ctx, tk.UploadURL, u.size)
			var ae *apiError
			if lost && errors.As(err, &ae) && (ae.is(reason.TicketUsed) || ae.is(reason.TicketUnknown)) {
				return errTicketLost
			}
			if isTransient(err) {
				lost = true
			}
			return err
		})
		if errors.Is(err, errTicketLost) && fresh == 0 {
			u.say("the answer creating the upload session was lost; taking a new ticket")
			continue
		}
		if err != nil {
			return nil, u.createRefusal(err)
		}
		sess := &session{url: loc, uploadID: tk.UploadID}
		st := uploadState{
			Control: u.cfg.Control.URL, Name: u.cfg.Name, EFI: u.cfg.EFI,
			Size: u.size, MTime: u.mtime, SessionURL: loc.String(), UploadID: tk.UploadID,
		}
		if err := saveState(u.statePath, st); err != nil {
			u.say("cannot keep the upload's progress in %s (%v): if this upload is interrupted, it starts over", u.statePath, unwrapPath(err))
		} else {
			u.saved = true
		}
		return sess, nil
	}
}

// createRefusal explains why the edge did not create an upload session.
func (u *uploader) createRefusal(err error) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	switch {
	case ae.is(reason.TicketUsed), ae.is(reason.TicketExpired), ae.is(reason.TicketUnknown):
		return refusedf("the edge did not take the fresh ticket: %v; run the same command again", err)
	case ae.is(reason.TooLarge):
		return refusedf("the edge does not take %s (%s): %v", u.path, sizeIEC(u.size), err)
	}
	return refusedf("the edge refused to start the upload: %v", err)
}

var errTicketLost = errors.New("the ticket was used by a request whose answer was lost")

// transfer sends the file from offset (-1: ask the edge first) until the
// edge has all of it.
func (u *uploader) transfer(ctx context.Context, sess *session, offset int64) error {
	attempt := 0
	best := offset // the furthest the edge has confirmed
	for {
		if offset < 0 {
			off, length, err := u.client.head(ctx, sess.url)
			if err != nil {
				if err := u.sessionFailure(ctx, sess, &attempt, "asking the edge how far the upload got", err); err != nil {
					return err
				}
				continue
			}
			if length != u.size {
				u.forget()
				return refusedf("the edge's upload session is for %d bytes but %s has %d; run the same command again to start over", length, u.path, u.size)
			}
			offset = off
			if off > best {
				best, attempt = off, 0 // bytes got through: a fresh set of retries
			}
			if off > 0 && off < u.size {
				u.say("the edge has %s of %s (%s); sending the rest", sizeIEC(off), sizeIEC(u.size), percent(off, u.size))
			}
		}
		if offset >= u.size {
			return nil
		}
		if gap := offset - u.hash.done(); gap > 256<<20 {
			u.say("reading the %s the edge has from %s, to compare digests at the end", sizeIEC(gap), u.path)
		}
		if err := u.hash.upTo(offset); err != nil {
			return fileErrorf("cannot read %s: %v", u.path, unwrapPath(err))
		}
		u.prog.begin(offset)
		next, err := u.client.patch(ctx, sess.url, u.file, offset, u.size, u.onSent)
		var ae *apiError
		switch {
		case err == nil:
			offset = next // -1 if the answer did not say: ask
			if next > best {
				best, attempt = next, 0
			}
		case errors.As(err, &ae) && ae.Status == http.StatusConflict && !ae.is(reason.ImageQuota) && ae.Offset >= 0:
			// Not where the edge is (a request whose answer was lost got
			// further than we knew): continue from there.
			attempt++
			if attempt > u.cfg.Retries {
				return u.stopped(fmt.Sprintf("gave up: the edge keeps answering with another offset (%v)", err))
			}
			offset = ae.Offset
		default:
			if err := u.sessionFailure(ctx, sess, &attempt, "sending the image", err); err != nil {
				return err
			}
			offset = -1
		}
	}
}

// sessionFailure handles a failed HEAD or PATCH: nil after the wait before
// a retry; errSessionGone when the session no longer exists; otherwise the
// error to end with.
func (u *uploader) sessionFailure(ctx context.Context, sess *session, attempt *int, what string, err error) error {
	var ae *apiError
	if !errors.As(err, &ae) || isTransient(err) {
		return u.backoff(ctx, attempt, what, err)
	}
	file := u.path
	switch {
	case ae.Status == http.StatusNotFound || ae.Status == http.StatusGone:
		return errSessionGone
	case ae.Status == http.StatusInsufficientStorage:
		return refusedf("the edge refused %s for now: %v; it keeps the upload for 24 h: run the same command again later to resume", file, err)
	}
	// Final: a rerun would be refused the same way, so the session and
	// the state go (the edge has ended the session itself after a verdict
	// on the image).
	u.client.terminate(ctx, sess)
	u.forget()
	if ae.Status == http.StatusUnsupportedMediaType && !ae.is(reason.BadContentType) || ae.Status == http.StatusUnprocessableEntity {
		return refusedf("the edge refused %s: %v; 'vmshelf check %s' runs the same checks", file, err, file)
	}
	return refusedf("the edge refused the upload of %s: %v", file, err)
}

var errSessionGone = errors.New("the upload session is gone")

func (u *uploader) onSent(chunk []byte, at int64) {
	u.hash.feed(chunk, at)
	u.prog.sent(at + int64(len(chunk)))
}

// finish looks the stored image up on the control plane, checks its digest
// against the file's and forgets the state.
func (u *uploader) finish(ctx context.Context, sess *session) (Image, error) {
	u.prog.done()
	sum, err := u.hash.sum(u.size)
	if err != nil {
		return Image{}, fileErrorf("cannot read %s: %v", u.path, unwrapPath(err))
	}
	var img *Image
	for waited := 0; ; {
		err := u.retry(ctx, "asking the control plane for the stored image", func() error {
			var err error
			img, err = u.client.image(ctx, u.cfg.Control.URL, u.cfg.Token, sess.uploadID)
			return err
		})
		if err != nil {
			return Image{}, u.cfg.Control.refusal(err, "the image's status")
		}
		if img != nil {
			break
		}
		// Not listed (yet): the edge may still be checking and committing
		// the image after its last byte (when the answer to the last PATCH
		// was lost), or it refused the image then and ended the session.
		if _, _, err := u.client.head(ctx, sess.url); err != nil && !isTransient(err) {
			u.forget()
			return Image{}, refusedf("the edge received all of %s but did not store it as image %s: it refused the image after the last byte (the full-file check), or it was removed since; 'vmshelf check %s' runs the same checks",
				u.path, sess.uploadID, u.path)
		}
		waited++
		if waited > u.cfg.Retries {
			return Image{}, u.stopped(fmt.Sprintf("the edge has all of %s but did not list image %s after %d tries", u.path, sess.uploadID, waited))
		}
		if err := u.sleep(ctx, retryDelay(waited, 0)); err != nil {
			return Image{}, err
		}
	}
	u.forget()
	if img.SHA256 != sum {
		return Image{}, refusedf("the edge stored image %s with sha256 %s, but %s has %s: the file changed during the upload? Remove the image and upload again",
			img.UploadID, img.SHA256, u.path, sum)
	}
	u.say("stored %s (%s) as image %s", u.path, sizeIEC(img.Size), img.UploadID)
	return *img, nil
}

// retry runs fn until it succeeds, fails for good, or the retries are used
// up (a *StoppedError).
func (u *uploader) retry(ctx context.Context, what string, fn func() error) error {
	attempt := 0
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if werr := u.backoff(ctx, &attempt, what, err); werr != nil {
			return werr
		}
	}
}

// backoff decides about a failed step: a refusal is returned as it is; a
// transient failure waits (0.5 s doubling, at most 30 s, or what the
// edge's Retry-After asks) and returns nil, unless the retries are used
// up.
func (u *uploader) backoff(ctx context.Context, attempt *int, what string, err error) error {
	if ctx.Err() != nil {
		return u.stopped("upload interrupted")
	}
	if !isTransient(err) {
		return err
	}
	*attempt++
	if *attempt > u.cfg.Retries {
		return u.stopped(fmt.Sprintf("gave up after %d %s %s: %v", u.cfg.Retries, plural(u.cfg.Retries, "retry", "retries"), what, err))
	}
	d := retryDelay(*attempt, retryAfter(err))
	u.say("%s failed (%v); retry %d of %d in %s", what, err, *attempt, u.cfg.Retries, d.Round(100*time.Millisecond))
	if err := u.sleep(ctx, d); err != nil {
		return u.stopped("upload interrupted")
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// stopped is a *StoppedError saying what a rerun will do.
func (u *uploader) stopped(msg string) error {
	if u.saved {
		return &StoppedError{msg + "; run the same command again to resume (" + u.statePath + " keeps the progress)"}
	}
	return &StoppedError{msg + "; run the same command again"}
}

// retryDelay is 0.5 s doubling per attempt, at most 30 s; a longer
// Retry-After (at most 5 min) wins.
func retryDelay(attempt int, after time.Duration) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < attempt && d < 30*time.Second; i++ {
		d *= 2
	}
	d = min(d, 30*time.Second)
	if after > d {
		d = min(after, 5*time.Minute)
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
