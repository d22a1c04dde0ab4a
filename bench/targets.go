package main

import (
	"fmt"
	"math"
)

// targets evaluates the targets from this run's tables.
func (b *bench) targets() {
	r := b.rep
	add := func(name, unit, op string, threshold float64, measured float64, from string) {
		t := Target{Name: name, Unit: unit, Op: op, Threshold: threshold, Measured: measured, From: from}
		switch {
		case math.IsNaN(measured):
			t.Missing = true
		case op == ">=":
			t.Met = measured >= threshold
		default:
			t.Met = measured <= threshold
		}
		r.Targets = append(r.Targets, t)
	}
	ratio := func(tableID, metric, subject, versus string) float64 {
		t := r.find(tableID)
		if t == nil {
			return nan
		}
		for _, q := range t.Ratios {
			if q.Metric == metric && q.Subject == subject && q.Versus == versus {
				return q.Ratio
			}
		}
		return nan
	}
	median := func(tableID, subject, metric string) float64 {
		t := r.find(tableID)
		if t == nil {
			return nan
		}
		s := t.stat(subject, metric)
		if s == nil || s.N == 0 {
			return nan
		}
		return s.Median
	}
	maxOf := func(tableID, subject, metric string) float64 {
		t := r.find(tableID)
		if t == nil {
			return nan
		}
		s := t.stat(subject, metric)
		if s == nil || s.N == 0 {
			return nan
		}
		return s.Max
	}

	add("upload throughput ÷ dd conv=fdatasync", "×", ">=", 0.9, ratio("upload", "durable", upVmshelf, upDD), "upload: MB/s until durable, ratio of medians")
	add("upload throughput ÷ dd, then fsync (the same bytes made durable by one fsync; extra check)", "×", ">=", 0.9, ratio("upload", "durable", upVmshelf, upDDBuf), "upload: MB/s until durable, ratio of medians")
	add("upload throughput ÷ nginx until durable", "×", ">=", 1.0, ratio("upload", "durable", upVmshelf, upNginx), "upload: MB/s until durable")
	add("upload throughput ÷ tusd until durable", "×", ">=", 1.0, ratio("upload", "durable", upVmshelf, upTusd), "upload: MB/s until durable")
	add("fetch throughput ÷ nginx (whole file, warm cache)", "×", ">=", 0.95, ratio("fetch_warm", "mbps", fVmshelf, fNginx), "fetch_warm: MB/s")
	add("fetch throughput ÷ nginx (whole file, cold cache)", "×", ">=", 0.95, ratio("fetch_cold", "mbps", fVmshelf, fNginx), "fetch_cold: MB/s")
	add("server CPU per GiB uploaded ÷ nginx's", "×", "<=", 1.2, ratio("upload", "cpu", upVmshelf, upNginx), "upload: server CPU s/GiB")
	// The 4 KiB figures are the tighter ones (CPU per request ≤ 1.2 ×
	// nginx's, in both client setups; req/s ≥ 0.85 × with the fixed
	// range): what importers read most; the 64 KiB ones keep the earlier
	// bounds.
	for _, block := range rangeSizes {
		id := rangeTableID(block)
		rps, cpu := 0.8, 1.5
		if block == 4<<10 {
			cpu = 1.2
		}
		add(fmt.Sprintf("%d KiB random range reads, %d connections: req/s ÷ nginx", block>>10, rangeConns), "×", ">=", rps, ratio(id, "rps", fVmshelf, fNginx), id+": req/s")
		add(fmt.Sprintf("%d KiB random range reads, %d connections: server CPU per request ÷ nginx", block>>10, rangeConns), "×", "<=", cpu, ratio(id, "cpureq", fVmshelf, fNginx), id+": server CPU µs/req")
	}
	add(fmt.Sprintf("4 KiB fixed range, %d connections, wrk -t%d, token in the path: req/s ÷ nginx", rangeConns, fixedThreads), "×", ">=", 0.85, ratio(fixedTableID, "rps", fVmshelf, fNginx), fixedTableID+": req/s")
	add(fmt.Sprintf("4 KiB fixed range, %d connections, wrk -t%d, token in the path: server CPU per request ÷ nginx", rangeConns, fixedThreads), "×", "<=", 1.2, ratio(fixedTableID, "cpureq", fVmshelf, fNginx), fixedTableID+": server CPU µs/req")
	add("importer, nbdkit curl + qemu-img convert (as CDI runs it): MB/s ÷ nginx", "×", ">=", 0.9, ratio(importerTableID(impNbdkit), "mbps", fVmshelf, fNginx), importerTableID(impNbdkit)+": MB/s")
	add(fmt.Sprintf("importer model, %d readers of %d KiB ranges: MB/s ÷ nginx", impReaders, impRange>>10), "×", ">=", 0.8, ratio(importerTableID(impModel), "mbps", fVmshelf, fNginx), importerTableID(impModel)+": MB/s")
	big := fmt.Sprintf("vmshelf, 4 × %d MiB uploads", b.opt.bigMiB)
	add(fmt.Sprintf("peak RSS, 4 concurrent %d MiB uploads + 4 fetches + 1 000 idle connections, fresh process (worst repetition)", b.opt.bigMiB), "MiB", "<=", 64,
		maxOf("concurrency", big, "rss"), "concurrency: peak RSS MiB, max over repetitions")
	add(fmt.Sprintf("the same with 4 × %d MiB, in a process that already ran (no restart; extra check)", b.opt.smallMiB), "MiB", "<=", 64,
		maxOf("concurrency", fmt.Sprintf("vmshelf, 4 × %d MiB uploads, no restart", b.opt.smallMiB), "rss"), "concurrency: peak RSS MiB, max over repetitions")
	add("415 after body bytes read (worst repetition)", "bytes", "<=", 64<<10, maxOf("refusal", ref415, "read"), "refusal: body bytes read")
	add("413 (Expect: 100-continue) with body bytes read (worst repetition)", "bytes", "<=", 0, maxOf("refusal", ref413, "read"), "refusal: body bytes read")
	add(fmt.Sprintf("ticket issue p99 at %d req/s", b.opt.controlQPS), "ms", "<=", 10, maxOf("control", fmt.Sprintf("ticket issue, %d req/s constant", b.opt.controlQPS), "p99"), "control: p99 ms, max over repetitions")
	slow := slowBodyClients(b.opt.quick)
	add(fmt.Sprintf("/healthz p99 under %d slow webhook bodies, generator at nice 19 (worst repetition)", slow), "ms", "<=", 100,
		maxOf("slowbody", slowBodyRow(slow, true), "p99"), "slowbody: p99 ms, max over repetitions")
	add("upload through S3 ÷ the S3 server's own PUT of the same bytes (minio-go)", "×", ">=", 0.8, ratio("s3", "mbps", s3Vmshelf, s3Direct), "s3: MB/s")
	add("fetch through S3 ÷ the S3 server's own GET (minio-go)", "×", ">=", 0.8, ratio("s3", "mbps", s3VmshelfGet, s3DirectGet), "s3: MB/s")
	add("peak RSS with 4 concurrent uploads through S3, fresh process (worst repetition)", "MiB", "<=", 96, maxOf("s3_rss", s3Concurrent, "rss"), "s3_rss: peak RSS MiB, max over repetitions")
	_ = median
}

