package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// curlResult is what `curl -w` reports about one transfer.
type curlResult struct {
	Code     int
	Total    float64 // seconds, curl's time_total
	Uploaded int64
	Download int64
	Body     string // response body (uploads only)
}

const curlW = "\n@@@ %{http_code} %{time_total} %{size_upload} %{size_download}\n"

// curl runs curl on url with args plus the -w trailer and parses the
// result. The URL and the headers (an upload ticket, a fetch token) go to
// curl as a config on stdin (-K -), never on its command line, which every
// user of the machine can read; so args and the errors here hold no secret.
func curl(timeout time.Duration, url string, headers []string, args ...string) (curlResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := append([]string{"-sS", "-w", curlW, "-K", "-"}, args...)
	cmd := exec.CommandContext(ctx, "curl", argv...)
	cmd.Stdin = strings.NewReader(curlConfig(url, headers))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	s := out.String()
	i := strings.LastIndex(s, "\n@@@ ")
	if i < 0 {
		return curlResult{}, fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	var r curlResult
	r.Body = s[:i]
	f := strings.Fields(s[i+5:])
	if len(f) < 4 {
		return r, fmt.Errorf("curl: bad -w output %q", s[i:])
	}
	r.Code, _ = strconv.Atoi(f[0])
	r.Total, _ = strconv.ParseFloat(f[1], 64)
	r.Uploaded, _ = strconv.ParseInt(f[2], 10, 64)
	r.Download, _ = strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return r, fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return r, nil
}

// curlConfig is a curl config file (the format of -K) naming url and the
// headers; none of them holds a double quote or a backslash.
func curlConfig(url string, headers []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "url = \"%s\"\n", url)
	for _, h := range headers {
		fmt.Fprintf(&b, "header = \"%s\"\n", h)
	}
	return b.String()
}

// curlPut uploads file with `curl -T` (streamed from the file; curl sends
// Expect: 100-continue for it) and extra arguments, to url.
func curlPut(file, url string, extra ...string) (curlResult, error) {
	return curl(30*time.Minute, url, nil, append([]string{"-T", file}, extra...)...)
}

// curlGet fetches url into nothing, with the headers.
func curlGet(url string, headers []string, extra ...string) (curlResult, error) {
	return curl(30*time.Minute, url, headers, append([]string{"-o", "/dev/null"}, extra...)...)
}

// runTimed runs argv and returns its wall time and the child's CPU seconds
// and max RSS (from rusage): dd is its own "server".
func runTimed(argv ...string) (wall, cpu float64, maxRSS int64, err error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	t0 := time.Now()
	if err = cmd.Start(); err != nil {
		return 0, 0, 0, err
	}
	// rusage's maxrss would count the bench's own memory (the child shares
	// it until exec), so VmHWM is polled while the child runs.
	done := make(chan struct{})
	var hwm atomic.Int64
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if v := statusKiB(cmd.Process.Pid, "VmHWM") << 10; v > hwm.Load() {
				hwm.Store(v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	wall = time.Since(t0).Seconds()
	if err != nil {
		return wall, 0, 0, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, errb.String())
	}
	ps := cmd.ProcessState
	cpu = (ps.UserTime() + ps.SystemTime()).Seconds()
	return wall, cpu, hwm.Load(), nil
}
