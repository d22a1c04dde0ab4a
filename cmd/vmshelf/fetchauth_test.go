package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSecret writes content to a 0600 file: how these tests hand a token
// to curl and nbdkit without putting it on a command line.
func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestE2EFetchByUploadID: through the serve binary, the fetch URL that
// names only the image (/market/vm-images/fetch/{upload_id}) serves the
// image to the token in Authorization (Bearer, or the basic-auth password
// of any user), to curl and to nbdkit's curl plugin as CDI's importer runs
// it; without a credential it is 401; and serve's output (debug level, a
// request head fasthttp cannot parse included) never holds the token or
// its basic-auth encoding.
func TestE2EFetchByUploadID(t *testing.T) {
	needTool(t, "curl")
	needTool(t, "nbdkit")
	needTool(t, "qemu-img")
	needTool(t, "qemu-io")
	work := t.TempDir()
	// debug: the range reads' lines are written too.
	s := startServe(t, filepath.Join(work, "data"), []string{"--log-level", "debug"})
	disk, diskBytes := makeImage(t, work, "disk.qcow2")
	img := s.upload(t, s.ticket(t, "disk"), disk, diskBytes)
	token := path.Base(s.fetchURL(t, img.UploadID)) // fetch-url prints the path form
	cred := base64.StdEncoding.EncodeToString([]byte("anyuser:" + token))
	s.secret(cred)
	url := s.dataBase + "/market/vm-images/fetch/" + img.UploadID

	bearer := writeSecret(t, "headers", "Authorization: Bearer "+token+"\n")
	if code, body := curl(t, "-H", "@"+bearer, url); code != http.StatusOK || !bytes.Equal(body, diskBytes) {
		t.Fatalf("curl -H @file (Bearer): %d, %d bytes, want 200 and the image", code, len(body))
	}
	if code, body := curl(t, "-H", "@"+bearer, "-r", "0-99", url); code != http.StatusPartialContent || !bytes.Equal(body, diskBytes[:100]) {
		t.Fatalf("curl -H @file -r 0-99: %d, %d bytes, want 206 and 100 bytes", code, len(body))
	}
	// curl -u anyuser:TOKEN, from a config file.
	userCfg := writeSecret(t, "curlrc", `user = "anyuser:`+token+`"`+"\n")
	if code, body := curl(t, "-K", userCfg, url); code != http.StatusOK || !bytes.Equal(body, diskBytes) {
		t.Fatalf("curl -u anyuser:TOKEN: %d, %d bytes, want 200 and the image", code, len(body))
	}
	code, body := curl(t, url)
	wantError(t, "the upload-id URL without a credential", code, body, http.StatusUnauthorized, "unauthorized")

	// nbdkit's curl plugin under qemu-img, the headers as CDI gives them
	// (CDI passes header=; header-script= keeps the token off the command
	// line and sends the same).
	headers := writeSecret(t, "nbdkit-headers", "User-Agent: cdi-nbdkit-importer\nAuthorization: Bearer "+token+"\n")
	sock := filepath.Join(work, "nbd.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nbd := exec.CommandContext(ctx, "nbdkit", "--foreground", "--readonly", "--exit-with-parent", "-U", sock,
		"--filter=readahead", "--filter=retry", "curl", "retry-exponential=no", "header-script=cat "+headers, "url="+url)
	var nbdErr bytes.Buffer
	nbd.Stderr = &nbdErr
	if err := nbd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { nbd.Process.Kill(); nbd.Wait() }()
	poll(t, 400, 25*time.Millisecond, "nbdkit's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	raw := filepath.Join(work, "disk.raw")
	if r := runWithin(t, 2*time.Minute, nil, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", "nbd+unix:///?socket="+sock, raw); r.code != 0 {
		t.Fatalf("qemu-img convert over nbdkit: exit %d: %s\nnbdkit: %s", r.code, r.stderr, nbdErr.String())
	}
	if r := runCmd(t, nil, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", disk, raw); r.code != 0 {
		t.Fatalf("qemu-img compare: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	// A head fasthttp cannot parse, carrying the credential both ways: it
	// quotes the head in its own line and in serve's refusal line.
	c, err := net.DialTimeout("tcp", s.dataAddr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "GET /market/vm-images/fetch/"+img.UploadID+" HTTP/1.1\r\nHost: x\r\n"+
		"Authorization: Basic "+cred+"\r\nAuthorization: Bearer "+token+"\r\nthis line has no colon\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("broken head: no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("broken head: %d, want 400", resp.StatusCode)
	}
	poll(t, 400, 25*time.Millisecond, "fasthttp's line about the broken head", func() bool {
		return strings.Contains(s.logs(), "this line has no colon") && strings.Contains(s.logs(), "component=fasthttp")
	})
	for _, l := range strings.Split(s.logs(), "\n") {
		if strings.Contains(l, "this line has no colon") && !strings.Contains(l, "Authorization: [redacted]") {
			t.Errorf("a line quoting the broken head does not show Authorization as [redacted]: %s", l)
		}
	}
	s.stop() // the shutdown's lines too; stop checks the noted secrets
	logs := s.logs()
	for what, v := range map[string]string{"fetch token": token, "basic-auth credential": cred} {
		for i := 0; i+16 <= len(v); i++ {
			if strings.Contains(logs, v[i:i+16]) {
				t.Errorf("serve's output holds part of the %s:\n%s", what, logs)
				break
			}
		}
	}
}
