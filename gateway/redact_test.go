package gateway

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// TestRedactHead: what fasthttp's quoted heads become in a log line.
func TestRedactHead(t *testing.T) {
	tok := strings.Repeat("0123456789abcdef", 4)
	b64 := base64.StdEncoding.EncodeToString([]byte("u:" + tok))
	for _, c := range []struct {
		name, in string
		want     string // in the output
		not      []string
	}{
		{"quoted basic", fmt.Sprintf(`contents: "GET / HTTP/1.1\r\nAuthorization: Basic %s\r\nHost: x\r\n"`, b64),
			`Authorization: [redacted]\r\nHost: x\r\n"`, []string{b64[:16], "Basic"}},
		{"quoted bearer, lower case name", fmt.Sprintf(`"authorization:Bearer %s\r\n"`, tok),
			`authorization: [redacted]\r\n"`, []string{tok[:16], "Bearer"}},
		{"value with escapes", `"Authorization: Basic a\"b\\c\x00d\r\nHost: x"`, `Authorization: [redacted]\r\nHost: x"`, []string{`a\"b`}},
		{"proxy authorization and cookie", `"Proxy-Authorization: Basic abc\r\nCookie: s=1\r\n"`,
			`Proxy-Authorization: [redacted]\r\nCookie: [redacted]\r\n`, []string{"abc", "s=1"}},
		{"unquoted", "Authorization: Bearer " + tok + "\nHost: x", "Authorization: [redacted]\nHost: x", []string{tok[:16]}},
		{"credential without its header name", `..."` + b64[30:] + `\r\nX-Pad: q"`, `"[redacted]\r\nX-Pad: q"`, []string{b64[30:46]}},
		{"hex run", "/market/vm-images/upload/" + tok, "/market/vm-images/upload/[redacted]", []string{tok[:16]}},
		{"plain text stays", `"PUT /market/vm-images/upload/x HTTP/1.1\r\nContent-Type: application/octet-stream"`,
			`"PUT /market/vm-images/upload/x HTTP/1.1\r\nContent-Type: application/octet-stream"`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := redactHead(c.in)
			if !strings.Contains(got, c.want) {
				t.Errorf("redactHead(%q) = %q, want it to hold %q", c.in, got, c.want)
			}
			for _, n := range c.not {
				if strings.Contains(got, n) {
					t.Errorf("redactHead(%q) = %q, still holds %q", c.in, got, n)
				}
			}
		})
	}
}
