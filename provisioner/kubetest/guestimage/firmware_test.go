package guestimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/bootdisk"
	"github.com/vmshelf/vmshelf/qcow2"
)

// The firmware a machine of KubeVirt's starts with: SeaBIOS (Debian's
// qemu-system-x86 default) or OVMF with secure boot off.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// What the serial port shows: the kernel's first line once a boot loader
// started it (the guests' GRUB passes console=ttyS0), or the firmware's
// refusal. SeaBIOS writes to the serial port only without graphics. A
// first sector with the boot signature and no boot code has no refusal of
// its own: SeaBIOS says it boots from it and then runs the zeros, so
// silence that long after its words is the refusal.
var (
	kernelStarted = "Linux version"
	biosJumped    = "Booting from Hard Disk..."
	hungFor       = 20 * time.Second
	refusals      = map[bootdisk.Firmware][]string{
		bootdisk.BIOS: {"No bootable device", "Boot failed: not a bootable disk"},
		bootdisk.UEFI: {"Shell>", "BdsDxe: failed to load Boot"},
	}
)

// TestBootFirmwareAgreesWithCheck holds the edge's boot check (bootdisk,
// through qcow2.Guest, as the data plane runs it on an upload) to the
// firmware itself: each guest disk boots in QEMU with SeaBIOS and with
// OVMF, and where the check says a firmware could start it, that firmware
// reaches the kernel; where it says it could not, the firmware refuses.
// The boot test's orders rely on these verdicts instead of booting the
// disks that cannot start.
func TestBootFirmwareAgreesWithCheck(t *testing.T) {
	needTools(t)
	for _, tool := range []string{"qemu-system-x86_64", ovmfCode, ovmfVars} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat(tool); err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatalf("%s is missing (.ci/deps installs qemu-system-x86 and ovmf)", tool)
				}
				t.Skipf("%s is missing (apt-get install qemu-system-x86 ovmf)", tool)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := Ensure(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	want := map[Kind]bootdisk.Firmware{BIOS: bootdisk.BIOS, EFI: bootdisk.UEFI, NoBootLoader: bootdisk.None}
	// Two machines at a time: one a core under emulation.
	slots := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, k := range Kinds {
		verdict := checkDisk(t, s.Path(k))
		if verdict != want[k] {
			t.Errorf("%s: the boot check says %v, want %v", k, verdict, want[k])
		}
		for _, fw := range []bootdisk.Firmware{bootdisk.BIOS, bootdisk.UEFI} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slots <- struct{}{}
				defer func() { <-slots }()
				started, shown := bootWith(t, ctx, s.Path(k), fw)
				t.Logf("%s disk, %v firmware: the check says %v; the serial port shows %q", k, fw, verdict, shown)
				if started != verdict.Has(fw) {
					t.Errorf("%s disk with %v: the kernel started %v, the boot check said %v", k, fw, started, verdict)
				}
			}()
		}
	}
	wg.Wait()
}

// checkDisk is the data plane's boot check of the QCOW2 at path.
func checkDisk(t *testing.T, path string) bootdisk.Firmware {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := qcow2.Inspect(f, st.Size(), qcow2.Limits{MaxVirtualSize: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	verdict, err := bootdisk.StartsQCOW2(f, st.Size(), h)
	if err != nil {
		t.Fatal(err)
	}
	return verdict
}

// bootWith starts QEMU (TCG, no graphics, the disk as a snapshot so the
// cached image never changes) with fw and reads its serial port until the
// kernel starts or the firmware refuses, at most two minutes. It returns
// whether the kernel started and the words that decided.
func bootWith(t *testing.T, ctx context.Context, disk string, fw bootdisk.Firmware) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args := []string{"-machine", "q35,accel=tcg,graphics=off", "-m", "512", "-display", "none", "-no-reboot", "-nodefaults",
		"-serial", "stdio", "-net", "none",
		"-drive", fmt.Sprintf("file=%s,format=qcow2,if=virtio,snapshot=on", disk)}
	if fw == bootdisk.UEFI {
		vars := filepath.Join(t.TempDir(), "vars.fd")
		b, err := os.ReadFile(ovmfVars)
		if err != nil {
			t.Error(err)
			return false, ""
		}
		if err := os.WriteFile(vars, b, 0o600); err != nil {
			t.Error(err)
			return false, ""
		}
		args = append(args, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	out := &watch{found: make(chan string, 1), words: append([]string{kernelStarted}, refusals[fw]...)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return false, ""
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case w := <-out.found:
			return w == kernelStarted, w
		case <-tick.C:
			if fw == bootdisk.BIOS && out.quietAfter(biosJumped, hungFor) {
				return false, fmt.Sprintf("%s and nothing for %s", biosJumped, hungFor)
			}
		case <-ctx.Done():
			t.Errorf("%s with %v: neither the kernel nor the firmware's refusal on the serial port in 2 minutes; its end:\n%s",
				filepath.Base(disk), fw, out.tail())
			return false, ""
		}
	}
}

// watch is QEMU's output: it says the first of words that appears.
type watch struct {
	mu    sync.Mutex
	buf   strings.Builder
	last  time.Time // of the last write
	words []string
	found chan string
	done  bool
}

// quietAfter says whether the output ends in marker and has not grown for d.
func (w *watch) quietAfter(marker string, d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.HasSuffix(strings.TrimSpace(w.buf.String()), marker) && time.Since(w.last) >= d
}

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = time.Now()
	if w.buf.Len() < 1<<20 {
		w.buf.Write(p)
	}
	if !w.done {
		s := w.buf.String()
		for _, word := range w.words {
			if strings.Contains(s, word) {
				w.done = true
				w.found <- word
				break
			}
		}
	}
	return len(p), nil
}

func (w *watch) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.buf.String()
	return s[max(0, len(s)-2000):]
}