// notes are the caveats a reader of the numbers needs.
func (b *bench) notes() {
	r := b.rep
	r.Notes = append(r.Notes,
		"Every server, the client and the bench share the 2 vCPUs, as a small edge box would; the client (curl, wrk) costs CPU the server then lacks, equally for every peer.",
		"Alternating order: repetition i runs the subjects rotated by i (ABC, BCA, CAB, …), so that drift of the noisy disk (or of other load) is spread over all subjects.",
		"“until durable” for nginx, tusd and buffered dd = answer time + the time of fsync(file) + fsync(directory) run by the bench right after the answer. vmshelf's 201 already means file fsync, rename and directory fsync.",
		"Server CPU counts only the server's processes. The kernel's writeback threads (flushing what nginx and tusd leave dirty) and the bench's fsync are not in it; vmshelf starts writeback of every 32 MiB itself (sync_file_range), which is accounted to vmshelf. The machine CPU column counts everything, the client included.",
		"The page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`, after `sync`) before every cold fetch; warm fetches and range reads read the file through first; uploads read the source file through first and `sync` before each run.",
		"The disk of a VM can change its speed several-fold between runs (other guests, host cache); compare ratios within one run rather than absolute numbers across runs. A subject that is CPU-bound (see *MB per server CPU-second*) keeps its speed while the disk limit moves, so its ratio to dd depends on which one is the bottleneck that day.",
		"Ratios are of medians; the paired range is the ratios of the repetitions paired in order (rep 1 with rep 1, …), i.e. of runs made minutes apart.",
	)
	if len(r.OtherLoad) > 0 {
		r.Notes = append(r.Notes, "Other work (fuzzers, tests or builds) ran during (part of) this run; see the top of the page.")
	}
}
