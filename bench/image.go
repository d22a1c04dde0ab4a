package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
)

// makeImage writes a fully allocated QCOW2 image of size bytes of virtual
// disk with incompressible data: a raw file of pseudo-random bytes (seeded,
// so every run uploads the same bytes, and no two clusters are equal) that
// qemu-img converts to QCOW2 with 64 KiB clusters; qemu-img check verifies
// it. No zero clusters, nothing a disk or a link could compress or dedupe.
func makeImage(path string, size int64, seed uint64) error {
	raw := path + ".raw"
	defer os.Remove(raw)
	if err := writeRandom(raw, size, seed); err != nil {
		return err
	}
	out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=65536", raw, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img convert: %v: %s", err, out)
	}
	os.Remove(raw)
	if out, err := exec.Command("qemu-img", "check", "-q", path).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img check: %v: %s", err, out)
	}
	syscall.Sync()
	return nil
}

func writeRandom(path string, n int64, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'v', 'm', 's', 'h', 'e', 'l', 'f'})
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := io.CopyN(w, r, n); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sha256File(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
