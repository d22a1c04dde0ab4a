package bootdisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// disk is a virtual disk being laid out by a test: 4 MiB of zeros.
type disk []byte

func newDisk() disk { return make(disk, 4<<20) }

// sign ends sector 0 in 0x55 0xAA.
func (d disk) sign() disk { d[510], d[511] = 0x55, 0xaa; return d }

// code writes one byte of boot code (or beyond it) at i.
func (d disk) code(i int) disk { d[i] = 0xfa; return d }

// fat lays a FAT boot sector at lba: a jump, 512 bytes a sector, 4
// sectors a cluster, as mkfs.vfat writes it.
func (d disk) fat(lba int) disk {
	s := d[lba*512:]
	s[0], s[1], s[2] = 0xeb, 0x3c, 0x90
	binary.LittleEndian.PutUint16(s[11:], 512)
	s[13] = 4
	copy(s[54:], "FAT16   ")
	s[510], s[511] = 0x55, 0xaa
	return d
}

// mbrPart writes primary partition i of the MBR.
func (d disk) mbrPart(i int, typ byte, first, count uint32) disk {
	e := d[446+16*i:]
	e[4] = typ
	binary.LittleEndian.PutUint32(e[8:], first)
	binary.LittleEndian.PutUint32(e[12:], count)
	return d.sign()
}

// gpt writes a protective MBR and a GPT header at LBA 1 whose array of n
// entries of size bytes starts at LBA 2, with the given partitions'
// first sectors (type GUIDs: any nonzero bytes).
func (d disk) gpt(n, size uint32, firsts ...uint64) disk {
	d.mbrPart(0, 0xee, 1, uint32(len(d)/512-1))
	h := d[512:]
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint64(h[72:], 2)
	binary.LittleEndian.PutUint32(h[80:], n)
	binary.LittleEndian.PutUint32(h[84:], size)
	for i, first := range firsts {
		e := d[1024+i*int(size):]
		e[0] = 0x28 // a type GUID that is not zero
		binary.LittleEndian.PutUint64(e[32:], first)
	}
	return d
}

