package qcow2

import (
	"fmt"
	"math"
)

// kind is what the structure walk found in a host cluster of the file.
type kind uint8

const (
	kindFree       kind = iota // nothing the walk follows refers to it
	kindMeta                   // header, L1, refcount table or block, snapshot table or L1
	kindL2                     // an L2 table of the active L1
	kindData                   // a standard data cluster of the active layer
	kindCompressed             // holds compressed data (shared by several extents)
	// copiedBit is stored with kindL2 and kindData: the entry pointing
	// there has QCOW_OFLAG_COPIED, a promise that the refcount is 1.
	copiedBit kind = 8
	kindMask  kind = 7
)

func (k kind) String() string {
	switch k & kindMask {
	case kindFree:
		return "free space"
	case kindMeta:
		return "metadata"
	case kindL2:
		return "an L2 table"
	case kindData:
		return "a data cluster"
	case kindCompressed:
		return "compressed data"
	}
	return fmt.Sprintf("kind %d", k)
}

// clusterMap holds a kind per host cluster of the file, 4 bits each: the
// only memory of the walk that grows with the file, size/cluster_size/2
// bytes (32 MiB for a 32 GiB upload of 512-byte clusters, 256 KiB with
// the default 64 KiB clusters). It never grows with what the header or
// the tables claim: everything outside the file is refused before it is
// marked.
type clusterMap struct {
	n   uint64 // clusters
	nib []byte
}

func newClusterMap(clusters uint64) (clusterMap, error) {
	if clusters/2+1 > math.MaxInt32*uint64(64) { // 128 GiB of map: no real file
		return clusterMap{}, fmt.Errorf("qcow2: check structure: file of %d clusters is too large to check", clusters)
	}
	return clusterMap{n: clusters, nib: make([]byte, clusters/2+1)}, nil
}

// get returns the kind of cluster c < m.n.
func (m *clusterMap) get(c uint64) kind {
	return kind(m.nib[c/2]>>(4*(c%2))) & 0xf
}

func (m *clusterMap) set(c uint64, k kind) {
	sh := 4 * (c % 2)
	m.nib[c/2] = m.nib[c/2]&^(0xf<<sh) | byte(k&0xf)<<sh
}
