package memtrim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// dropReadOnly advises MADV_DONTNEED on every mapping of the executable
// (matched by device and inode, so a binary replaced on disk since the
// start is still found) that is not writable.
func dropReadOnly() (int64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("memtrim: the executable: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("memtrim: %w", err)
	}
	ranges, err := readOnlyMappings(maps, st.Dev, st.Ino)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, r := range ranges {
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, r.start, r.end-r.start, syscall.MADV_DONTNEED); e != 0 {
			return n, fmt.Errorf("memtrim: madvise %#x-%#x: %w", r.start, r.end, e)
		}
		n += int64(r.end - r.start)
	}
	return n, nil
}

type mapping struct{ start, end uintptr }

// readOnlyMappings parses /proc/self/maps (proc(5): "start-end perms
// offset major:minor inode path") and returns the mappings of the file
// with device dev and inode ino that have no write permission.
func readOnlyMappings(maps []byte, dev, ino uint64) ([]mapping, error) {
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue // anonymous: no inode and path
		}
		perms, devField, inoField := f[1], f[3], f[4]
		if len(perms) < 2 || perms[1] == 'w' {
			continue
		}
		if i, err := strconv.ParseUint(inoField, 10, 64); err != nil || i != ino {
			continue
		}
		if d, ok := parseDev(devField); !ok || d != dev {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("memtrim: /proc/self/maps line %q", sc.Text())
		}
		out = append(out, mapping{uintptr(start), uintptr(end)})
	}
	return out, sc.Err()
}

// parseDev turns maps' "major:minor" (hex) into stat's st_dev (the
// kernel's new_encode_dev).
func parseDev(s string) (uint64, bool) {
	ma, mi, ok := strings.Cut(s, ":")
	major, err1 := strconv.ParseUint(ma, 16, 32)
	minor, err2 := strconv.ParseUint(mi, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, false
	}
	return (minor & 0xff) | (major << 8) | ((minor &^ 0xff) << 12), true
}
