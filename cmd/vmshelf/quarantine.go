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
)

// quarantine lists the image files start-up set aside because no record
// named them, and removes them only when the operator names them: they may
// be the only copy of somebody's disk.
func quarantine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef("quarantine needs a subcommand: list, or rm UPLOAD_ID...")
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("quarantine " + sub)
	dataDir := fs.String("data-dir", defaultData, "directory of the store")
	var ids []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") { // ids may come before the flags
		ids, args = append(ids, args[0]), args[1:]
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	ids = append(ids, fs.Args()...)
	blobs, err := openImages(*dataDir)
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		if len(ids) > 0 {
			return usagef("quarantine list takes no arguments")
		}
		q, err := blobs.Quarantined(ctx)
		if err != nil {
			return err
		}
		if len(q) == 0 {
			fmt.Fprintf(stderr, "no quarantined image files in %s\n", *dataDir)
			return nil
		}
		fmt.Fprintf(stderr, "image files no record named, in %s (kept until removed with 'vmshelf quarantine rm'):\n",
			filepath.Join(*dataDir, imagesDir, ".quarantine"))
		for _, b := range q {
			fmt.Fprintf(stdout, "%s\t%d\t%s\n", b.ID, b.Size, b.QuarantinedAt.UTC().Format(time.RFC3339))
		}
		return nil
	case "rm":
		if len(ids) == 0 {
			return usagef("quarantine rm needs the UPLOAD_IDs to remove (see 'vmshelf quarantine list')")
		}
		for _, id := range ids {
			if !imagestore.ValidUploadID(id) {
				return usagef("quarantine rm: %q is not an UPLOAD_ID (24 hex characters)", id)
			}
		}
		for _, id := range ids {
			if err := blobs.RemoveQuarantined(ctx, id); err != nil {
				if errors.Is(err, imagestore.ErrNotFound) {
					return fmt.Errorf("no quarantined image file %s in %s", id, *dataDir)
				}
				return err
			}
			fmt.Fprintln(stdout, "removed", id)
		}
		return nil
	}
	return usagef("unknown quarantine subcommand %q: list, or rm UPLOAD_ID...", sub)
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
