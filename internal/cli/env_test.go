package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// TestUnknownEnv: each PROG_* variable that no flag or doc names is
// warned about once, with the closest known name, never with its value;
// known ones, other programs' and Kubernetes' service links are not.
func TestUnknownEnv(t *testing.T) {
	known := []string{"PROG_CONTROL", "PROG_DATA_DIR", "PROG_PUBLIC_URL", "PROG_STORE_URL", "PROG_TOKEN_FILE"}
	for _, tc := range []struct {
		name    string
		environ []string
		want    []string
	}{
		{"known", []string{"PROG_PUBLIC_URL=https://x", "PROG_DATA_DIR=/d"}, nil},
		{"swapped letters", []string{"PROG_PUBLIC_ULR=https://secret@x"},
			[]string{"PROG_PUBLIC_ULR is not a prog variable; did you mean PROG_PUBLIC_URL?"}},
		{"a letter missing", []string{"PROG_DATADIR=/d"},
			[]string{"PROG_DATADIR is not a prog variable; did you mean PROG_DATA_DIR?"}},
		{"a word changed: too far for a typo", []string{"PROG_TOKEN_PATH=/t"},
			[]string{"PROG_TOKEN_PATH is not a prog variable; it is ignored (the closest known is PROG_TOKEN_FILE)"}},
		{"nothing near", []string{"PROG_X=1"},
			[]string{"PROG_X is not a prog variable; it is ignored (the closest known is PROG_CONTROL)"}},
		{"twice, one warning", []string{"PROG_CONTRL=http://one", "PROG_CONTRL=http://two"},
			[]string{"PROG_CONTRL is not a prog variable; did you mean PROG_CONTROL?"}},
		{"sorted", []string{"PROG_STORE_ULR=postgres://u:pw@h/db", "PROG_DATA_DIRR=/d"},
			[]string{"PROG_DATA_DIRR is not a prog variable; did you mean PROG_DATA_DIR?",
				"PROG_STORE_ULR is not a prog variable; did you mean PROG_STORE_URL?"}},
		{"other programs", []string{"PROGRAM_X=1", "PATH=/bin", "prog_control=x", "XPROG_CONTROL=1"}, nil},
		{"service links", []string{"PROG_SERVICE_HOST=10.0.0.1", "PROG_SERVICE_PORT=8480", "PROG_SERVICE_PORT_DATA=8480",
			"PROG_PORT=tcp://10.0.0.1:8480", "PROG_PORT_8480_TCP=tcp://10.0.0.1:8480", "PROG_PORT_8480_TCP_ADDR=10.0.0.1",
			"PROG_PORT_8480_TCP_PORT=8480", "PROG_PORT_8480_TCP_PROTO=tcp",
			"PROG_DATA_PORT=tcp://10.0.0.2:8480", "PROG_CONTROL_SERVICE_HOST=10.0.0.3", "PROG_CONTROL_PORT_8481_TCP_ADDR=10.0.0.3"}, nil},
		{"no value", []string{"PROG_CONTROLL"}, []string{"PROG_CONTROLL is not a prog variable; did you mean PROG_CONTROL?"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := UnknownEnv("PROG_", known, tc.environ)
			if !slices.Equal(got, tc.want) {
				t.Errorf("UnknownEnv(%q) =\n%q\nwant\n%q", tc.environ, got, tc.want)
			}
			for _, w := range got {
				for _, kv := range tc.environ {
					if _, v, ok := strings.Cut(kv, "="); ok && strings.Contains(w, v) {
						t.Errorf("warning %q tells the value %q", w, v)
					}
				}
			}
		})
	}
}

