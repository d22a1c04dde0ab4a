package baseurl

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in        string
		url, base bool // accepted by Parse, by ParseBase
	}{
		{"http://127.0.0.1:8480", true, true},
		{"https://shelf.example.org/edge", true, true},
		{"HTTPS://shelf.example.org", true, true}, // url.Parse lowers the scheme
		{"http://[::1]:8480/", true, true},
		{"ftp://shelf.example.org", false, false},
		{"s3://bucket/prefix", false, false},
		{"shelf.example.org:8480", false, false},
		{"/machines", false, false},
		{"http://", false, false},
		{"http:///path", false, false},
		{"", false, false},
		{"http://a b", false, false},
		{"http://%zz", false, false},
		{"http://user:pw@shelf.example.org", true, false},
		{"http://shelf.example.org/?a=1", true, false},
		{"http://shelf.example.org/#top", true, false},
		{"http://shelf.example.org/#", true, true}, // an empty fragment parses as none; publicBase refuses "#" itself
	} {
		u, err := Parse(c.in)
		if (err == nil) != c.url {
			t.Errorf("Parse(%q) = %v, %v; want accepted %v", c.in, u, err, c.url)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("Parse(%q) error %q repeats the URL", c.in, err)
		}
		if _, err := ParseBase(c.in); (err == nil) != c.base {
			t.Errorf("ParseBase(%q) = %v; want accepted %v", c.in, err, c.base)
		}
	}
}

// TestBaseAndOrigin: Base refuses every "#" and drops trailing slashes;
// IsOrigin takes a scheme, host and port only.
func TestBaseAndOrigin(t *testing.T) {
	for _, c := range []struct {
		in, base string // "": refused by Base
		origin   bool
	}{
		{"http://127.0.0.1:8480", "http://127.0.0.1:8480", true},
		{"https://shelf.example.org/edge//", "https://shelf.example.org/edge", false},
		{"http://shelf.example.org/", "http://shelf.example.org", false},
		{"http://shelf.example.org/#", "", false},
		{"http://shelf.example.org?a=1", "", false},
		{"ftp://shelf.example.org", "", false},
		{"*", "", false},
	} {
		if b, err := Base(c.in); b != c.base || (err == nil) != (c.base != "") {
			t.Errorf("Base(%q) = %q, %v; want %q", c.in, b, err, c.base)
		}
		if o := IsOrigin(c.in); o != c.origin {
			t.Errorf("IsOrigin(%q) = %v, want %v", c.in, o, c.origin)
		}
	}
}
