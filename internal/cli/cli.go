// Package cli is a small command-line engine: a table of commands, each
// with a Doc, rendered as "PROG ... -h" help (the doc and every flag its
// flag set defines, so no flag can be missing from its help); flags that
// also come from PROG_<FLAG> variables; and mistakes that are usage
// errors of one line, exit code 2.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// Doc is what the help says about a command besides its flags.
type Doc struct {
	Args    string   // the usage line after the command's name: "NAME [flags]"
	Summary string   // one line, for the lists of commands
	About   string   // what the command does: paragraphs, split by a blank line
	Env     []EnvVar // variables read besides each flag's PROG_<FLAG>
	Exits   []string // "0  what it means", ...; nil: CommonExits
}

// EnvVar is an environment variable a command reads that is no flag's.
type EnvVar struct{ Name, About string }

// CommonExits are the exit codes of a command that does one thing.
var CommonExits = []string{
	"0  done",
	"1  failed; the message says why",
	"2  a usage error (a bad flag, value or argument, or a data dir that is not one); nothing was done",
}

// RunFunc is a command's body; args are the words after its name.
type RunFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Command is one word of the command line: one that runs, or a group of
// further commands.
type Command struct {
	Name string
	Doc  Doc
	Run  RunFunc   // nil for a group
	Sub  []Command // a group's commands
	// OwnEnvWarning says the command warns of unknown PROG_* variables
	// itself (WarnUnknownEnv), in a log of its own whose level and form
	// its flags set; Run warns on stderr before every other command runs.
	OwnEnvWarning bool
}

// SubCommand is the command SUB of a group whose commands share one body,
// which learns which one runs and its doc.
func SubCommand(sub string, body func(ctx context.Context, sub string, doc Doc, args []string, stdout, stderr io.Writer) error, doc Doc) Command {
	return Command{Name: sub, Doc: doc, Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return body(ctx, sub, doc, args, stdout, stderr)
	}}
}

// HelpShown ends a command that was asked for its help (-h, --help, help):
// Run prints Text on stdout and the exit code is 0. Flags is the flag set
// the help describes (nil for a group), for tests that every flag is in it.
type HelpShown struct {
	Text  string
	Flags *flag.FlagSet
}

func (HelpShown) Error() string { return "help shown" }

// UsageError is a mistake in the command line: exit code 2, one line.
type UsageError struct{ msg string }

func (e UsageError) Error() string { return e.msg }

// Usagef is a UsageError of the formatted line.
func Usagef(format string, args ...any) error { return UsageError{fmt.Sprintf(format, args...)} }

// Run runs the command of cmds that args names (Dispatch) and prints a help
// that was asked for on stdout. The command's context carries the tree, for
// KnownEnv.
func Run(ctx context.Context, path string, doc Doc, cmds []Command, args []string, stdout, stderr io.Writer) error {
	ctx = withProgram(ctx, program{path, doc, cmds})
	err := Dispatch(ctx, path, doc, cmds, args, stdout, stderr)
	var h HelpShown
	if errors.As(err, &h) {
		_, err = io.WriteString(stdout, h.Text)
	}
	return err
}

// ExitCode is the exit code of a command that ended with err, whose line
// it writes on stderr as "PROG: err": 0 for nil, 2 for a UsageError, the
// code of an error with an ExitCode method (upload's 3: resumable), else 1.
func ExitCode(prog string, err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, prog+":", err)
	var ue UsageError
	if errors.As(err, &ue) {
		return 2
	}
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}

// Dispatch runs the command of cmds that args[0] names; path is the words
// before it ("vmshelf", "vmshelf tenant": the program's name, then the
// group's) and doc the group's own. A missing or unknown command shows the
// group's help on stderr, then the one-line error (exit code 2).
func Dispatch(ctx context.Context, path string, doc Doc, cmds []Command, args []string, stdout, stderr io.Writer) error {
	_, group, _ := strings.Cut(path, " ")
	if len(args) == 0 {
		fmt.Fprint(stderr, groupHelp(path, doc, cmds))
		if group == "" {
			return Usagef("a command is needed")
		}
		return Usagef("%s needs a command: %s", group, commandNames(cmds))
	}
	switch args[0] {
	case "-h", "-help", "--help":
		return HelpShown{Text: groupHelp(path, doc, cmds)}
	case "help": // "vmshelf help tenant add" is "vmshelf tenant add -h"
		if len(args) == 1 {
			return HelpShown{Text: groupHelp(path, doc, cmds)}
		}
		return Dispatch(ctx, path, doc, cmds, append(args[1:len(args):len(args)], "-h"), stdout, stderr)
	}
	for _, c := range cmds {
		switch {
		case c.Name != args[0]:
			continue
		case c.Sub != nil:
			return Dispatch(ctx, path+" "+c.Name, c.Doc, c.Sub, args[1:], stdout, stderr)
		case c.Run == nil:
			return Usagef("the %s command is not in this build", strings.TrimSpace(group+" "+c.Name))
		}
		if !c.OwnEnvWarning {
			// Before the command: a misspelt variable is often why it
			// then fails (VMSHELF_NAEM, and upload lacks --name).
			WarnUnknownEnv(ctx, stderrLog(stderr), os.Environ())
		}
		return c.Run(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, groupHelp(path, doc, cmds))
	if group == "" {
		return Usagef("unknown command %q", args[0])
	}
	return Usagef("unknown %s command %q", group, args[0])
}

// commandNames is "add, list, set or token".
func commandNames(cmds []Command) string {
	var names []string
	for _, c := range cmds {
		names = append(names, c.Name)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// stderrLog is the log of a command that has none: slog's text lines on
// stderr, as a server's, without the time a person at the terminal has.
func stderrLog(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}
