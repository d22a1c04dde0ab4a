package main

import (
	"context"
	"io"

	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/uploadclient"
)

// cancelHelp is "vmshelf cancel -h".
var cancelHelp = cli.Doc{
	Args:    "[--control URL] --token-file F [flags] UPLOAD_ID...",
	Summary: "cancel this box's unused upload tickets",
	About: `Cancels unused upload tickets of this box, by the UPLOAD_ID each ticket's answer ` +
		`gave, in the order given, and prints "cancelled UPLOAD_ID" for each. A cancelled ticket ` +
		`no longer counts against the box's image quota, at once, and an upload with it is ` +
		`refused. A ticket that has ended without an upload (cancelled already, ended by a ` +
		`refused upload, expired) is reported cancelled too. One that an upload has used is ` +
		`refused: its place is that upload's until it ends (a resumable upload ends with DELETE ` +
		`on its session, a finished one is an image: 'vmshelf rm'). The first refusal ends the ` +
		`command: the tickets before it are cancelled, the ones after it are not tried. ` +
		`'vmshelf images' lists the unused tickets.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: []string{
		"0  every ticket given is cancelled",
		"1  refused: the control plane said no (unknown ticket, used by an upload, not " +
			"sharing, token); the message says why",
		"2  a usage error, or the token file cannot be read",
		"3  the control plane did not answer, or was busy; run the same command again",
	},
}

// cancel is 'vmshelf cancel'.
func cancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return idCommand{name: "cancel", doc: cancelHelp, kind: uploadIDs, what: "of the tickets to cancel", done: "cancelled",
		hint: "; a ticket's UPLOAD_ID, not the ticket itself", call: uploadclient.Control.Cancel}.run(ctx, args, stdout)
}
