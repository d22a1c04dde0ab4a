package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// TestDefaultDataMaxConns: half the descriptors beyond the reserve of 128,
// within [16, 4096].
func TestDefaultDataMaxConns(t *testing.T) {
	for _, c := range []struct {
		nofile uint64
		want   int
	}{
		{0, 16}, {64, 16}, {160, 16}, {162, 17}, {256, 64}, {1024, 448},
		{8320, 4096}, {8322, 4096}, {8318, 4095}, {1 << 20, 4096},
	} {
		if got := defaultDataMaxConns(c.nofile); got != c.want {
			t.Errorf("defaultDataMaxConns(%d) = %d, want %d", c.nofile, got, c.want)
		}
	}
}

// TestDataMaxConnsFlag: unset, --data-max-conns follows this process's
// descriptor limit; set (flag or variable) it is taken as given, down to
// 1; 0 and below are usage errors naming it.
func TestDataMaxConnsFlag(t *testing.T) {
	f, err := parseServeFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := defaultDataMaxConns(noFileLimit()); f.dataMaxConns != want {
		t.Errorf("default --data-max-conns %d, want %d (from RLIMIT_NOFILE %d)", f.dataMaxConns, want, noFileLimit())
	}
	if f, err := parseServeFlags([]string{"--data-max-conns", "1"}); err != nil || f.dataMaxConns != 1 {
		t.Errorf("--data-max-conns 1: %v, %v", f, err)
	}
	for _, args := range [][]string{{"--data-max-conns", "0"}, {"--data-max-conns", "-1"}} {
		_, err := parseServeFlags(args)
		if ue := (cli.UsageError{}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "data-max-conns") {
			t.Errorf("%q: %v, want a usage error naming --data-max-conns", args, err)
		}
	}
	t.Setenv("VMSHELF_DATA_MAX_CONNS", "0")
	if _, err := parseServeFlags(nil); err == nil || !strings.Contains(err.Error(), "data-max-conns") {
		t.Errorf("VMSHELF_DATA_MAX_CONNS=0: %v, want a usage error", err)
	}
	t.Setenv("VMSHELF_DATA_MAX_CONNS", "9")
	if f, err := parseServeFlags(nil); err != nil || f.dataMaxConns != 9 {
		t.Errorf("VMSHELF_DATA_MAX_CONNS=9: %v, %v", f, err)
	}
}