// TestEditDistance: a swap of neighbours is one edit, as are an
// insertion, a deletion and a substitution.
func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"URL", "URL", 0}, {"ULR", "URL", 1}, {"URL", "", 3}, {"", "ab", 2},
		{"DATADIR", "DATA_DIR", 1}, {"CONTRL", "CONTROL", 1}, {"kitten", "sitting", 3}, {"ca", "abc", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestKnownEnv: a program run by Run knows every flag's variable of every
// command, a group's included, and the PROG_* names of the docs' Env;
// WarnUnknownEnv logs only the rest, and nothing outside Run.
func TestKnownEnv(t *testing.T) {
	leaf := func(name string, flags ...string) RunFunc {
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			fs := NewFlagSet(name, Doc{})
			for _, f := range flags {
				fs.String(f, "", "")
			}
			if err := ParseFlags(fs, args); err != nil {
				return err
			}
			WarnUnknownEnv(ctx, slog.New(slog.NewTextHandler(stderr, nil)),
				[]string{"PROG_DATA_DIR=/d", "PROG_TOKN_FILE=/t", "PROG_STORE_URL=x", "PROG_STRE_URL=pw"})
			return nil
		}
	}
	cmds := []Command{
		{Name: "serve", Doc: Doc{Env: []EnvVar{{Name: "PROG_STORE_URL", About: "the store"}, {Name: "OTHER_KEY or PROG_KEY_FILE"}}},
			Run: leaf("prog serve", "data-dir")},
		{Name: "tenant", Doc: Doc{Summary: "tenants"}, Sub: []Command{{Name: "add", Run: leaf("prog tenant add", "token-file")}}},
		{Name: "later", Doc: Doc{Summary: "not built"}},
	}
	if _, ok := KnownEnv(context.Background()); ok {
		t.Errorf("KnownEnv outside Run: ok")
	}
	var stderr bytes.Buffer
	if err := Run(context.Background(), "prog", Doc{}, cmds, []string{"serve"}, io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`level=WARN msg="PROG_STRE_URL is not a prog variable; did you mean PROG_STORE_URL?"`,
		`level=WARN msg="PROG_TOKN_FILE is not a prog variable; did you mean PROG_TOKEN_FILE?"`,
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("serve's log lacks %s:\n%s", want, stderr.String())
		}
	}
	if n := strings.Count(stderr.String(), "level=WARN"); n != 2 || strings.Contains(stderr.String(), "pw") {
		t.Errorf("serve's log has %d warnings, want 2 and no value:\n%s", n, stderr.String())
	}
	var got []string
	ran := false
	probe := Command{Name: "probe", Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		fs := NewFlagSet("prog probe", Doc{})
		if err := ParseFlags(fs, args); err != nil {
			return err
		}
		got, ran = KnownEnv(ctx)
		return nil
	}}
	if err := Run(context.Background(), "prog", Doc{}, append(cmds, probe), []string{"probe"}, io.Discard, io.Discard); err != nil || !ran {
		t.Fatal(err)
	}
	want := []string{"PROG_DATA_DIR", "PROG_KEY_FILE", "PROG_STORE_URL", "PROG_TOKEN_FILE"}
	if !slices.Equal(got, want) {
		t.Errorf("KnownEnv = %q, want %q", got, want)
	}
}

// TestRunWarnsUnknownEnv: Run warns of a misspelt PROG_* variable on
// stderr before any command runs, also one that fails or only shows its
// help, naming the closest variable of the whole program (one read by
// another command is no typo) and never the value. A command that warns in
// a log of its own (OwnEnvWarning) is left to do so: one warning, not two.
func TestRunWarnsUnknownEnv(t *testing.T) {
	t.Setenv("PROG_TOKN_FILE", "a-secret-path")
	t.Setenv("PROG_DATA_DIR", "/d") // another command's: no typo
	leaf := func(name string, fail error) RunFunc {
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			fs := NewFlagSet(name, Doc{})
			fs.String("token-file", "", "")
			if err := ParseFlags(fs, args); err != nil {
				return err
			}
			return fail
		}
	}
	cmds := []Command{
		{Name: "serve", Doc: Doc{Summary: "serves"}, Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			fs := NewFlagSet("prog serve", Doc{})
			fs.String("data-dir", "", "")
			return ParseFlags(fs, args)
		}},
		{Name: "tenant", Doc: Doc{Summary: "tenants"}, Sub: []Command{
			{Name: "add", Run: leaf("prog tenant add", nil)},
			{Name: "rm", Run: leaf("prog tenant rm", Usagef("tenant rm needs a NAME"))},
		}},
	}
	const want = `level=WARN msg="PROG_TOKN_FILE is not a prog variable; did you mean PROG_TOKEN_FILE?"` + "\n"
	for _, args := range [][]string{{"tenant", "add"}, {"tenant", "rm"}, {"tenant", "add", "-h"}, {"serve"}} {
		var stderr bytes.Buffer
		err := Run(context.Background(), "prog", Doc{}, cmds, args, io.Discard, &stderr)
		if got := stderr.String(); got != want {
			t.Errorf("prog %q (%v): stderr %q, want only %q", args, err, got, want)
		}
	}

	cmds[0].OwnEnvWarning = true
	var stderr bytes.Buffer
	if err := Run(context.Background(), "prog", Doc{}, cmds, []string{"serve"}, io.Discard, &stderr); err != nil || stderr.Len() != 0 {
		t.Errorf("a command that warns in its own log: %v, Run wrote %q", err, stderr.String())
	}
}
