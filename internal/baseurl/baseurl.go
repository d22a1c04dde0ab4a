// Package baseurl checks the http(s) URLs vmshelf is configured with or
// handed (the public URL, the Stripe API base, a ticket's upload URL…),
// so that every copy of the check agrees on what an http(s) URL is.
package baseurl

import (
	"errors"
	"net/url"
	"strings"
)

// errNotHTTP never repeats the URL: one may carry a credential. Callers
// say which setting was refused, in words of their own.
var errNotHTTP = errors.New("not an absolute http(s) URL with a host")

// Parse accepts an absolute URL whose scheme is http or https and which
// names a host.
func Parse(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errNotHTTP
	}
	return u, nil
}

// ParseBase is Parse for a base that other URLs are built on by adding a
// path: it refuses user info, a query and a fragment too, which would
// end up inside every URL built on it.
func ParseBase(s string) (*url.URL, error) {
	u, err := Parse(s)
	if err != nil || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, errNotHTTP
	}
	return u, nil
}

// Base is s checked as a base (ParseBase, and no "#" at all: an empty
// fragment parses as none but would still end up in every URL built on
// it), without its trailing slashes.
func Base(s string) (string, error) {
	if _, err := ParseBase(s); err != nil || strings.Contains(s, "#") {
		return "", errNotHTTP
	}
	return strings.TrimRight(s, "/"), nil
}

// IsOrigin reports whether s is a web origin: an http(s) scheme, a host,
// an optional port, nothing else.
func IsOrigin(s string) bool {
	u, err := ParseBase(s)
	return err == nil && u.Path == ""
}
