package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clkTck is USER_HZ, the unit of the times in /proc/<pid>/stat. It is 100
// on every Linux architecture Go supports.
const clkTck = 100

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	ppid       int
	cpuSeconds float64 // utime + stime
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may contain spaces: fields
	// start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return procStat{ppid: ppid, cpuSeconds: (ut + st) / clkTck}, nil
}

// descendants returns pid and every process below it (nginx: master and
// workers).
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(p)
		if err != nil {
			continue
		}
		children[st.ppid] = append(children[st.ppid], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// cpuSeconds sums utime+stime of pids (all threads of each process).
func cpuSeconds(pids []int) float64 {
	var s float64
	for _, p := range pids {
		if st, err := readProcStat(p); err == nil {
			s += st.cpuSeconds
		}
	}
	return s
}

// statusKiB reads a "Key: N kB" line of /proc/<pid>/status.
func statusKiB(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}

// resetHWM makes VmHWM start again from the current RSS (clear_refs 5).
func resetHWM(pids []int) {
	for _, p := range pids {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p), []byte("5"), 0)
	}
}

// sumKiB sums a status field over pids, in bytes.
func sumKiB(pids []int, key string) int64 {
	var s int64
	for _, p := range pids {
		s += statusKiB(p, key)
	}
	return s << 10
}

// machineCPU is the busy time of the whole machine so far (every CPU, not
// idle or iowait), from /proc/stat.
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	// cpu user nice system idle iowait irq softirq steal guest guest_nice
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest is inside user
			continue
		}
		x, _ := strconv.ParseFloat(v, 64)
		busy += x
	}
	return busy / clkTck
}

// meter measures a server over one measured interval: CPU seconds of its
// processes, their peak RSS (VmHWM after a reset, summed over processes,
// and the highest sampled sum of VmRSS every 50 ms), and the machine's busy
// CPU seconds.
type meter struct {
	pids     func() []int
	cpu0     float64
	machine0 float64
	start    time.Time
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	sampled  int64
}

type usage struct {
	Wall       float64 // seconds
	CPU        float64 // server CPU seconds
	MachineCPU float64 // whole machine busy CPU seconds
	PeakRSS    int64   // bytes: max(sum of VmHWM, sampled sum of VmRSS)
}

func startMeter(pids func() []int) *meter {
	m := &meter{pids: pids, stop: make(chan struct{}), done: make(chan struct{})}
	ps := pids()
	resetHWM(ps)
	m.sampled = sumKiB(ps, "VmRSS")
	m.cpu0 = cpuSeconds(ps)
	m.machine0 = machineCPU()
	m.start = time.Now()
	go func() {
		defer close(m.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		n := 0
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				n++
				if n%20 == 0 { // nginx may start a worker; look again every second
					ps = pids()
				}
				r := sumKiB(ps, "VmRSS")
				m.mu.Lock()
				m.sampled = max(m.sampled, r)
				m.mu.Unlock()
			}
		}
	}()
	return m
}

func (m *meter) end() usage {
	wall := time.Since(m.start).Seconds()
	ps := m.pids()
	cpu := cpuSeconds(ps) - m.cpu0
	mc := machineCPU() - m.machine0
	hwm := sumKiB(ps, "VmHWM")
	close(m.stop)
	<-m.done
	m.mu.Lock()
	peak := max(m.sampled, hwm)
	m.mu.Unlock()
	return usage{Wall: wall, CPU: cpu, MachineCPU: mc, PeakRSS: peak}
}

// otherLoad lists processes that compete for the machine and are not ours:
// fuzzers (go test -fuzz, or their workers with -test.fuzz…), other test
// runs and test binaries, the Go compiler.
func otherLoad() []string {
	self := os.Getpid()
	mine := map[int]bool{}
	for _, p := range descendants(self) {
		mine[p] = true
	}
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || mine[p] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		argv0, _, _ := strings.Cut(cmd, " ")
		if strings.Contains(cmd, "-fuzz") || strings.Contains(cmd, "test.fuzz") || strings.HasPrefix(cmd, "go test") ||
			strings.HasSuffix(argv0, ".test") || strings.HasSuffix(argv0, "/compile") || strings.HasSuffix(argv0, "/link") {
			if len(cmd) > 120 {
				cmd = cmd[:120] + "…"
			}
			out = append(out, fmt.Sprintf("%d %s", p, cmd))
		}
	}
	return out
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
