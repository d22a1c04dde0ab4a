package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

const (
	ref415      = "415 notQcow2: non-QCOW2 body, no Expect"
	ref413      = "413 tooLarge: Content-Length 64 GiB, Expect: 100-continue"
	ref413NoExp = "413 tooLarge: Content-Length 64 GiB, no Expect"
)

func (b *bench) phaseRefusal() error {
	t := b.rep.table("refusal", "Early refusal",
		"A raw TCP client sends the request headers, waits until the server has taken them off the socket, then sends the body in 4 KiB chunks, each only after the server "+
			"took the previous one off the socket (the socket's queues, from /proc/net/tcp, are empty) and 10 ms passed without an answer. "+
			"*read*: body bytes the client had sent when the answer arrived, minus what was still queued in the two sockets at that moment (an upper bound: the server's "+
			"lingering close may already drain more). *counted*: the delta of `vmshelf_transfer_bytes_total{direction=\"upload\"}`. *ms to answer*: from the first body byte "+
			"(from the headers, when no body byte was sent) to the first byte of the answer, so it includes the pacing (10 ms per chunk); *ms after the last byte*: from the last "+
			"write (body chunk or headers) to the answer, the server's own reaction time.",
		Metric{Key: "status", Label: "status", digits: 0},
		Metric{Key: "read", Label: "body bytes read", Unit: "bytes", Better: "lower", digits: 0},
		Metric{Key: "sent", Label: "body bytes sent", Unit: "bytes", Better: "lower", digits: 0},
		Metric{Key: "counted", Label: "counted in metrics", Unit: "bytes", digits: 0},
		Metric{Key: "ms", Label: "ms to answer (paced)", Unit: "ms", Better: "lower", digits: 2},
		Metric{Key: "ms_last", Label: "ms after the last byte sent", Unit: "ms", Better: "lower", digits: 2},
	)
	for _, s := range []string{ref415, ref413, ref413NoExp} {
		t.row(s, "vmshelf")
	}
	junk := make([]byte, 4096)
	for i := range junk {
		junk[i] = byte('A' + i%26) // text, not "QFI\xfb"
	}
	for r := range b.opt.reps {
		for _, s := range rotate([]string{ref415, ref413, ref413NoExp}, r) {
			logf("  refusal rep %d: %s", r+1, s)
			tk, err := b.vm.ticket("bench refusal")
			if err != nil {
				return err
			}
			u := strings.TrimPrefix(tk.UploadURL, "http://"+b.vm.dataAddr)
			var cl int64 = 64 << 20
			expect := false
			if s != ref415 {
				cl = 64 << 30
				expect = s == ref413
			}
			c0, _ := b.vm.metric(`vmshelf_transfer_bytes_total{direction="upload"}`)
			res, err := pacedPut(b.vm.dataAddr, u, cl, expect, junk, 4<<20)
			c1, _ := b.vm.metric(`vmshelf_transfer_bytes_total{direction="upload"}`)
			if err != nil {
				b.fail("refusal %s rep %d: %v", s, r+1, err)
				res = pacedResult{status: -1, read: -1, sent: -1, secs: nan, lastSecs: nan}
			}
			logf("    → %d %s after %d bytes (%.2f ms)", res.status, res.reason, res.sent, res.secs*1000)
			t.add(s, "vmshelf", "status", float64(res.status))
			t.add(s, "vmshelf", "read", float64(res.read))
			t.add(s, "vmshelf", "sent", float64(res.sent))
			t.add(s, "vmshelf", "counted", c1-c0)
			t.add(s, "vmshelf", "ms", res.secs*1000)
			t.add(s, "vmshelf", "ms_last", res.lastSecs*1000)
			if res.got100 {
				b.fail("refusal %s: the server answered 100 Continue before refusing", s)
			}
		}
	}
	return nil
}

type pacedResult struct {
	status   int
	reason   string
	sent     int64   // body bytes written before the answer arrived
	read     int64   // sent minus what was still queued in the sockets
	secs     float64 // from the first body byte (or the headers) to the answer
	lastSecs float64 // from the last write to the answer
	got100   bool
}

