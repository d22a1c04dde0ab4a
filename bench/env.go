package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
)

// machine fills the report's machine table.
func machine(r *Report, dataDir, nginxBin, tusdBin string) {
	r.setMachine("CPUs (nproc)", fmt.Sprint(runtime.NumCPU()))
	r.setMachine("CPU model", cpuModel())
	r.setMachine("memory", memTotal())
	r.setMachine("kernel", firstLine(cmdOut("uname", "-srm")))
	r.setMachine("data directory", dataDir+" — "+fsInfo(dataDir))
	r.setMachine("dirty page limits", "vm.dirty_ratio "+readTrim("/proc/sys/vm/dirty_ratio")+"%, vm.dirty_background_ratio "+readTrim("/proc/sys/vm/dirty_background_ratio")+"%")
	r.setMachine("Go", firstLine(cmdOut("go", "version")))
	r.setMachine("nginx", strings.TrimPrefix(firstLine(cmdOut(nginxBin, "-v")), "nginx version: "))
	r.setMachine("tusd", tusdVersion(tusdBin))
	r.setMachine("curl", firstLine(cmdOut("curl", "--version")))
	r.setMachine("wrk", firstLine(cmdOut("wrk", "-v")))
	r.setMachine("qemu-img", firstLine(cmdOut("qemu-img", "--version")))
	r.setMachine("nbdkit", firstLine(cmdOut("nbdkit", "--version")))
	r.setMachine("load average at start", loadAvg())
}

func cmdOut(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model, flags := "", ""
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "flags":
			if flags == "" {
				flags = v
			}
		}
	}
	var ext []string
	for _, f := range []string{"sha_ni", "avx2", "avx512f", "hypervisor"} {
		if strings.Contains(" "+flags+" ", " "+f+" ") {
			ext = append(ext, f)
		}
	}
	if len(ext) > 0 {
		model += " (" + strings.Join(ext, ", ") + ")"
	}
	return model
}

func memTotal() string {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "?"
}

// fsInfo names the filesystem and device under dir (from /proc/mounts, the
// longest mount point that is a prefix of dir) and its free space.
func fsInfo(dir string) string {
	b, _ := os.ReadFile("/proc/mounts")
	best, desc := "", "?"
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		mp := f[1]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, desc = mp, fmt.Sprintf("%s on %s (%s, %s)", f[2], f[0], mp, f[3])
		}
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil {
		desc += fmt.Sprintf(", %.0f GiB free of %.0f GiB", float64(st.Bavail)*float64(st.Bsize)/(1<<30), float64(st.Blocks)*float64(st.Bsize)/(1<<30))
	}
	return desc
}

func fsType(dir string) string {
	b, _ := os.ReadFile("/proc/mounts")
	best, typ := "", ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, typ = mp, f[2]
		}
	}
	return typ
}

func tusdVersion(bin string) string {
	// tusd built with `go install` reports "n/a"; the module version is in
	// the binary's build info.
	out := cmdOut("go", "version", "-m", bin)
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/tus/tusd/v2" {
			return "tusd " + f[2] + " (" + bin + ")"
		}
	}
	return firstLine(cmdOut(bin, "-version")) + " (" + bin + ")"
}
