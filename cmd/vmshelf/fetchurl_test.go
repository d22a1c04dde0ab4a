package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFetchURLBase: with neither --public-url nor --data-addr, fetch-url
// takes the base the edge serving the data dir recorded there; with none
// recorded it says which base it takes and how to set another.
func TestFetchURLBase(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	base, err := fetchURLBase(newFlagSet("fetch-url", fetchURLHelp), dir, "", "127.0.0.1:8480", &stderr)
	if err != nil || base != "http://127.0.0.1:8480" || !strings.Contains(stderr.String(), "--public-url") {
		t.Errorf("nothing recorded: %q, %v, stderr %q; want the default base, said", base, err, stderr.String())
	}
	if err := writePrivateFile(filepath.Join(dir, publicURLFile), "https://edge.example:9443"); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	base, err = fetchURLBase(newFlagSet("fetch-url", fetchURLHelp), dir, "", "127.0.0.1:8480", &stderr)
	if err != nil || base != "https://edge.example:9443" || stderr.Len() != 0 {
		t.Errorf("recorded: %q, %v, stderr %q; want the edge's base", base, err, stderr.String())
	}
	fs := newFlagSet("fetch-url", fetchURLHelp)
	addr := fs.String("data-addr", "127.0.0.1:8480", "")
	if err := fs.Parse([]string{"--data-addr", "127.0.0.1:9000"}); err != nil {
		t.Fatal(err)
	}
	if base, err = fetchURLBase(fs, dir, "", *addr, &stderr); err != nil || base != "http://127.0.0.1:9000" {
		t.Errorf("--data-addr set: %q, %v; want it over the recorded base", base, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, publicURLFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the recorded base's file: %v, %v; want 0600", fi, err)
	}
}
