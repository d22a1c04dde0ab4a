package main

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
	"unicode"
	"unicode/utf8"
)

// uploadHelp is "vmshelf upload -h".
var uploadHelp = helpDoc{
	args:    "--control URL --token-file F --name NAME [flags] FILE",
	summary: "check an image, then upload it resumably with progress",
	about: `Checks FILE with the gateway's QCOW2 checks (as 'vmshelf check' does), takes an ` +
		`upload ticket from the control plane and uploads FILE resumably (tus 1.0.0). A dropped ` +
		`connection or a busy or restarting edge is retried (with --retries attempts, waiting ` +
		`0.5 s doubling up to 30 s). Progress is kept in FILE.vmshelf-upload (mode 0600; it holds ` +
		`the upload session's URL, a secret): run the same command again to resume where the ` +
		`edge stopped storing. On success the image is printed as JSON on stdout and that file ` +
		`is removed.

The token is read from the --token-file (never from a flag or the environment).`,
	exits: []string{
		"0  the image is stored",
		"1  refused: the image or the server said no (bad image, token, quota, not sharing, " +
			"ticket); the message says why",
		"2  a usage error, or FILE or the token file cannot be read",
		"3  stopped before the end (the network or the edge stayed down through the retries, " +
			"or interrupted); run the same command again to resume",
	},
}

// uploadFlags are the command line of 'vmshelf upload'.
type uploadFlags struct {
	control, tokenFile, name string
	efi                      bool
	maxVirtualGiB            float64
	retries                  int
	file                     string
}

// parseUploadFlags reads the command line; errors and -h come back as
// errors (the writer is not needed any more, kept for runUpload's call).
func parseUploadFlags(args []string, _ io.Writer) (*uploadFlags, error) {
	f := &uploadFlags{}
	fs := newFlagSet("upload", uploadHelp)
	fs.StringVar(&f.control, "control", "", "the edge's control plane, e.g. http://127.0.0.1:8481")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding this box's tenant token")
	fs.StringVar(&f.name, "name", "", "the image's name (1 to 128 printable characters)")
	fs.BoolVar(&f.efi, "efi", false, "the image boots with UEFI")
	fs.Float64Var(&f.maxVirtualGiB, "max-virtual-gib", 512, "largest virtual disk size the local check accepts, in GiB")
	fs.IntVar(&f.retries, "retries", 10, "attempts after a failure before giving up (the count restarts whenever bytes got through)")
	// FILE may come before, between or after the flags.
	var files []string
	rest := args
	for {
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case len(files) != 1:
		return nil, usagef("upload takes one FILE, got %d; see vmshelf upload -h", len(files))
	case f.control == "":
		return nil, usagef("upload needs --control, the edge's control plane URL")
	case f.tokenFile == "":
		return nil, usagef("upload needs --token-file, a file holding this box's tenant token")
	case f.name == "":
		return nil, usagef("upload needs --name, the image's name")
	case f.retries < 0 || f.retries > 1000:
		return nil, usagef("--retries must be from 0 to 1000")
	}
	f.file = files[0]
	if _, err := gib(f.maxVirtualGiB, "max-virtual-gib"); err != nil {
		return nil, err
	}
	u, err := url.Parse(f.control)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, usagef("--control %q is not an http(s) URL of the control plane", f.control)
	}
	f.control = strings.TrimRight(f.control, "/")
	f.name = strings.TrimSpace(f.name)
	if n := utf8.RuneCountInString(f.name); !utf8.ValidString(f.name) || n < 1 || n > 128 ||
		strings.IndexFunc(f.name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return nil, usagef("--name must be 1 to 128 printable characters")
	}
	return f, nil
}

// upload is 'vmshelf upload'.
func upload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runUpload(ctx, args, stdout, stderr)
}

// uploadStopped is an upload that could not finish now but can be resumed:
// exit code 3.
type uploadStopped struct{ msg string }

func (e *uploadStopped) Error() string { return e.msg }

// ExitCode is 3: stopped, run the same command again to resume.
func (e *uploadStopped) ExitCode() int { return 3 }

