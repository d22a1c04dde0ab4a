package gateway

import (
	"crypto/sha256"
	"encoding"
	"testing"
)

// Resuming an upload's SHA-256 after a restart: restoring the saved hash
// state (what the gateway does) against hashing again what was written
// (per byte of the image so far). Run with -bench Resume.
func BenchmarkResumeFromHashState(b *testing.B) {
	h := sha256.New()
	h.Write(make([]byte, 1<<20))
	state, _ := h.(encoding.BinaryMarshaler).MarshalBinary()
	b.ReportAllocs()
	for b.Loop() {
		r := sha256.New()
		if err := r.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
			b.Fatal(err)
		}
		s, _ := r.(encoding.BinaryMarshaler).MarshalBinary()
		_ = s
	}
}

func BenchmarkResumeByRehashing(b *testing.B) {
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		h := sha256.New()
		h.Write(buf)
	}
}
