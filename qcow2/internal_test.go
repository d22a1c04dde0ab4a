package qcow2

import "testing"

// TestRefcountAt reads each refcount width as QEMU stores it: big-endian
// from 8 bits up, narrower entries from the least significant bit of a
// byte (get_refcount_ro0..ro2 in block/qcow2-refcount.c).
func TestRefcountAt(t *testing.T) {
	block := []byte{0b1110_0100, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}
	cases := []struct {
		order uint32
		i     uint64
		want  uint64
	}{
		{0, 0, 0}, {0, 2, 1}, {0, 5, 1}, {0, 7, 1}, {0, 8, 0}, {0, 9, 1},
		{1, 0, 0}, {1, 1, 1}, {1, 2, 2}, {1, 3, 3},
		{2, 0, 0x4}, {2, 1, 0xe}, {2, 2, 0x2}, {2, 3, 0x1},
		{3, 0, 0xe4}, {3, 1, 0x12},
		{4, 0, 0xe412}, {4, 1, 0x3456},
		{5, 0, 0xe4123456}, {5, 1, 0x789abcde},
		{6, 0, 0xe4123456789abcde},
	}
	for _, c := range cases {
		if got := refcountAt(block, c.i, c.order); got != c.want {
			t.Errorf("order %d entry %d = %#x, want %#x", c.order, c.i, got, c.want)
		}
	}
}

func TestClusterMap(t *testing.T) {
	m, err := newClusterMap(5)
	if err != nil {
		t.Fatal(err)
	}
	for c := range uint64(5) {
		m.set(c, kind(c)|copiedBit)
	}
	m.set(2, kindFree)
	for c, want := range []kind{copiedBit, 1 | copiedBit, kindFree, 3 | copiedBit, 4 | copiedBit} {
		if got := m.get(uint64(c)); got != want {
			t.Errorf("cluster %d: %v, want %v", c, got, want)
		}
	}
	if _, err := newClusterMap(1 << 62); err == nil {
		t.Error("a map of 2^62 clusters was allowed")
	}
}
