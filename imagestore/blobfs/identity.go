package blobfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore"
)

// identityFile holds the store's identity (imagestore.StoreIdentity)
// beside the images: a dot file, so List never takes it for an image.
const identityFile = ".store-id"

// StoreID reads the identity written beside the images; "" if there is
// none. A file that holds anything but an id is an error, not "none": a
// damaged file must not look like blobs from before identities.
func (f *FS) StoreID(ctx context.Context) (string, error) {
	b, err := os.ReadFile(filepath.Join(f.dir, identityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("blobfs: read store id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !imagestore.ValidStoreID(id) {
		return "", fmt.Errorf("blobfs: %s does not hold a store id", filepath.Join(f.dir, identityFile))
	}
	return id, nil
}

// SetStoreID writes id beside the images (mode 0600) with a rename, so
// that a crash leaves the old file or the new one, then makes it durable.
func (f *FS) SetStoreID(ctx context.Context, id string) error {
	if !imagestore.ValidStoreID(id) {
		return fmt.Errorf("blobfs: %q is not a store id", id)
	}
	path := filepath.Join(f.dir, identityFile)
	tmp := filepath.Join(f.partial, identityFile)
	if err := writeSynced(tmp, []byte(id+"\n")); err != nil {
		return fmt.Errorf("blobfs: write store id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("blobfs: write store id: %w", err)
	}
	if err := syncDir(f.dir); err != nil {
		return fmt.Errorf("blobfs: write store id: %w", err)
	}
	return nil
}

// writeSynced writes data to a new file at path (mode 0600) and fsyncs it.
func writeSynced(path string, data []byte) error {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return err
	}
	_, err = file.Write(data)
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}
