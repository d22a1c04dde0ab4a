package blobfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// quarantineDir holds committed blobs that no record named at start-up.
// They keep their name and bytes; only an operator removes them.
const quarantineDir = ".quarantine"

func (f *FS) quarantinePath(id string) string {
	return filepath.Join(f.dir, quarantineDir, id+blobExt)
}

// Quarantine moves <id>.qcow2 into .quarantine/ with one no-replace rename,
// then makes both directory entries durable: after a crash the blob is in
// one place or the other, never in neither.
func (f *FS) Quarantine(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blobfs: quarantine %s: %w", id, err)
	}
	dir := filepath.Join(f.dir, quarantineDir)
	if err := ensureDir(dir); err != nil {
		return err
	}
	err := renameNoReplace(f.finalPath(id), f.quarantinePath(id))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("blobfs: quarantine %s: %w", id, imagestore.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("blobfs: quarantine %s: a quarantined blob has that id: %w", id, imagestore.ErrExists)
	case err != nil:
		return fmt.Errorf("blobfs: quarantine %s: %w", id, err)
	}
	if err := errors.Join(syncDir(dir), syncDir(f.dir)); err != nil {
		return fmt.Errorf("blobfs: quarantine %s: %w", id, err)
	}
	return nil
}

// Quarantined lists .quarantine/. The time a blob was quarantined is its
// file's inode change time, which the rename set.
func (f *FS) Quarantined(ctx context.Context) ([]imagestore.QuarantinedBlob, error) {
	entries, err := os.ReadDir(filepath.Join(f.dir, quarantineDir))
	if errors.Is(err, fs.ErrNotExist) {
		return []imagestore.QuarantinedBlob{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("blobfs: list quarantine: %w", err)
	}
	out := []imagestore.QuarantinedBlob{}
	for _, e := range entries {
		stem, ok := strings.CutSuffix(e.Name(), blobExt)
		if !ok || !e.Type().IsRegular() || !imagestore.ValidUploadID(stem) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("blobfs: list quarantine: %w", err)
		}
		at := info.ModTime()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			at = time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
		}
		out = append(out, imagestore.QuarantinedBlob{ID: stem, Size: info.Size(), QuarantinedAt: at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RemoveQuarantined deletes one quarantined blob, on an operator's request.
func (f *FS) RemoveQuarantined(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	err := os.Remove(f.quarantinePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blobfs: remove quarantined %s: %w", id, imagestore.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("blobfs: remove quarantined %s: %w", id, err)
	}
	if err := syncDir(filepath.Join(f.dir, quarantineDir)); err != nil {
		return fmt.Errorf("blobfs: remove quarantined %s: %w", id, err)
	}
	return nil
}
