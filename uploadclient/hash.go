package uploadclient

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"os"
	"sync"
)

// fileHash computes the file's SHA-256 from the bytes the upload reads
// anyway, in file order: a chunk is hashed when it continues what was
// hashed so far (a resent chunk is not hashed again), and a gap (a resume
// past what this run read) is read from the file. At the end it is
// compared with the digest the edge stored.
type fileHash struct {
	mu sync.Mutex
	f  *os.File
	h  hash.Hash
	n  int64 // the file's [0, n) is hashed
}

func newFileHash(f *os.File) *fileHash { return &fileHash{f: f, h: sha256.New()} }

// feed takes a chunk read at file offset at.
func (fh *fileHash) feed(chunk []byte, at int64) {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	if end := at + int64(len(chunk)); at <= fh.n && end > fh.n {
		fh.h.Write(chunk[fh.n-at:])
		fh.n = end
	}
}

// upTo hashes the file up to off, reading what was not seen.
func (fh *fileHash) upTo(off int64) error {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	if off <= fh.n {
		return nil
	}
	n, err := io.Copy(fh.h, io.NewSectionReader(fh.f, fh.n, off-fh.n))
	fh.n += n
	if err == nil && fh.n < off {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// done is how much of the file is hashed.
func (fh *fileHash) done() int64 {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	return fh.n
}

// sum is the hex SHA-256 of the file's first size bytes.
func (fh *fileHash) sum(size int64) (string, error) {
	if err := fh.upTo(size); err != nil {
		return "", err
	}
	fh.mu.Lock()
	defer fh.mu.Unlock()
	return hex.EncodeToString(fh.h.Sum(nil)), nil
}
