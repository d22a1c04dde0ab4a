package s3

import "testing"

func TestPartSizeFor(t *testing.T) {
	const mib, gib = 1 << 20, 1 << 30
	for _, tc := range []struct{ max, floor, want int64 }{
		{0, DefaultPartFloor, DefaultPartFloor},
		{32 * gib, DefaultPartFloor, DefaultPartFloor}, // 32 GiB / 9 999 ≈ 3.3 MiB
		{32 * gib, minPartSize, minPartSize},
		{100 * gib, DefaultPartFloor, 11 * mib}, // 10.24 MiB, rounded up
		{5 << 40, DefaultPartFloor, 525 * mib},
	} {
		got := partSizeFor(tc.max, tc.floor)
		if got != tc.want {
			t.Errorf("partSizeFor(%d, %d) = %d, want %d", tc.max, tc.floor, got, tc.want)
		}
		if got*(maxParts-1) < tc.max {
			t.Errorf("partSizeFor(%d) = %d: needs more than %d parts", tc.max, got, maxParts-1)
		}
	}
}