func runUpload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseUploadFlags(args, stderr)
	if err != nil {
		return err
	}
	token, err := readTokenFile(f.tokenFile)
	if err != nil {
		return err
	}
	file, err := os.Open(f.file)
	if err != nil {
		return usagef("cannot read %s: %v", f.file, unwrapPath(err))
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return usagef("cannot read %s: %v", f.file, unwrapPath(err))
	}
	if !fi.Mode().IsRegular() {
		return usagef("%s is not a regular file", f.file)
	}
	// Two uploads of one file would fight over one session.
	if err := syscall.Flock(int(file.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return usagef("another vmshelf upload of %s is running", f.file)
	}
	maxVirtual, _ := gib(f.maxVirtualGiB, "max-virtual-gib")
	if err := uploadCheckImage(file, f.file, fi.Size(), uint64(maxVirtual)); err != nil {
		return err
	}

	u := &uploader{
		flags:     f,
		token:     token,
		file:      file,
		size:      fi.Size(),
		mtime:     fi.ModTime(),
		statePath: f.file + stateSuffix,
		client:    newUploadClient(),
		stderr:    stderr,
		prog:      newProgress(stderr, fi.Size()),
		sleep:     sleepCtx,
		hash:      newFileHash(file),
	}
	img, err := u.run(ctx)
	u.prog.done()
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || isTransient(err)) {
			return u.stopped("upload interrupted")
		}
		return err
	}
	if _, err := stdout.Write(append(img, '\n')); err != nil {
		return err
	}
	return nil
}

// readTokenFile reads a tenant token; an unreadable or empty file is a
// usage error.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", usagef("cannot read the token file %s: %v", path, unwrapPath(err))
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", usagef("the token file %s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", usagef("the token file %s holds more than one word; it should hold the token only", path)
	}
	return tok, nil
}

