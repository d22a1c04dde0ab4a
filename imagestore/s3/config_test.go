package s3

import (
	"strings"
	"testing"
)

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

func TestPayloadSigningFromEnv(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    PayloadSigning
		wantErr bool
	}{
		{"", PayloadAuto, false},
		{"auto", PayloadAuto, false},
		{"signed", PayloadSigned, false},
		{"unsigned", PayloadUnsigned, false},
		{"Unsigned", "", true},
		{"none", "", true},
	} {
		env := map[string]string{"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s", PayloadSigningEnv: tc.value}
		cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), PayloadSigningEnv) {
				t.Errorf("%s=%q: error %v, want one naming the variable", PayloadSigningEnv, tc.value, err)
			}
			continue
		}
		if err != nil || cfg.PayloadSigning != tc.want {
			t.Errorf("%s=%q: %q, %v; want %q", PayloadSigningEnv, tc.value, cfg.PayloadSigning, err, tc.want)
		}
	}
	for _, tc := range []struct {
		p              PayloadSigning
		secure, unsign bool
	}{
		{PayloadAuto, true, true},
		{PayloadAuto, false, false},
		{PayloadSigned, true, false},
		{PayloadUnsigned, false, true},
	} {
		if got := tc.p.unsigned(tc.secure); got != tc.unsign {
			t.Errorf("%q.unsigned(secure=%v) = %v, want %v", tc.p, tc.secure, got, tc.unsign)
		}
	}
}