func starts(t *testing.T, d disk) Firmware {
	t.Helper()
	f, err := Starts(bytes.NewReader(d), int64(len(d)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStarts(t *testing.T) {
	for _, c := range []struct {
		name string
		disk disk
		want Firmware
	}{
		{"zeros", newDisk(), None},
		{"an ext4 file system on the whole disk", func() disk { d := newDisk(); copy(d[1024+56:], "\x53\xef"); return d }(), None},
		{"boot code and the signature", newDisk().code(0).sign(), BIOS},
		{"boot code at its last byte", newDisk().code(439).sign(), BIOS},
		{"only the disk signature after the boot code", newDisk().code(440).sign(), None},
		{"only the partition table after the boot code", newDisk().code(446).sign(), None},
		{"boot code without the signature", newDisk().code(0), None},
		{"half the signature", func() disk { d := newDisk().code(0); d[510] = 0x55; return d }(), None},
		{"a protective MBR's zero boot code", newDisk().gpt(128, 128, 2048).fat(2048), UEFI},
		{"GPT with an ESP and a hybrid MBR", newDisk().gpt(128, 128, 34, 2048).fat(2048).code(0), BIOS | UEFI},
		{"GPT whose partitions hold no FAT", newDisk().gpt(128, 128, 34, 2048), None},
		{"GPT with FAT in its last entry", newDisk().gpt(4, 128, 0, 0, 0, 2048).fat(2048), UEFI},
		{"GPT of 1024 entries, none of them FAT", newDisk().gpt(1024, 128, 4000), None},
		{"GPT of 1025 entries: unknown", newDisk().gpt(1025, 128), UEFI},
		{"GPT entries of 127 bytes: unknown", newDisk().gpt(4, 127), UEFI},
		{"GPT entries of 4096 bytes", newDisk().gpt(2, 4096, 34), None},
		{"GPT entries of 4104 bytes: unknown", newDisk().gpt(2, 4104), UEFI},
		{"GPT partition past the disk", newDisk().gpt(128, 128, 1<<40), None},
		{"a protective MBR without a GPT: unknown", newDisk().mbrPart(0, 0xee, 1, 100), UEFI},
		{"MBR with a FAT partition", newDisk().code(0).mbrPart(1, 0x0c, 2048, 100).fat(2048), BIOS | UEFI},
		{"MBR with a Linux partition", newDisk().code(0).mbrPart(0, 0x83, 2048, 100), BIOS},
		{"MBR partition table without the signature", func() disk { d := newDisk().mbrPart(0, 0x0c, 2048, 100).fat(2048); d[510] = 0; return d }(), None},
		{"MBR partition of no sectors", newDisk().mbrPart(0, 0x0c, 2048, 0).fat(2048), None},
		{"an extended partition: unknown", newDisk().code(0).mbrPart(3, 0x05, 2048, 100), BIOS | UEFI},
		{"MBR partition past the disk", newDisk().mbrPart(0, 0x0c, 1<<31, 100), None},
		{"FAT on the whole disk", newDisk().fat(0), BIOS | UEFI},
		{"an ISO 9660 volume", func() disk { d := newDisk(); copy(d[isoMagicAt:], "CD001"); return d }(), UEFI},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := starts(t, c.disk); got != c.want {
				t.Errorf("Starts = %v, want %v", got, c.want)
			}
		})
	}
}

// TestFATBootSector holds the FAT check at its bounds: 512 and 4096 bytes
// a sector, a power of two sectors a cluster, and the three jumps.
func TestFATBootSector(t *testing.T) {
	sector := func(jump byte, bps uint16, spc byte) []byte {
		s := make([]byte, 512)
		s[0] = jump
		binary.LittleEndian.PutUint16(s[11:], bps)
		s[13] = spc
		return s
	}
	for _, c := range []struct {
		jump byte
		bps  uint16
		spc  byte
		want bool
	}{
		{0xeb, 512, 1, true}, {0xe9, 4096, 128, true}, {0x49, 1024, 2, true},
		{0x00, 512, 1, false}, {0xea, 512, 1, false},
		{0xeb, 256, 1, false}, {0xeb, 8192, 1, false}, {0xeb, 768, 1, false},
		{0xeb, 512, 0, false}, {0xeb, 512, 3, false},
	} {
		if got := fatBootSector(sector(c.jump, c.bps, c.spc)); got != c.want {
			t.Errorf("jump %#x, %d bytes a sector, %d a cluster: %v, want %v", c.jump, c.bps, c.spc, got, c.want)
		}
	}
}

// TestSmallDisks: a disk shorter than what the check reads is no error.
func TestSmallDisks(t *testing.T) {
	for _, size := range []int{512, 1024, 4096, isoMagicAt + 4} {
		d := newDisk()[:size].code(0).sign()
		if got := starts(t, d); got != BIOS {
			t.Errorf("a %d-byte disk with a boot loader: %v", size, got)
		}
	}
	if _, err := Starts(bytes.NewReader(nil), 0); err == nil {
		t.Error("a disk of no sectors: no error")
	}
}

// TestReadError: a failed read is an error, never a verdict.
func TestReadError(t *testing.T) {
	d := newDisk().gpt(128, 128, 2048)
	broken := errors.New("the disk went away")
	for _, at := range []int64{0, 512, 1024, 2048 * 512} {
		f, err := Starts(failingAt{bytes.NewReader(d), at, broken}, int64(len(d)))
		if !errors.Is(err, broken) {
			t.Errorf("a read failing at %d: %v, %v; want the read's error", at, f, err)
		}
	}
}

type failingAt struct {
	r   io.ReaderAt
	at  int64
	err error
}

func (f failingAt) ReadAt(p []byte, off int64) (int, error) {
	if off <= f.at && f.at < off+int64(len(p)) {
		return 0, f.err
	}
	return f.r.ReadAt(p, off)
}

func TestFirmwareStrings(t *testing.T) {
	for _, f := range []Firmware{None, BIOS, UEFI, BIOS | UEFI} {
		g, err := Parse(f.String())
		if err != nil || g != f {
			t.Errorf("Parse(%q) = %v, %v", f.String(), g, err)
		}
	}
	if _, err := Parse(""); err == nil {
		t.Error(`Parse("") took the empty string`)
	}
	if !(BIOS | UEFI).Has(UEFI) || BIOS.Has(UEFI) || !None.Has(None) {
		t.Error("Has")
	}
}

// FuzzStarts: no disk makes the check panic, read out of bounds or take
// long; the verdict of a disk must not depend on bytes past what it
// reads (the check is deterministic).
//
//	go test -run '^$' -fuzz '^FuzzStarts$' -fuzztime 10s ./internal/bootdisk
func FuzzStarts(f *testing.F) {
	f.Add([]byte(newDisk().code(0).sign()[:8192]))
	f.Add([]byte(newDisk().gpt(128, 128, 40).fat(40)[:64<<10]))
	f.Add([]byte(newDisk().code(0).mbrPart(1, 0x0c, 20, 100).fat(20)[:16<<10]))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, errA := Starts(bytes.NewReader(data), int64(len(data)))
		b, errB := Starts(bytes.NewReader(data), int64(len(data)))
		if a != b || (errA == nil) != (errB == nil) {
			t.Fatalf("two verdicts: %v/%v, %v/%v", a, errA, b, errB)
		}
		if errA != nil && len(data) >= 512 {
			t.Fatalf("a bytes.Reader of %d bytes cannot fail, yet: %v", len(data), errA)
		}
	})
}
