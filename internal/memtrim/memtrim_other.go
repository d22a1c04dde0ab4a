//go:build !linux

package memtrim

// dropReadOnly does nothing where there is no /proc/self/maps to read.
func dropReadOnly() (int64, error) { return 0, nil }
