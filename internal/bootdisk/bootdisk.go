// Package bootdisk tells, from a disk's first sectors and its partitions'
// first sectors, which firmware could start a machine from it: a PC BIOS
// (SeaBIOS, what KubeVirt gives a machine without UEFI) or UEFI (OVMF).
//
// KubeVirt reports a machine whose firmware finds nothing to boot as
// Running, as it does one that booted: only the serial console shows
// "No bootable device" or the UEFI shell. Reading the disk before a
// machine is made from it is the one place where that can be said in
// words, before anybody pays for a machine that cannot start.
//
// The verdict errs towards "could start": a firmware is ruled out only
// by what it would certainly refuse, so that no image that boots is ever
// turned away. What the package reads is hostile input; every offset and
// count it takes from the disk is bounded before it is used.
package bootdisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmshelf/vmshelf/qcow2"
)

// Firmware is a set of the firmware kinds that could start a disk.
type Firmware uint8

// The firmware kinds.
const (
	BIOS Firmware = 1 << iota
	UEFI
)

// None is the empty set: no firmware finds a boot loader on the disk.
const None Firmware = 0

// Has says whether f includes every kind of g.
func (f Firmware) Has(g Firmware) bool { return f&g == g }

// String is the set as the API writes it: "bios", "uefi", "bios+uefi" or
// "none".
func (f Firmware) String() string {
	switch f {
	case None:
		return "none"
	case BIOS:
		return "bios"
	case UEFI:
		return "uefi"
	case BIOS | UEFI:
		return "bios+uefi"
	}
	return fmt.Sprintf("Firmware(%d)", uint8(f))
}

// Parse is the inverse of String.
func Parse(s string) (Firmware, error) {
	for _, f := range []Firmware{None, BIOS, UEFI, BIOS | UEFI} {
		if f.String() == s {
			return f, nil
		}
	}
	return None, fmt.Errorf("bootdisk: %q is not a firmware set", s)
}

const (
	sectorSize = 512
	// bootCodeEnd: an MBR's boot code is bytes 0-439; 440-445 are the
	// disk's signature and a reserved word, 446-509 the partition table.
	bootCodeEnd    = 440
	partitionTable = 446
	// isoMagicAt is where an ISO 9660 volume says "CD001": its first
	// volume descriptor, at byte 32 768, after the type byte.
	isoMagicAt = 32769
	// maxPartitionEntries bounds what a GPT header may make us read:
	// 128 is what every partitioning tool writes and the spec's minimum
	// size of the array; more than 1 024 is not a disk, it is an attack.
	maxPartitionEntries = 1024
	maxEntrySize        = 4096
	minEntrySize        = 128
)

// mbrTypeExtended are the MBR partition types of an extended partition:
// its logical partitions are behind a chain this package does not walk.
var mbrTypeExtended = map[byte]bool{0x05: true, 0x0f: true, 0x85: true}

// mbrTypeProtective is the one partition of a GPT disk's protective MBR.
const mbrTypeProtective = 0xee

// Starts says which firmware could start a machine from disk, a virtual
// disk of size bytes. An error is a read error: it says nothing about the
// disk, and a caller must not take it for None.
func Starts(disk io.ReaderAt, size int64) (Firmware, error) {
	d := reader{disk, size}
	mbr, err := d.sector(0)
	if err != nil {
		return None, err
	}
	var f Firmware
	if biosBootable(mbr) {
		f |= BIOS
	}
	uefi, err := d.uefiBootable(mbr)
	if err != nil {
		return None, err
	}
	if uefi {
		f |= UEFI
	}
	return f, nil
}

// StartsQCOW2 is Starts on the virtual disk of the QCOW2 image r (size
// bytes) whose header h the gate accepted (qcow2.CheckStructure passed):
// the edge's reading of an upload, and `vmshelf check`'s.
func StartsQCOW2(r io.ReaderAt, size int64, h *qcow2.Header) (Firmware, error) {
	disk, err := qcow2.NewGuest(r, size, h)
	if err != nil {
		return None, err
	}
	return Starts(disk, disk.Size())
}

// biosBootable: a BIOS loads sector 0 and jumps into it only if it ends
// in 0x55 0xAA ("not a bootable disk" otherwise), and boot code of zeros
// is no boot loader (a GPT's protective MBR without a hybrid one).
func biosBootable(mbr []byte) bool {
	return signed(mbr) && !allZero(mbr[:bootCodeEnd])
}

