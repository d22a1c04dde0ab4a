package uploadclient

import (
	"errors"
	"io"

	"github.com/vmshelf/vmshelf/qcow2"
)

// checkImage runs the gateway's QCOW2 checks on the file before a ticket
// is taken: a bad image is refused without a byte sent; a file that cannot
// be read is a *FileError.
func checkImage(r io.ReaderAt, path string, size int64, maxVirtual uint64) error {
	_, _, err := qcow2.Inspect(r, size, qcow2.Limits{MaxVirtualSize: maxVirtual})
	var rej *qcow2.Reject
	switch {
	case err == nil:
		return nil
	case errors.As(err, &rej):
		return refusedf("%s is refused (%s): %s; nothing was uploaded", path, rej.Reason, rej.Msg)
	}
	return fileErrorf("cannot read %s: %v", path, err)
}
