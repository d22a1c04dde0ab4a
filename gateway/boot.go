package gateway

import (
	"io"

	"github.com/vmshelf/vmshelf/internal/bootdisk"
	"github.com/vmshelf/vmshelf/qcow2"
)

// bootOf reads which firmware could start the accepted image r (size
// bytes, header hdr) from its disk's first sectors. It never refuses an
// upload: a disk with no boot loader is still a disk, and what a machine
// can make of it is the market's question when an order names it. A read
// that fails leaves the answer unknown (""), which refuses nothing.
func (g *Gateway) bootOf(r io.ReaderAt, size int64, hdr *qcow2.Header, uploadID string) string {
	f, err := bootdisk.StartsQCOW2(r, size, hdr)
	if err != nil {
		g.log.Warn("could not read the image's first sectors; which firmware starts it stays unknown",
			"upload_id", uploadID, "err", err)
		return ""
	}
	return f.String()
}
