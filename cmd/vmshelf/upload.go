package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/uploadclient"
)

// uploadHelp is "vmshelf upload -h".
var uploadHelp = cli.Doc{
	Args:    "[--control URL] --token-file F --name NAME [flags] FILE",
	Summary: "check an image, then upload it resumably with progress",
	About: `Checks FILE with the gateway's QCOW2 checks (as 'vmshelf check' does), takes an ` +
		`upload ticket from the control plane and uploads FILE resumably (tus 1.0.0). A dropped ` +
		`connection or a busy or restarting edge is retried (with --retries attempts, waiting ` +
		`0.5 s doubling up to 30 s). Progress is kept in FILE.vmshelf-upload (mode 0600; it holds ` +
		`the upload session's URL, a secret): run the same command again to resume where the ` +
		`edge stopped storing. On success the image is printed as JSON on stdout and that file ` +
		`is removed.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: []string{
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
// errors (the writer is not needed any more, kept for upload's call).
func parseUploadFlags(args []string, _ io.Writer) (*uploadFlags, error) {
	f := &uploadFlags{}
	fs := newFlagSet("upload", uploadHelp)
	defineControl(fs, &f.control)
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding this box's tenant token")
	fs.StringVar(&f.name, "name", "", "the image's name (1 to 128 printable characters)")
	fs.BoolVar(&f.efi, "efi", false, "the image boots with UEFI")
	fs.Float64Var(&f.maxVirtualGiB, "max-virtual-gib", 512, "largest virtual disk size the local check accepts, in GiB")
	fs.IntVar(&f.retries, "retries", 10, "attempts after a failure before giving up (the count restarts whenever bytes got through)")
	files, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
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
	if _, err := cli.GiB(f.maxVirtualGiB, "max-virtual-gib"); err != nil {
		return nil, err
	}
	if f.control, err = controlURL(f.control); err != nil {
		return nil, err
	}
	f.name = strings.TrimSpace(f.name)
	if n := utf8.RuneCountInString(f.name); !utf8.ValidString(f.name) || n < 1 || n > 128 ||
		strings.IndexFunc(f.name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return nil, usagef("--name must be 1 to 128 printable characters")
	}
	return f, nil
}

// parseInterspersed parses args into fs and returns the arguments that
// are not flags, which may stand before, between or after the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := cli.ParseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// controlURL checks --control: an http(s) URL of the control plane, kept
// without a trailing slash.
func controlURL(control string) (string, error) {
	if _, err := baseurl.ParseBase(control); err != nil {
		return "", usagef("--control %q is not an http(s) URL of the control plane", control)
	}
	return strings.TrimRight(control, "/"), nil
}

// upload is 'vmshelf upload': the flags and the token file here, the
// upload in uploadclient.
func upload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseUploadFlags(args, stderr)
	if err != nil {
		return err
	}
	token, err := uploadclient.ReadTokenFile(f.tokenFile)
	if err != nil {
		return clientExit(err)
	}
	file, err := uploadclient.OpenImage(f.file)
	if err != nil {
		return clientExit(err)
	}
	defer file.Close()
	maxVirtual, _ := cli.GiB(f.maxVirtualGiB, "max-virtual-gib")
	img, err := uploadclient.Upload(ctx, uploadclient.Config{
		Control:    uploadclient.Control{URL: f.control, Token: token, TokenFile: f.tokenFile},
		Name:       f.name,
		EFI:        f.efi,
		Retries:    f.retries,
		MaxVirtual: uint64(maxVirtual),
		Progress:   stderr,
	}, file)
	if err != nil {
		return clientExit(err)
	}
	if _, err := stdout.Write(append(img.Raw, '\n')); err != nil {
		return err
	}
	return nil
}

// clientExit gives uploadclient's errors their exit codes: a refusal 1
// (the default), the local file in the way 2 (as a usage error), stopped
// by what may pass 3 (run the same command again).
func clientExit(err error) error {
	var fe *uploadclient.FileError
	var se *uploadclient.StoppedError
	switch {
	case errors.As(err, &fe):
		return usagef("%s", err)
	case errors.As(err, &se):
		return &stoppedError{err}
	}
	return err
}

// stoppedError is exit code 3: stopped, run the same command again (an
// upload resumes).
type stoppedError struct{ err error }

func (e *stoppedError) Error() string { return e.err.Error() }
func (e *stoppedError) Unwrap() error { return e.err }

// ExitCode is 3.
func (e *stoppedError) ExitCode() int { return 3 }
