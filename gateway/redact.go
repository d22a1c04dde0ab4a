package gateway

import (
	"regexp"

	"github.com/vmshelf/vmshelf/internal/logsample"
)

var (
	// credentialHeader is a credential header line and its value, in the
	// text of a request head as fasthttp quotes it in its errors (%q:
	// line ends are the escapes \r\n) or unquoted. The value runs to the
	// line's end; escapes other than \r and \n are part of it.
	credentialHeader = regexp.MustCompile(`(?i)((?:proxy-)?authorization|cookie)(\s*:)(?:[^\\"\r\n]|\\[^rn])*`)
	// alnumRun is a run of 16 or more letters and digits: the shape of a
	// base64 basic-auth credential (a fetch token's encoding has neither +
	// nor /), left over when fasthttp's snippet of a long head cut the
	// header's name off.
	alnumRun = regexp.MustCompile(`[A-Za-z0-9]{16,}`)
)

// redactHead keeps capabilities out of text that can quote a request head:
// fasthttp's own log lines and the errors it hands the ErrorHandler. Since
// the fetch token can come in an Authorization header, hex runs
// (logsample.Redact) are not enough: a basic-auth credential is base64.
func redactHead(s string) string {
	s = credentialHeader.ReplaceAllString(s, "$1$2 [redacted]")
	s = alnumRun.ReplaceAllString(s, "[redacted]")
	return logsample.Redact(s)
}
