package imagestore

import (
	"fmt"
	"os"
)

// WriterLife is the life of a BlobWriter, the one every Blobs shares:
// it writes until Commit, Close or Abort. Commit and Abort end it; a
// failed Commit, or a failed Abort while still writing, leaves it for
// Abort to clean up; Close keeps the partial blob for Resume, and Abort
// may still remove it. Once it no longer writes, Write, Sync, ReadAt and
// Commit refuse with os.ErrClosed (Commit after Commit says so), and
// Close, and Abort after Commit or Abort, do nothing.
//
// It holds no lock: the writer that embeds it calls it under its own.
type WriterLife struct {
	pkg, id string
	state   lifeState
}

type lifeState int

const (
	lifeWriting lifeState = iota
	lifeCommitted
	lifeFailed // Commit or Abort failed; Abort cleans up
	lifeAborted
	lifeClosed // Close: the partial blob stays for Resume; Abort removes it
)

// NewWriterLife starts the life of blob id's writer; pkg begins its
// errors ("blobfs", "s3").
func NewWriterLife(pkg, id string) WriterLife { return WriterLife{pkg: pkg, id: id} }

// Usable is nil while the writer writes, else the error op ("write",
// "sync", "read") answers.
func (l *WriterLife) Usable(op string) error {
	if l.state == lifeWriting {
		return nil
	}
	return l.Refused(op)
}

// Refused is the error op answers when the writer cannot do it: it wraps
// os.ErrClosed.
func (l *WriterLife) Refused(op string) error {
	return fmt.Errorf("%s: %s %s: %w", l.pkg, op, l.id, os.ErrClosed)
}

// Close ends the writing for Resume, and reports whether it did: Close
// has nothing to do once the writer no longer writes.
func (l *WriterLife) Close() bool {
	if l.state != lifeWriting {
		return false
	}
	l.state = lifeClosed
	return true
}

// StartCommit is nil if Commit may go on, else Commit's error.
func (l *WriterLife) StartCommit() error {
	switch l.state {
	case lifeWriting:
		return nil
	case lifeCommitted:
		return fmt.Errorf("%s: commit %s: already committed", l.pkg, l.id)
	}
	return l.Refused("commit")
}

// EndCommit records the outcome of the commit StartCommit let go on, and
// returns Commit's error: err, named, or nil. A failed commit is final.
func (l *WriterLife) EndCommit(err error) error {
	if err != nil {
		l.state = lifeFailed
		return fmt.Errorf("%s: commit %s: %w", l.pkg, l.id, err)
	}
	l.state = lifeCommitted
	return nil
}

// AbortNeeded reports whether Abort has anything to do: not after a
// Commit, nor after an Abort that finished.
func (l *WriterLife) AbortNeeded() bool {
	return l.state != lifeCommitted && l.state != lifeAborted
}

// EndAbort records the outcome of an Abort and returns its error: err,
// named, or nil. An Abort that failed stays to be done again, and the
// writer no longer writes.
func (l *WriterLife) EndAbort(err error) error {
	if err != nil {
		if l.state == lifeWriting {
			l.state = lifeFailed
		}
		return fmt.Errorf("%s: abort %s: %w", l.pkg, l.id, err)
	}
	l.state = lifeAborted
	return nil
}
