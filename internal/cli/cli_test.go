package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// testFlags is a command "prog cmd" with a flag of each form.
func testFlags() (*flagValues, func(args []string) error) {
	v := &flagValues{}
	fs := NewFlagSet("prog cmd", Doc{Args: "[flags]", Summary: "a test command", About: "Does nothing."})
	fs.BoolVar(&v.on, "on", false, "a switch")
	fs.DurationVar(&v.wait, "wait", time.Minute, "how long")
	fs.IntVar(&v.n, "max-n", 4, "how many")
	fs.StringVar(&v.name, "name", "", "a name")
	return v, func(args []string) error { return ParseFlags(fs, args) }
}

type flagValues struct {
	on   bool
	wait time.Duration
	n    int
	name string
}

// TestParseFlags: a variable fills a flag the command line left out, the
// command line wins, and each mistake is a UsageError of one line naming
// the form wanted.
func TestParseFlags(t *testing.T) {
	t.Setenv("PROG_MAX_N", "7")
	t.Setenv("PROG_NAME", "from-env")
	v, parse := testFlags()
	if err := parse([]string{"--on", "--name", "cli"}); err != nil {
		t.Fatal(err)
	}
	if !v.on || v.n != 7 || v.name != "cli" || v.wait != time.Minute {
		t.Errorf("got %+v; want on, 7 from PROG_MAX_N, the command line's name, the default wait", *v)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"--wait", "5"}, want: `--wait "5": needs a duration like 60s or 2m`},
		{args: []string{"--on=maybe"}, want: `--on "maybe": needs true or false`},
		{args: []string{"--max-n", "x"}, want: `--max-n "x": needs a whole number like 4`},
		{args: []string{"--nope"}, want: `unknown flag --nope; see prog cmd -h`},
		{args: []string{"--wait"}, want: `--wait needs a value, a duration like 60s or 2m; see prog cmd -h`},
		{env: "zero", want: `PROG_MAX_N="zero": needs a whole number like 4`},
	} {
		t.Setenv("PROG_MAX_N", tc.env)
		if tc.env == "" {
			t.Setenv("PROG_MAX_N", "1")
		}
		_, parse := testFlags()
		err := parse(tc.args)
		var ue UsageError
		if !errors.As(err, &ue) || err.Error() != tc.want {
			t.Errorf("%q (PROG_MAX_N=%q): %v, want the usage error %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestLeafHelp: -h is HelpShown with every flag, its form, default and
// variable, no line over Width.
func TestLeafHelp(t *testing.T) {
	_, parse := testFlags()
	var h HelpShown
	if err := parse([]string{"-h"}); !errors.As(err, &h) || h.Flags == nil {
		t.Fatalf("-h: %v, want HelpShown with its flag set", err)
	}
	for _, want := range []string{"prog cmd — a test command\n", "usage: prog cmd [flags]\n",
		"  --max-n int", "PROG_MAX_N\n", "how many (default 4)", "how long (default 1m)",
		"PROG_<FLAG>: each flag above", "  2  a usage error"} {
		if !strings.Contains(h.Text, want) {
			t.Errorf("help lacks %q:\n%s", want, h.Text)
		}
	}
	if strings.Contains(h.Text, "a switch (default") || strings.Contains(h.Text, "a name (default") {
		t.Errorf("a zero default is shown:\n%s", h.Text)
	}
	long := strings.Repeat("word ", 40)
	var b strings.Builder
	wrap(&b, long, "  ", "    ")
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if utf8.RuneCountInString(l) > Width {
			t.Errorf("wrapped line over %d columns: %q", Width, l)
		}
	}
}

// TestDispatch: the named command runs, a group's command is found in it,
// an unknown one shows the group's help then a usage error, and ExitCode
// maps each outcome.
func TestDispatch(t *testing.T) {
	ran := ""
	cmd := func(name string) RunFunc {
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			ran = name + " " + strings.Join(args, " ")
			return nil
		}
	}
	cmds := []Command{
		{Name: "one", Doc: Doc{Summary: "first"}, Run: cmd("one")},
		{Name: "grp", Doc: Doc{Summary: "a group"}, Sub: []Command{{Name: "two", Doc: Doc{Summary: "second"}, Run: cmd("two")}}},
	}
	top := Doc{Args: "COMMAND", Summary: "a test program"}
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), "prog", top, cmds, []string{"grp", "two", "x"}, &stdout, &stderr); err != nil || ran != "two x" {
		t.Errorf("grp two x: %v, ran %q", err, ran)
	}
	err := Run(context.Background(), "prog", top, cmds, []string{"grp", "bogus"}, &stdout, &stderr)
	if err == nil || err.Error() != `unknown grp command "bogus"` || !strings.Contains(stderr.String(), `"prog help grp COMMAND"`) {
		t.Errorf("grp bogus: %v, stderr:\n%s", err, stderr.String())
	}
	if err := Run(context.Background(), "prog", top, cmds, []string{"help", "grp"}, &stdout, &stderr); err != nil ||
		!strings.Contains(stdout.String(), "prog grp two\n      second\n") {
		t.Errorf("help grp: %v, stdout:\n%s", err, stdout.String())
	}
	for _, tc := range []struct {
		err  error
		want int
	}{{nil, 0}, {Usagef("bad"), 2}, {fmt.Errorf("wrapped: %w", Usagef("bad")), 2}, {coded{}, 3}, {errors.New("x"), 1}} {
		if got := ExitCode("prog", tc.err, io.Discard); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

type coded struct{}

func (coded) Error() string { return "stopped" }
func (coded) ExitCode() int { return 3 }

// TestSetBy: a flag is named as it was set, on the command line or by its
// variable, and not at all when it kept its default; a new parse forgets
// the last one's.
func TestSetBy(t *testing.T) {
	t.Setenv("PROG_MAX_N", "7")
	t.Setenv("PROG_NAME", "from-env")
	fs := NewFlagSet("prog cmd", Doc{})
	fs.Int("max-n", 4, "")
	fs.String("name", "", "")
	fs.Duration("wait", time.Minute, "")
	if err := ParseFlags(fs, []string{"--name", "cli"}); err != nil {
		t.Fatal(err)
	}
	for flagName, want := range map[string]string{"max-n": "PROG_MAX_N", "name": "--name", "wait": ""} {
		if got := SetBy(fs, flagName); got != want {
			t.Errorf("SetBy(%s) = %q, want %q", flagName, got, want)
		}
	}
	if err := ParseFlags(fs, []string{"--max-n", "5"}); err != nil || SetBy(fs, "max-n") != "--max-n" {
		t.Errorf("parsed again with --max-n: %v, SetBy = %q", err, SetBy(fs, "max-n"))
	}
}
