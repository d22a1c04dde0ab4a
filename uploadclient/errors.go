package uploadclient

import "fmt"

// RefusedError is a no that the same call would meet again: the image
// (not QCOW2, a backing file, too large), the edge or its control plane
// (the token, the quota, not sharing, a ticket, an unknown image, an image
// in use), or a stored image whose SHA-256 is not the file's. Its text
// says why, in words. vmshelf exits 1 with it.
type RefusedError struct{ msg string }

func (e *RefusedError) Error() string { return e.msg }

func refusedf(format string, args ...any) error {
	return &RefusedError{fmt.Sprintf(format, args...)}
}

// StoppedError is a call stopped by something that may pass: the network
// or the edge stayed down through the retries, the edge was busy, or the
// context ended. The same call again may succeed; an upload then resumes
// where the edge stopped storing. vmshelf exits 3 with it.
type StoppedError struct{ msg string }

func (e *StoppedError) Error() string { return e.msg }

// FileError is the local side standing in the way of an upload: the file
// cannot be read or is not a regular file, another upload of it is
// running, or its state file holds an unfinished upload under another
// name or --efi. vmshelf exits 2 with it, as with its usage errors.
type FileError struct{ msg string }

func (e *FileError) Error() string { return e.msg }

func fileErrorf(format string, args ...any) error {
	return &FileError{fmt.Sprintf(format, args...)}
}