// pacedPut sends a PUT with Content-Length cl to path on addr and feeds the
// body chunk by chunk, each only once the server has read everything before
// it, until an answer arrives or limit bytes were sent.
func pacedPut(addr, path string, cl int64, expect bool, chunk []byte, limit int64) (pacedResult, error) {
	var res pacedResult
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return res, err
	}
	defer conn.Close()
	lport := conn.LocalAddr().(*net.TCPAddr).Port
	rport := conn.RemoteAddr().(*net.TCPAddr).Port
	hdr := "PUT " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: vmshelf-bench\r\nContent-Type: application/octet-stream\r\n" +
		"Content-Length: " + strconv.FormatInt(cl, 10) + "\r\n"
	if expect {
		hdr += "Expect: 100-continue\r\n"
	}
	hdr += "\r\n"

	type answer struct {
		at     time.Time
		status int
		reason string
		got100 bool
		err    error
	}
	answers := make(chan answer, 1)
	go func() {
		br := bufio.NewReader(conn)
		var a answer
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				a.err = err
				break
			}
			if a.at.IsZero() {
				a.at = time.Now()
			}
			if resp.StatusCode == http.StatusContinue {
				a.got100 = true
				a.at = time.Time{}
				continue
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			a.status = resp.StatusCode
			a.reason = string(body)
			if i := strings.Index(a.reason, `"reason":"`); i >= 0 {
				a.reason = a.reason[i+10:]
				a.reason, _, _ = strings.Cut(a.reason, `"`)
			}
			break
		}
		answers <- a
	}()

	t0 := time.Now()
	if _, err := conn.Write([]byte(hdr)); err != nil {
		return res, err
	}
	lastWrite := time.Now()
	drained := func() bool {
		ctx, _, ok1 := sockQueues(lport, rport)
		_, srx, ok2 := sockQueues(rport, lport)
		return ok1 && ok2 && ctx == 0 && srx == 0
	}
	wait := func(d time.Duration) (answer, bool) {
		select {
		case a := <-answers:
			return a, true
		case <-time.After(d):
			return answer{}, false
		}
	}
	waitDrained := func() (answer, bool) {
		end := time.Now().Add(3 * time.Second)
		for time.Now().Before(end) {
			if drained() {
				// Give the server a moment to answer before the next chunk.
				return wait(10 * time.Millisecond)
			}
			if a, ok := wait(200 * time.Microsecond); ok {
				return a, true
			}
		}
		// The server stopped reading without answering: wait for it.
		return wait(10 * time.Second)
	}
	first := true
	a, ok := waitDrained()
	for !ok {
		if res.sent >= limit {
			return res, fmt.Errorf("no answer after %d body bytes", res.sent)
		}
		if first {
			t0, first = time.Now(), false
		}
		if expect && !a.got100 {
			// A client that asked first sends nothing before 100 Continue.
			a, ok = wait(10 * time.Second)
			if !ok {
				return res, fmt.Errorf("no answer to Expect: 100-continue within 10 s")
			}
			break
		}
		if _, err := conn.Write(chunk); err != nil {
			// The server may have closed after answering; the answer decides.
			if a, ok = wait(5 * time.Second); ok {
				break
			}
			return res, fmt.Errorf("write after %d bytes: %w", res.sent, err)
		}
		lastWrite = time.Now()
		res.sent += int64(len(chunk))
		a, ok = waitDrained()
	}
	// What was still in the sockets when the answer came.
	ctx, _, _ := sockQueues(lport, rport)
	_, srx, _ := sockQueues(rport, lport)
	res.read = max(res.sent-ctx-srx, 0)
	if a.err != nil {
		return res, fmt.Errorf("reading the answer: %w", a.err)
	}
	res.status, res.reason, res.got100 = a.status, a.reason, a.got100
	res.secs = a.at.Sub(t0).Seconds()
	res.lastSecs = a.at.Sub(lastWrite).Seconds()
	return res, nil
}

// sockQueues reads tx_queue and rx_queue of the IPv4 TCP socket with local
// port lport and remote port rport from /proc/net/tcp (loopback only).
func sockQueues(lport, rport int) (tx, rx int64, ok bool) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, 0, false
	}
	l := fmt.Sprintf(":%04X", lport)
	r := fmt.Sprintf(":%04X", rport)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasSuffix(f[1], l) || !strings.HasSuffix(f[2], r) {
			continue
		}
		txs, rxs, _ := strings.Cut(f[4], ":")
		t, _ := strconv.ParseInt(txs, 16, 64)
		x, _ := strconv.ParseInt(rxs, 16, 64)
		return t, x, true
	}
	return 0, 0, false
}
