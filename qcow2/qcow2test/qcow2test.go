// Package qcow2test holds the hostile-image corpus that every user of the
// qcow2 gate tests against: the gate's own tests, the gateway's upload
// tests and the `vmshelf check` tests run the same cases, like
// net/http/httptest serves every HTTP test. It is for tests only.
package qcow2test

import (
	"encoding/binary"

	"github.com/vmshelf/vmshelf/qcow2"
)

// Limits is what every case's verdict assumes: vmshelf's default
// --max-virtual-gib 512.
var Limits = qcow2.Limits{MaxVirtualSize: 512 << 30}

// Case is one image and the verdict the gate must reach with Limits.
type Case struct {
	Name string // unique, usable as a subtest name
	Data []byte // the whole file
	Want string // reason code (qcow2.Reason*), "" when the image must be accepted
}

// Base returns the smallest valid image, as qemu-img lays one out:
// version 3, 4 KiB clusters, 64 MiB virtual size, nothing written; the
// header (header_length 112, no extensions) in cluster 0, the refcount
// table in cluster 1, its block in cluster 2 and the L1 table (32
// entries) in cluster 3.
func Base() []byte { return build(spec{}).b }

// BaseClusterSize is the cluster size of Base.
const BaseClusterSize = 4096

// Mutate returns a copy of b changed by each f.
func Mutate(b []byte, fs ...func(b []byte)) []byte {
	b = append([]byte(nil), b...)
	for _, f := range fs {
		f(b)
	}
	return b
}

// Put8 sets byte off to v.
func Put8(off int, v byte) func([]byte) { return func(b []byte) { b[off] = v } }

// Put32 sets the big-endian 32-bit field at off to v.
func Put32(off int, v uint32) func([]byte) {
	return func(b []byte) { binary.BigEndian.PutUint32(b[off:], v) }
}

// Put64 sets the big-endian 64-bit field at off to v.
func Put64(off int, v uint64) func([]byte) {
	return func(b []byte) { binary.BigEndian.PutUint64(b[off:], v) }
}

// Ext is a header extension for Exts.
type Ext struct {
	Type uint32
	Data []byte
}

// End is the end-of-extensions marker.
var End = Ext{}

// Exts writes a header extension list at byte 112, just after Base's
// header; the caller adds End if it wants one.
func Exts(list ...Ext) func([]byte) {
	return func(b []byte) {
		off := 112
		for _, e := range list {
			binary.BigEndian.PutUint32(b[off:], e.Type)
			binary.BigEndian.PutUint32(b[off+4:], uint32(len(e.Data)))
			copy(b[off+8:], e.Data)
			off += 8 + (len(e.Data)+7)&^7
		}
	}
}

// Header extension types (qcow2.txt).
const (
	ExtBackingFormat = 0xE2792ACA
	ExtDataFile      = 0x44415441
	ExtLUKS          = 0x0537BE77
	ExtBitmaps       = 0x23852875
)
