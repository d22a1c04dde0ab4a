package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// perfRec is a `perf record` of a server's processes for one run, made
// only with -perf DIR: a diagnosis aid. Sampling costs the server a little
// CPU, so the numbers of a -perf run are not the ones to quote.
type perfRec struct {
	cmd *exec.Cmd
	out string
}

func (b *bench) startPerf(name string, pids []int) *perfRec {
	if b.opt.perfDir == "" {
		return nil
	}
	if err := os.MkdirAll(b.opt.perfDir, 0o755); err != nil {
		b.fail("perf: %v", err)
		return nil
	}
	list := ""
	for i, p := range pids {
		if i > 0 {
			list += ","
		}
		list += strconv.Itoa(p)
	}
	out := filepath.Join(b.opt.perfDir, fmt.Sprintf("%s-%s.data", name, time.Now().Format("150405.000")))
	cmd := exec.Command("perf", "record", "-F", "999", "-g", "-p", list, "-o", out)
	if err := cmd.Start(); err != nil {
		b.fail("perf record: %v", err)
		return nil
	}
	time.Sleep(300 * time.Millisecond) // let it attach
	return &perfRec{cmd: cmd, out: out}
}

func (p *perfRec) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
	logf("    perf profile: %s (perf report -i %s --children)", p.out, p.out)
}
