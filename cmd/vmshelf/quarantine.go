package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/internal/cli"
)

// quarantineHelp is "vmshelf quarantine -h".
var quarantineHelp = cli.Doc{
	Args:    "COMMAND [arguments] [flags]",
	Summary: "list and remove the image files start-up set aside",
	About: `An image file that serve finds at start-up with no record naming it is moved to ` +
		`vm-images/.quarantine/ in the data dir and kept: it may be the only copy of somebody's ` +
		`disk. These commands list those files and remove them, only the ones named. They work ` +
		`while serve runs.`,
}

// quarantineCommands are "vmshelf quarantine COMMAND".
var quarantineCommands = []cli.Command{
	cli.SubCommand("list", quarantine, cli.Doc{
		Args:    "[flags]",
		Summary: "list the quarantined image files",
		About: `Prints the quarantined image files of --data-dir on stdout, one a line: the ` +
			`UPLOAD_ID, the size in bytes and when it was set aside (RFC 3339, UTC), separated by ` +
			`tabs. With none, it says so on stderr and prints nothing.`,
		Env: s3Vars,
	}),
	cli.SubCommand("rm", quarantine, cli.Doc{
		Args:    "UPLOAD_ID... [flags]",
		Summary: "delete the quarantined image files named (only these)",
		About: `Deletes the quarantined image files UPLOAD_ID... of --data-dir, in turn, and ` +
			`prints "removed UPLOAD_ID" for each. An UPLOAD_ID not in quarantine stops the command ` +
			`(the files before it are gone); nothing else is ever deleted.`,
		Env: s3Vars,
		Exits: []string{"0  all removed", "1  an UPLOAD_ID is not in quarantine, or removing failed",
			"2  a usage error (no or a malformed UPLOAD_ID, a bad flag, a data dir that is not one)"},
	}),
}

// quarantine runs "vmshelf quarantine SUB": it lists the image files
// start-up set aside because no record named them, and removes them only
// when the operator names them: they may be the only copy of somebody's
// disk.
func quarantine(ctx context.Context, sub string, doc cli.Doc, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("quarantine "+sub, doc)
	dataDir := fs.String("data-dir", defaultData, "directory of the store")
	blobsURL := fs.String("blobs", "", "the images' S3 bucket, s3://bucket/prefix, as serve's --blobs (default <data-dir>/vm-images)")
	var ids []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") { // ids may come before the flags
		ids, args = append(ids, args[0]), args[1:]
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	ids = append(ids, fs.Args()...)
	var (
		blobs quarantineBlobs
		where = filepath.Join(*dataDir, imagesDir, ".quarantine")
		err   error
	)
	switch {
	case *blobsURL == "":
		blobs, err = openImages(*dataDir)
	case blobsFlagS3(*blobsURL):
		where = *blobsURL + " (quarantine/)"
		blobs, err = openBucket(ctx, *blobsURL, 0, 0, os.Getenv)
	default:
		err = usagef("--blobs %q: want s3://bucket/prefix (or leave it empty for <data-dir>/%s)", *blobsURL, imagesDir)
	}
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		if len(ids) > 0 {
			return usagef("quarantine list takes no arguments, got %q", ids[0])
		}
		q, err := blobs.Quarantined(ctx)
		if err != nil {
			return err
		}
		if len(q) == 0 {
			fmt.Fprintf(stderr, "no quarantined image files in %s\n", where)
			return nil
		}
		fmt.Fprintf(stderr, "image files no record named, in %s (kept until removed with 'vmshelf quarantine rm'):\n", where)
		for _, b := range q {
			fmt.Fprintf(stdout, "%s\t%d\t%s\n", b.ID, b.Size, b.QuarantinedAt.UTC().Format(time.RFC3339))
		}
		return nil
	case "rm":
		if len(ids) == 0 {
			return usagef("quarantine rm needs the UPLOAD_IDs to remove; 'vmshelf quarantine list' shows them")
		}
		for _, id := range ids {
			if !imagestore.ValidUploadID(id) {
				return usagef("quarantine rm: %q is not an UPLOAD_ID (24 hex characters)", id)
			}
		}
		for _, id := range ids {
			if err := blobs.RemoveQuarantined(ctx, id); err != nil {
				if errors.Is(err, imagestore.ErrNotFound) {
					return fmt.Errorf("no quarantined image file %s in %s", id, where)
				}
				return err
			}
			fmt.Fprintln(stdout, "removed", id)
		}
	}
	return nil
}

// openImages opens the image files of an existing data dir; a mistyped
// --data-dir is an error, not a new empty directory.
func openImages(dir string) (*blobfs.FS, error) {
	p := filepath.Join(dir, imagesDir)
	if st, err := os.Stat(p); err != nil || !st.IsDir() {
		return nil, usagef("no image directory %s (check --data-dir)", p)
	}
	blobs, err := blobfs.Open(p)
	if err != nil {
		return nil, fmt.Errorf("open image directory: %w", err)
	}
	return blobs, nil
}