// uefiBootable: UEFI firmware boots from a FAT file system (with no boot
// entries of its own, from \EFI\BOOT\BOOTX64.EFI on it). It says false
// only when the disk's partitions are all known and none holds one.
func (d reader) uefiBootable(mbr []byte) (bool, error) {
	if fatBootSector(mbr) {
		return true, nil // a file system on the whole disk
	}
	iso, err := d.isISO()
	if err != nil || iso {
		return iso, err
	}
	starts, known, err := d.partitionStarts(mbr)
	if err != nil || !known {
		return !known, err
	}
	for _, lba := range starts {
		s, err := d.sector(lba)
		if errors.Is(err, errBeyondDisk) {
			continue // a partition past the disk's end holds nothing
		}
		if err != nil {
			return false, err
		}
		if fatBootSector(s) {
			return true, nil
		}
	}
	return false, nil
}

// partitionStarts lists the first sector of every partition: a GPT's
// when LBA 1 holds a GPT header, else the MBR's primary partitions.
// known is false where the partitions cannot all be listed (an extended
// partition, a GPT header whose array is out of bounds, a protective MBR
// without a GPT): then the answer is "could be anything".
func (d reader) partitionStarts(mbr []byte) (starts []int64, known bool, err error) {
	hdr, err := d.sector(1)
	if errors.Is(err, errBeyondDisk) {
		hdr = make([]byte, sectorSize)
	} else if err != nil {
		return nil, false, err
	}
	if bytes.Equal(hdr[:8], []byte("EFI PART")) {
		return d.gptStarts(hdr)
	}
	if !signed(mbr) {
		return nil, true, nil // no partition table: nothing on the disk is a partition
	}
	for i := range 4 {
		e := mbr[partitionTable+16*i : partitionTable+16*(i+1)]
		typ, first, count := e[4], binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
		switch {
		case typ == 0 || count == 0:
			continue
		case typ == mbrTypeProtective || mbrTypeExtended[typ]:
			return nil, false, nil
		}
		starts = append(starts, int64(first))
	}
	return starts, true, nil
}

// gptStarts reads the partition array a GPT header names. Its CRCs are
// not checked: firmware that found them wrong would try the backup
// header at the disk's end, which may well list the same partitions.
func (d reader) gptStarts(hdr []byte) ([]int64, bool, error) {
	arrayLBA := binary.LittleEndian.Uint64(hdr[72:])
	n := binary.LittleEndian.Uint32(hdr[80:])
	size := binary.LittleEndian.Uint32(hdr[84:])
	if n > maxPartitionEntries || size < minEntrySize || size > maxEntrySize || size%8 != 0 ||
		arrayLBA < 2 || arrayLBA > uint64(d.size/sectorSize) {
		return nil, false, nil
	}
	array := make([]byte, int(n)*int(size))
	if err := d.read(array, int64(arrayLBA)*sectorSize); err != nil {
		if errors.Is(err, errBeyondDisk) {
			return nil, false, nil
		}
		return nil, false, err
	}
	var starts []int64
	for i := range int(n) {
		e := array[i*int(size):]
		if allZero(e[:16]) {
			continue // an unused entry: its type GUID is zero
		}
		first := binary.LittleEndian.Uint64(e[32:])
		if first > uint64(d.size/sectorSize) {
			continue
		}
		starts = append(starts, int64(first))
	}
	return starts, true, nil
}

// fatBootSector says whether s could be a FAT file system's first
// sector as UEFI's FAT driver reads it (EDK2's FatPkg): a jump
// instruction, a sector size of 512 to 4 096 bytes and a power of two
// sectors per cluster. It does not insist on the "FAT" label, which the
// driver does not read either.
func fatBootSector(s []byte) bool {
	if s[0] != 0xeb && s[0] != 0xe9 && s[0] != 0x49 {
		return false
	}
	bps := binary.LittleEndian.Uint16(s[11:])
	spc := s[13]
	return bps >= 512 && bps <= 4096 && bps&(bps-1) == 0 && spc != 0 && spc&(spc-1) == 0
}

// isISO says whether the disk holds an ISO 9660 volume (an installer's
// image converted to QCOW2): its El Torito boot catalogue is not read.
func (d reader) isISO() (bool, error) {
	magic := make([]byte, 5)
	err := d.read(magic, isoMagicAt)
	if errors.Is(err, errBeyondDisk) {
		return false, nil
	}
	return err == nil && string(magic) == "CD001", err
}

func signed(sector []byte) bool { return sector[510] == 0x55 && sector[511] == 0xaa }

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// errBeyondDisk: a read past the virtual disk's end, which the disk's own
// tables asked for; it is a fact about the disk, not a read error.
var errBeyondDisk = errors.New("bootdisk: read beyond the disk's end")

// reader reads whole sectors of a disk of a known size.
type reader struct {
	r    io.ReaderAt
	size int64
}

func (d reader) sector(lba int64) ([]byte, error) {
	s := make([]byte, sectorSize)
	return s, d.read(s, lba*sectorSize)
}

func (d reader) read(p []byte, off int64) error {
	if off < 0 || off > d.size || int64(len(p)) > d.size-off {
		return errBeyondDisk
	}
	n, err := d.r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("bootdisk: read %d bytes at %d: %w", len(p), off, err)
}
