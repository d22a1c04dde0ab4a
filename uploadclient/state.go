package uploadclient

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"
)

// stateSuffix names the file next to the image that lets a rerun of
// 'vmshelf upload' resume.
const stateSuffix = ".vmshelf-upload"

// uploadState is FILE.vmshelf-upload. SessionURL is a capability (anyone
// holding it can write the upload), hence mode 0600 and never printed.
type uploadState struct {
	Note       string    `json:"note"`
	Control    string    `json:"control"`
	Name       string    `json:"name"`
	EFI        bool      `json:"efi"`
	Size       int64     `json:"size"`
	MTime      time.Time `json:"mtime"`
	SessionURL string    `json:"session_url"`
	UploadID   string    `json:"upload_id"`
}

const stateNote = "vmshelf upload's progress for a rerun to resume; session_url is a secret, do not share this file"

func loadState(path string) (uploadState, error) {
	var st uploadState
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, err
		}
		return st, unwrapPath(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, errors.New("not a state file of vmshelf upload")
	}
	if st.SessionURL == "" || st.Control == "" {
		return st, errors.New("incomplete state file")
	}
	// A copy that lost its mode still holds a secret.
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		_ = os.Chmod(path, 0o600)
	}
	return st, nil
}

// saveState writes the state atomically with mode 0600.
func saveState(path string, st uploadState) error {
	st.Note = stateNote
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing there
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
