package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Upload subjects, in the order of the first repetition.
const (
	upDD       = "dd conv=fdatasync"
	upDDBuf    = "dd, then fsync"
	upLoopback = "loopback → discard"
	upVmshelf  = "vmshelf PUT"
	upNginx    = "nginx dav PUT"
	upTusd     = "tusd PATCH"
)

func (b *bench) phaseUpload() error {
	t := b.rep.table("upload", fmt.Sprintf("Upload of the %d MiB test file", b.size>>20),
		"Sequential write of the same file by every subject, source file in the page cache (read through before each run), `sync` before each run. "+
			"*dd conv=fdatasync*: `dd if=file of=<same disk> bs=1M conv=fdatasync`, the limit of the disk; *dd, then fsync*: the same without conv, then fsync by the bench; "+
			"*loopback → discard*: `curl -T file` into a Go net/http server (a separate process) that reads the body into nothing, the limit of client + loopback; "+
			"*vmshelf PUT*: `curl -T file <upload URL>`, full checks + SHA-256 + writeback every 32 MiB + fsync + rename, 201 with the image JSON (its sha256 is checked); "+
			"*nginx dav PUT*: `curl -T file http://…/up/<name>` (body to client_body_temp_path, renamed into place, 201); "+
			"*tusd PATCH*: creation POST untimed, then `curl -T file -X PATCH -H 'Tus-Resumable: 1.0.0' -H 'Upload-Offset: 0' -H 'Content-Type: application/offset+octet-stream'` (204). "+
			"*until durable*: vmshelf answers 201 after fsync + rename + directory fsync, so its answer time is its durable time; nginx and tusd never fsync, so their answer time "+
			"plus an fsync of the stored file and its directory (timed by the bench right after the answer) is theirs; dd conv=fdatasync includes its fdatasync. "+
			"*answered*: time until the client had the answer. CPU: utime+stime of the server's processes (nginx: master + workers; dd: dd itself) over the run; "+
			"machine CPU: all busy CPU time of the machine (client, kernel writeback threads, fsync) over answer + fsync. Peak RSS: VmHWM (reset per run) and VmRSS sampled every 50 ms, summed over the server's processes. "+
			"*MB per server CPU-second*: the file size over the server's CPU time, the throughput a server that does its work on one core could reach at most if that core were its limit.",
		Metric{Key: "durable", Label: "MB/s until durable", Unit: "MB/s", Better: "higher", digits: 0},
		Metric{Key: "answered", Label: "MB/s answered", Unit: "MB/s", Better: "higher", digits: 0},
		Metric{Key: "fsync", Label: "fsync after answer s", Unit: "s", digits: 2},
		Metric{Key: "cpu", Label: "server CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 2},
		Metric{Key: "percpu", Label: "MB per server CPU-second", Unit: "MB/s", Better: "higher", digits: 0},
		Metric{Key: "mcpu", Label: "machine CPU s/GiB", Unit: "s/GiB", Better: "lower", digits: 2},
		Metric{Key: "rss", Label: "server peak RSS MiB", Unit: "MiB", Better: "lower", digits: 1},
	)
	roles := map[string]string{upDD: "limit", upDDBuf: "limit", upLoopback: "limit", upVmshelf: "vmshelf", upNginx: "peer", upTusd: "peer"}
	subjects := []string{upDD, upDDBuf, upLoopback, upVmshelf, upNginx, upTusd}
	for _, s := range subjects { // fixed row order in the table
		t.row(s, roles[s])
	}
	for r := range b.opt.reps {
		for _, s := range rotate(subjects, r) {
			logf("  upload rep %d: %s", r+1, s)
			m, err := b.uploadOnce(s, r)
			if err != nil {
				b.fail("upload %s rep %d: %v", s, r+1, err)
				m = uploadRun{answered: nan, fsync: nan, use: usage{CPU: nan, MachineCPU: nan, PeakRSS: -1}}
			}
			sz := float64(b.size)
			t.add(s, roles[s], "answered", sz/m.answered/mb)
			durable := m.answered + m.fsync
			if s == upLoopback {
				durable = nan
			}
			t.add(s, roles[s], "durable", sz/durable/mb)
			t.add(s, roles[s], "fsync", m.fsync)
			t.add(s, roles[s], "cpu", m.use.CPU/(sz/gib))
			t.add(s, roles[s], "percpu", sz/m.use.CPU/mb)
			t.add(s, roles[s], "mcpu", m.use.MachineCPU/(sz/gib))
			rss := float64(m.use.PeakRSS) / mib
			if m.use.PeakRSS < 0 {
				rss = nan
			}
			t.add(s, roles[s], "rss", rss)
		}
	}
	t.ratio("durable", upVmshelf, upDD, "durable")
	t.ratio("durable", upVmshelf, upDDBuf, "durable")
	t.ratio("durable", upVmshelf, upNginx, "durable")
	t.ratio("durable", upVmshelf, upTusd, "durable")
	t.ratio("answered", upVmshelf, upNginx, "answered")
	t.ratio("answered", upVmshelf, upTusd, "answered")
	t.ratio("cpu", upVmshelf, upNginx, "cpu")
	t.ratio("cpu", upVmshelf, upTusd, "cpu")
	t.ratio("mcpu", upVmshelf, upNginx, "mcpu")
	t.ratio("rss", upVmshelf, upNginx, "rss")
	t.ratio("rss", upVmshelf, upTusd, "rss")
	return nil
}

type uploadRun struct {
	answered float64 // seconds until the answer
	fsync    float64 // seconds of the fsync after it (0 if the answer was durable)
	use      usage
}

func (b *bench) uploadOnce(subject string, r int) (uploadRun, error) {
	var out uploadRun
	switch {
	case subject == upLoopback && b.disc == nil, subject == upNginx && b.ngx == nil, subject == upTusd && b.tus == nil:
		return out, fmt.Errorf("not running")
	}
	if err := warm(b.file); err != nil {
		return out, err
	}
	switch subject {
	case upDD, upDDBuf:
		dst := filepath.Join(b.dir, "dd.out")
		defer os.Remove(dst)
		argv := []string{"dd", "if=" + b.file, "of=" + dst, "bs=1M", "status=none"}
		if subject == upDD {
			argv = append(argv, "conv=fdatasync")
		}
		settle()
		mc0 := machineCPU()
		wall, cpu, maxRSS, err := runTimed(argv...)
		if err != nil {
			return out, err
		}
		out.answered = wall
		if subject == upDDBuf {
			if out.fsync, err = fsyncPath(dst); err != nil {
				return out, err
			}
		}
		out.use = usage{Wall: wall, CPU: cpu, MachineCPU: machineCPU() - mc0, PeakRSS: maxRSS}
		return out, checkSize(dst, b.size)

	case upLoopback:
		settle()
		m := startMeter(b.disc.pids)
		res, err := curlPut(b.file, "http://"+b.disc.addr+"/")
		out.use = m.end()
		if err != nil {
			return out, err
		}
		if res.Code != 201 || res.Uploaded != b.size {
			return out, fmt.Errorf("discard answered %d after %d bytes", res.Code, res.Uploaded)
		}
		out.answered = res.Total
		return out, nil

	case upVmshelf:
		tk, err := b.vm.ticket(fmt.Sprintf("bench upload %d", r))
		if err != nil {
			return out, err
		}
		settle()
		pr := b.startPerf("upload", b.vm.pids())
		m := startMeter(b.vm.pids)
		res, err := curlPut(b.file, tk.UploadURL)
		out.use = m.end()
		pr.stop()
		if err != nil {
			return out, err
		}
		if res.Code != 201 {
			return out, fmt.Errorf("vmshelf answered %d: %s", res.Code, res.Body)
		}
		var img struct {
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		}
		if err := json.Unmarshal([]byte(res.Body), &img); err != nil || img.SHA256 != b.sha || img.Size != b.size {
			return out, fmt.Errorf("vmshelf stored something else: %s (%v)", res.Body, err)
		}
		out.answered = res.Total
		if err := checkSize(b.vm.imagePath(tk.UploadID), b.size); err != nil {
			return out, err
		}
		return out, b.vm.remove(tk.UploadID)

	case upNginx:
		name := fmt.Sprintf("b-%d-%d.qcow2", r, time.Now().UnixNano())
		path := filepath.Join(b.ngx.davRoot, "up", name)
		defer os.Remove(path)
		settle()
		m := startMeter(b.ngx.pids)
		res, err := curlPut(b.file, "http://"+b.ngx.addr+"/up/"+name)
		if err != nil {
			m.end()
			return out, err
		}
		fs, ferr := fsyncPath(path)
		out.use = m.end()
		if res.Code != 201 {
			return out, fmt.Errorf("nginx answered %d: %s", res.Code, res.Body)
		}
		if ferr != nil {
			return out, ferr
		}
		out.answered, out.fsync = res.Total, fs
		return out, checkSize(path, b.size)

	case upTusd:
		url, path, err := b.tus.create(b.size)
		if err != nil {
			return out, err
		}
		defer os.Remove(path)
		defer os.Remove(path + ".info")
		settle()
		m := startMeter(b.tus.pids)
		res, err := curlPut(b.file, url, "-X", "PATCH", "-H", "Tus-Resumable: 1.0.0", "-H", "Upload-Offset: 0",
			"-H", "Content-Type: application/offset+octet-stream")
		if err != nil {
			m.end()
			return out, err
		}
		fs, ferr := fsyncPath(path)
		out.use = m.end()
		if res.Code != 204 {
			return out, fmt.Errorf("tusd answered %d: %s", res.Code, res.Body)
		}
		if ferr != nil {
			return out, ferr
		}
		out.answered, out.fsync = res.Total, fs
		return out, checkSize(path, b.size)
	}
	return out, fmt.Errorf("unknown subject %q", subject)
}

func checkSize(path string, want int64) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Size() != want {
		return fmt.Errorf("%s has %d bytes, want %d", path, st.Size(), want)
	}
	return nil
}
