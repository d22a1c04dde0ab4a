package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/uploadclient"
)

// imagesHelp is "vmshelf images -h".
var imagesHelp = cli.Doc{
	Args:    "[--control URL] --token-file F [flags]",
	Summary: "list this box's images on the edge",
	About: `Lists this box's images on the edge, oldest first, as the control plane's status ` +
		`has them: a table of upload id, name, size, virtual size, when it was stored (UTC) and ` +
		`the first 12 hex digits of its SHA-256. The box's unused upload tickets follow in a table ` +
		`of their own, headed UNUSED TICKET: upload id, name, EFI and when the ticket expires ` +
		`(UTC). Each counts against the image quota until it is used, cancelled ('vmshelf cancel') ` +
		`or expires. With --json, the images as the control plane sent them: one JSON array on ` +
		`stdout, without the tickets.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: []string{
		"0  listed (no image and no ticket: nothing on stdout, or [] with --json)",
		"1  refused: the control plane said no (token, route); the message says why",
		"2  a usage error, or the token file cannot be read",
		"3  the control plane did not answer, or was busy; run the same command again",
	},
}

// rmHelp is "vmshelf rm -h".
var rmHelp = cli.Doc{
	Args:    "[--control URL] --token-file F [flags] UPLOAD_ID...",
	Summary: "remove this box's images from the edge",
	About: `Removes images of this box from the edge, in the order given: each image's record ` +
		`and fetch URLs, then its file. Prints "removed UPLOAD_ID" for each. The edge keeps an ` +
		`image an order still imports (awaiting payment, paid or running) until the order has ` +
		`ended. The first refusal ends the command: the images before it are removed, the ones ` +
		`after it are not tried. 'vmshelf images' lists the UPLOAD_IDs.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: []string{
		"0  every image given is removed",
		"1  refused: the control plane said no (unknown image, in use by an order, not " +
			"sharing, token); the message says why",
		"2  a usage error, or the token file cannot be read",
		"3  the control plane did not answer, or was busy; run the same command again (an " +
			"image it removed meanwhile is then reported unknown)",
	},
}

// controlFlags are the flags of the commands a box runs against the
// edge's control plane. (upload defines the same two flags itself, --control
// with defineControl too.)
type controlFlags struct{ control, tokenFile string }

func (c *controlFlags) define(fs *flag.FlagSet) {
	defineControl(fs, &c.control)
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding this box's tenant token")
}

// dial checks the flags and reads the token file: the control plane for
// command cmd.
func (c *controlFlags) dial(cmd string) (uploadclient.Control, error) {
	switch {
	case c.control == "":
		return uploadclient.Control{}, usagef("%s needs --control, the edge's control plane URL", cmd)
	case c.tokenFile == "":
		return uploadclient.Control{}, usagef("%s needs --token-file, a file holding this box's tenant token", cmd)
	}
	control, err := controlURL(c.control)
	if err != nil {
		return uploadclient.Control{}, err
	}
	token, err := uploadclient.ReadTokenFile(c.tokenFile)
	if err != nil {
		return uploadclient.Control{}, clientExit(err)
	}
	return uploadclient.Control{URL: control, Token: token, TokenFile: c.tokenFile}, nil
}

// parseControlCommand parses the command line of images or rm: the
// shared flags, the command's own (defined by more), and the arguments,
// which may stand before, between or after the flags.
func parseControlCommand(name string, doc cli.Doc, args []string, more func(*flag.FlagSet)) (*controlFlags, []string, error) {
	cf := &controlFlags{}
	fs := newFlagSet(name, doc)
	cf.define(fs)
	if more != nil {
		more(fs)
	}
	rest, err := parseInterspersed(fs, args)
	return cf, rest, err
}

// images is 'vmshelf images'.
func images(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cf, rest, err := parseControlCommand("images", imagesHelp, args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the list as the control plane sent it, as one JSON array")
	})
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("images takes no arguments, got %q", rest[0])
	}
	c, err := cf.dial("images")
	if err != nil {
		return err
	}
	imgs, tickets, err := c.ImagesAndTickets(ctx)
	if err != nil {
		return clientExit(err)
	}
	if asJSON {
		raw := make([]json.RawMessage, 0, len(imgs))
		for _, img := range imgs {
			raw = append(raw, img.Raw)
		}
		b, err := json.Marshal(raw)
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(b, '\n'))
		return err
	}
	var err1, err2 error
	if len(imgs) == 0 {
		fmt.Fprintln(stderr, "this box has no images on the edge")
	} else {
		err1 = printImages(stdout, imgs)
	}
	if len(tickets) > 0 {
		err2 = printTickets(stdout, tickets, len(imgs) > 0)
	}
	return errors.Join(err1, err2) // stdout closed early, say: not "listed"
}

func printImages(w io.Writer, imgs []uploadclient.Image) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UPLOAD_ID\tNAME\tSIZE\tVIRTUAL\tCREATED (UTC)\tSHA256")
	for _, img := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", img.UploadID, img.Name, humanize.IBytes(uint64(img.Size)),
			humanize.IBytes(uint64(img.VirtualSize)), utcMinute(img.CreatedAt), img.SHA256[:min(12, len(img.SHA256))])
	}
	return tw.Flush()
}

// printTickets is the table of unused tickets that follows the images
// (after a blank line when there are images): they hold places in the
// quota, and 'vmshelf cancel' gives them back.
func printTickets(w io.Writer, tickets []uploadclient.Ticket, afterImages bool) error {
	if afterImages {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UNUSED TICKET\tNAME\tEFI\tEXPIRES (UTC)")
	for _, tk := range tickets {
		fmt.Fprintf(tw, "%s\t%s\t%t\t%s\n", tk.UploadID, tk.Name, tk.EFI, utcMinute(tk.ExpiresAt))
	}
	return tw.Flush()
}

// utcMinute is how the command line shows a time: in UTC, to the minute,
// with "(UTC)" in its column's heading.
func utcMinute(t time.Time) string { return t.UTC().Format("2006-01-02 15:04") }

// rm is 'vmshelf rm'.
func rm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return idCommand{name: "rm", doc: rmHelp, kind: uploadIDs, what: "of the images to remove", done: "removed",
		call: uploadclient.Control.Remove}.run(ctx, args, stdout)
}

// idKind is the kind of id an idCommand takes: its name in messages, its
// form, and where a user finds one.
type idKind struct {
	name  string // "UPLOAD_ID"
	valid func(string) bool
	form  string // "24 hex characters"
	where string // "see 'vmshelf images'"
}

// The ids the commands take.
var (
	uploadIDs = idKind{name: "UPLOAD_ID", valid: imagestore.ValidUploadID, form: "24 hex characters", where: "see 'vmshelf images'"}
	orderIDs  = idKind{name: "ORDER_ID", valid: imagestore.ValidOrderID, form: "'o' and 16 hex characters", where: "see 'vmshelf orders list'"}
)

// idCommand is a command that acts on ids one after the other: rm and
// cancel on UPLOAD_IDs, orders cancel on ORDER_IDs.
type idCommand struct {
	name string
	doc  cli.Doc
	kind idKind
	what string // "of the images to remove": what the ids name
	hint string // follows a malformed id's usage error
	done string // printed before each id acted on
	call func(uploadclient.Control, context.Context, string) error
}

// run checks every id first, then calls for each in order, printing
// "done ID" for each until the first failure, which names the ids not
// tried.
func (ic idCommand) run(ctx context.Context, args []string, stdout io.Writer) error {
	cf, ids, err := parseControlCommand(ic.name, ic.doc, args, nil)
	if err != nil {
		return err
	}
	k := ic.kind
	if len(ids) == 0 {
		return usagef("%s needs the %ss %s (%s)", ic.name, k.name, ic.what, k.where)
	}
	for _, id := range ids {
		switch {
		case k.valid(id):
		case len(id) == 64 && strings.Trim(id, "0123456789abcdefABCDEF") == "":
			// A ticket or a token pasted by mistake: a secret, never echoed.
			return usagef("%s: an argument of 64 hex characters is a ticket or token (not shown here), not an %s "+
				"(%s; %s%s)", ic.name, k.name, k.form, k.where, ic.hint)
		default:
			return usagef("%s: %q is not an %s (%s; %s%s)", ic.name, id, k.name, k.form, k.where, ic.hint)
		}
	}
	c, err := cf.dial(ic.name)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if err := ic.call(c, ctx, id); err != nil {
			if left := ids[i+1:]; len(left) > 0 {
				err = fmt.Errorf("%w (not tried: %s)", err, strings.Join(left, " "))
			}
			return clientExit(err)
		}
		fmt.Fprintln(stdout, ic.done, id)
	}
	return nil
}