// unwrapPath drops the path an *os.PathError repeats.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// uploader is one run of 'vmshelf upload'.
type uploader struct {
	flags     *uploadFlags
	token     string
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
// returns the stored image's JSON.
func (u *uploader) run(ctx context.Context) ([]byte, error) {
	sess, err := u.resumable(ctx)
	if err != nil {
		return nil, err
	}
	offset := int64(-1) // unknown: ask with HEAD
	restarted := false
	for {
		if sess == nil {
			var err error
			if sess, err = u.start(ctx); err != nil {
				return nil, err
			}
			offset = 0
		} else if offset < 0 {
			u.say("resuming the upload of %s", u.flags.file)
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
			return nil, refusedf("the edge ended the upload session again; upload %s again later", u.flags.file)
		}
		if err != nil {
			return nil, err
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
	loc, perr := url.Parse(st.SessionURL)
	if perr != nil || (loc.Scheme != "http" && loc.Scheme != "https") || loc.Host == "" {
		u.say("ignoring %s (no usable session in it); starting a new upload", u.statePath)
		u.forget()
		return nil, nil
	}
	sess := &session{url: loc, uploadID: st.UploadID}
	if st.Control != u.flags.control || st.Size != u.size || !st.MTime.Equal(u.mtime) {
		why := "the file changed since"
		if st.Control != u.flags.control {
			why = "it was for another control plane (" + st.Control + ")"
		}
		u.say("not resuming the earlier upload of %s: %s; starting a new upload", u.flags.file, why)
		u.client.terminate(ctx, sess) // best effort: frees the edge's partial file now
		u.forget()
		return nil, nil
	}
	if st.Name != u.flags.name || st.EFI != u.flags.efi {
		// Not a silent restart: the earlier progress would be lost to what
		// may be a typo.
		efi := " without --efi"
		if st.EFI {
			efi = " with --efi"
		}
		return nil, usagef("%s holds an unfinished upload of this file as --name %q%s; run again so to resume it, or delete %s to start over",
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
			tk, err = u.client.ticket(ctx, u.flags.control, u.token, u.flags.name, u.flags.efi)
			return err
		})
		if err != nil {
			return nil, u.controlRefusal(err, "the ticket")
		}
		var loc *url.URL
		lost := false // a create request whose answer was lost may have used the ticket
		err = u.retry(ctx, "creating the upload session", func() error {
			var err error
			loc, err = u.client.create(ctx, tk.UploadURL, u.size)
			var ae *apiError
			if lost && errors.As(err, &ae) && (ae.Reason == "ticketUsed" || ae.Reason == "ticketUnknown") {
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
			Control: u.flags.control, Name: u.flags.name, EFI: u.flags.efi,
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

// controlRefusal explains a control plane's no.
func (u *uploader) controlRefusal(err error, what string) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	switch {
	case ae.Status == http.StatusUnauthorized:
		return refusedf("the control plane did not accept the token in %s (401 unauthorized): put this box's current tenant token in it", u.flags.tokenFile)
	case ae.Status == http.StatusNotFound && ae.Reason != "" && ae.Reason != "notFound":
		return refusedf("the control plane refused %s: %v", what, err)
	case ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed:
		return refusedf("%s has no vmshelf control plane route for %s (%d): is --control the control plane's URL (port 8481 by default), not the data plane's?",
			u.flags.control, what, ae.Status)
	}
	return refusedf("the control plane refused %s: %v", what, err)
}

// createRefusal explains why the edge did not create an upload session.
func (u *uploader) createRefusal(err error) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.Reason {
	case "ticketUsed", "ticketExpired", "ticketUnknown":
		return refusedf("the edge did not take the fresh ticket: %v; run the same command again", err)
	case "tooLarge":
		return refusedf("the edge does not take %s (%s): %v", u.flags.file, sizeIEC(u.size), err)
	}
	return refusedf("the edge refused to start the upload: %v", err)
}

// refusedf is a refusal: exit code 1.
func refusedf(format string, args ...any) error { return fmt.Errorf(format, args...) }

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
				return refusedf("the edge's upload session is for %d bytes but %s has %d; run the same command again to start over", length, u.flags.file, u.size)
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
			u.say("reading the %s the edge has from %s, to compare digests at the end", sizeIEC(gap), u.flags.file)
		}
		if err := u.hash.upTo(offset); err != nil {
			return usagef("cannot read %s: %v", u.flags.file, unwrapPath(err))
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
		case errors.As(err, &ae) && ae.Status == http.StatusConflict && ae.Reason != "imageQuota" && ae.Offset >= 0:
			// Not where the edge is (a request whose answer was lost got
			// further than we knew): continue from there.
			attempt++
			if attempt > u.flags.retries {
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
	file := u.flags.file
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
	if ae.Status == http.StatusUnsupportedMediaType && ae.Reason != "badContentType" || ae.Status == http.StatusUnprocessableEntity {
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
func (u *uploader) finish(ctx context.Context, sess *session) ([]byte, error) {
	u.prog.done()
	sum, err := u.hash.sum(u.size)
	if err != nil {
		return nil, usagef("cannot read %s: %v", u.flags.file, unwrapPath(err))
	}
	var img []byte
	var meta imageMeta
	for waited := 0; ; {
		err := u.retry(ctx, "asking the control plane for the stored image", func() error {
			var err error
			img, meta, err = u.client.image(ctx, u.flags.control, u.token, sess.uploadID)
			return err
		})
		if err != nil {
			return nil, u.controlRefusal(err, "the image's status")
		}
		if img != nil {
			break
		}
		// Not listed (yet): the edge may still be checking and committing
		// the image after its last byte (when the answer to the last PATCH
		// was lost), or it refused the image then and ended the session.
		if _, _, err := u.client.head(ctx, sess.url); err != nil && !isTransient(err) {
			u.forget()
			return nil, refusedf("the edge received all of %s but did not store it as image %s: it refused the image after the last byte (the full-file check), or it was removed since; 'vmshelf check %s' runs the same checks",
				u.flags.file, sess.uploadID, u.flags.file)
		}
		waited++
		if waited > u.flags.retries {
			return nil, u.stopped(fmt.Sprintf("the edge has all of %s but did not list image %s after %d tries", u.flags.file, sess.uploadID, waited))
		}
		if err := u.sleep(ctx, retryDelay(waited, 0)); err != nil {
			return nil, err
		}
	}
	u.forget()
	if meta.SHA256 != sum {
		return nil, refusedf("the edge stored image %s with sha256 %s, but %s has %s: the file changed during the upload? Remove the image and upload again",
			meta.UploadID, meta.SHA256, u.flags.file, sum)
	}
	u.say("stored %s (%s) as image %s", u.flags.file, sizeIEC(meta.Size), meta.UploadID)
	return img, nil
}

// retry runs fn until it succeeds, fails for good, or the retries are used
// up (exit code 3).
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
	if *attempt > u.flags.retries {
		return u.stopped(fmt.Sprintf("gave up after %d %s %s: %v", u.flags.retries, plural(u.flags.retries, "retry", "retries"), what, err))
	}
	d := retryDelay(*attempt, retryAfter(err))
	u.say("%s failed (%v); retry %d of %d in %s", what, err, *attempt, u.flags.retries, d.Round(100*time.Millisecond))
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

// stopped is exit code 3, saying what a rerun will do.
func (u *uploader) stopped(msg string) error {
	if u.saved {
		return &uploadStopped{msg + "; run the same command again to resume (" + u.statePath + " keeps the progress)"}
	}
	return &uploadStopped{msg + "; run the same command again"}
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
