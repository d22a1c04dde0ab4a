package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// TestControlDefault: upload, images and rm talk to the control plane of
// `make run` unless told otherwise: --control wins over VMSHELF_CONTROL,
// which wins over the default, and the default is serve's own
// --control-addr, which the Makefile's run target leaves as it is.
func TestControlDefault(t *testing.T) {
	const fromEnv, fromFlag = "http://edge.example:8481", "http://other.example:9000"
	parse := map[string]func(args []string) (string, error){
		"upload": func(args []string) (string, error) {
			f, err := parseUploadFlags(append(args, "--token-file", "tok", "--name", "disk", "disk.qcow2"), io.Discard)
			if err != nil {
				return "", err
			}
			return f.control, nil
		},
	}
	for _, name := range []string{"images", "rm"} {
		parse[name] = func(args []string) (string, error) {
			cf, _, err := parseControlCommand(name, imagesHelp, append(args, "--token-file", "tok"), nil)
			if err != nil {
				return "", err
			}
			return cf.control, nil
		}
	}
	for name, p := range parse {
		for _, tc := range []struct {
			env  string
			args []string
			want string
		}{
			{"", nil, "http://" + defaultControlAddr},
			{fromEnv, nil, fromEnv},
			{fromEnv, []string{"--control", fromFlag}, fromFlag},
		} {
			t.Setenv("VMSHELF_CONTROL", tc.env)
			if tc.env == "" {
				os.Unsetenv("VMSHELF_CONTROL")
			}
			if got, err := p(tc.args); err != nil || got != tc.want {
				t.Errorf("%s %q with VMSHELF_CONTROL=%q: --control %q (%v), want %q", name, tc.args, tc.env, got, err, tc.want)
			}
		}
	}

	err := cli.Dispatch(context.Background(), "vmshelf", topHelp, commands, []string{"serve", "-h"}, io.Discard, io.Discard)
	var h cli.HelpShown
	if !errors.As(err, &h) || h.Flags.Lookup("control-addr").DefValue != defaultControlAddr {
		t.Fatalf("serve's --control-addr default is not %s (%v)", defaultControlAddr, err)
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	run := regexp.MustCompile(`(?m)^run:.*\n((?:\t.*\n)+)`).FindSubmatch(mk)
	if run == nil || !regexp.MustCompile(`serve\b`).Match(run[1]) || regexp.MustCompile(`control-addr|VMSHELF_CONTROL_ADDR`).Match(run[1]) {
		t.Errorf("the Makefile's run target does not run serve at its default --control-addr:\n%s", run)
	}
}
