package main

// The command line's help. Every command is a row of a table (commands in
// main.go; tenantCommands, quarantineCommands for the groups) with a
// helpDoc; "vmshelf ... -h" renders the doc and, for a command that runs,
// the flags its flag set defines, so no flag can be missing from its help.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// helpDoc is what the help says about a command besides its flags.
type helpDoc struct {
	args    string   // the usage line after the command's name: "NAME [flags]"
	summary string   // one line, for the lists of commands
	about   string   // what the command does: paragraphs, split by a blank line
	env     []envVar // variables read besides each flag's VMSHELF_<FLAG>
	exits   []string // "0  what it means", ...; nil: commonExits
}

// envVar is an environment variable a command reads that is no flag's.
type envVar struct{ name, about string }

// commonExits are the exit codes of a command that does one thing.
var commonExits = []string{
	"0  done",
	"1  failed; the message says why",
	"2  a usage error (a bad flag, value or argument, or a data dir that is not one); nothing was done",
}

// runFunc is a command's body; args are the words after its name.
type runFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// command is one word of the command line: one that runs, or a group of
// further commands (tenant, quarantine).
type command struct {
	name string
	doc  helpDoc
	run  runFunc   // nil for a group
	sub  []command // a group's commands
}

// subCommand is the command SUB of a group whose commands share one body
// (tenant's, quarantine's), which learns which one runs and its doc.
func subCommand(sub string, body func(ctx context.Context, sub string, doc helpDoc, args []string, stdout, stderr io.Writer) error, doc helpDoc) command {
	return command{name: sub, doc: doc, run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return body(ctx, sub, doc, args, stdout, stderr)
	}}
}

// helpShown ends a command that was asked for its help (-h, --help, help):
// run prints text on stdout and the exit code is 0. fs is the flag set
// the help describes (nil for a group), for the test that every flag is in it.
type helpShown struct {
	text string
	fs   *flag.FlagSet
}

func (helpShown) Error() string { return "help shown" }

// dispatch runs the command of cmds that args[0] names; path is the words
// before it ("vmshelf", "vmshelf tenant") and doc the group's own. A missing
// or unknown command shows the group's help on stderr, then the one-line
// error (exit code 2).
func dispatch(ctx context.Context, path string, doc helpDoc, cmds []command, args []string, stdout, stderr io.Writer) error {
	group := strings.TrimPrefix(strings.TrimPrefix(path, "vmshelf"), " ")
	if len(args) == 0 {
		fmt.Fprint(stderr, groupHelp(path, doc, cmds))
		if group == "" {
			return usagef("a command is needed")
		}
		return usagef("%s needs a command: %s", group, commandNames(cmds))
	}
	switch args[0] {
	case "-h", "-help", "--help":
		return helpShown{text: groupHelp(path, doc, cmds)}
	case "help": // "vmshelf help tenant add" is "vmshelf tenant add -h"
		if len(args) == 1 {
			return helpShown{text: groupHelp(path, doc, cmds)}
		}
		return dispatch(ctx, path, doc, cmds, append(args[1:len(args):len(args)], "-h"), stdout, stderr)
	}
	for _, c := range cmds {
		switch {
		case c.name != args[0]:
			continue
		case c.sub != nil:
			return dispatch(ctx, path+" "+c.name, c.doc, c.sub, args[1:], stdout, stderr)
		case c.run == nil:
			return usagef("the %s command is not in this build", strings.TrimSpace(group+" "+c.name))
		}
		return c.run(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, groupHelp(path, doc, cmds))
	if group == "" {
		return usagef("unknown command %q", args[0])
	}
	return usagef("unknown %s command %q", group, args[0])
}

// commandNames is "add, list, set or token".
func commandNames(cmds []command) string {
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// groupHelp is the help of a group: what it is for and its commands, each
// with its usage line (a group's commands listed in turn).
func groupHelp(path string, doc helpDoc, cmds []command) string {
	var b strings.Builder
	wrap(&b, path+" — "+doc.summary, "", "    ")
	fmt.Fprintf(&b, "\nusage: %s %s\n\n", path, doc.args)
	paragraphs(&b, doc.about)
	b.WriteString("\ncommands:\n")
	var list func(path string, cmds []command)
	list = func(path string, cmds []command) {
		for _, c := range cmds {
			if c.sub != nil {
				list(path+" "+c.name, c.sub)
				continue
			}
			fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(path+" "+c.name+" "+c.doc.args))
			wrap(&b, c.doc.summary, "      ", "      ")
		}
	}
	list(path, cmds)
	b.WriteString("\n")
	wrap(&b, fmt.Sprintf("%q (or %q) shows a command's flags, the environment variables it reads and its exit codes.",
		path+" COMMAND -h", strings.Replace(path, "vmshelf", "vmshelf help", 1)+" COMMAND"), "", "")
	writeExits(&b, doc.exits)
	return b.String()
}

// leafHelp is the help of a command that runs: its doc and every flag fs
// defines, each with its default and its VMSHELF_<FLAG> variable.
func leafHelp(fs *flag.FlagSet, doc helpDoc) string {
	var b strings.Builder
	wrap(&b, fs.Name()+" — "+doc.summary, "", "    ")
	fmt.Fprintf(&b, "\nusage: %s\n\n", strings.TrimSpace(fs.Name()+" "+doc.args))
	paragraphs(&b, doc.about)
	type row struct{ head, env, about string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		head := "  --" + f.Name
		if k := formOf(f.Value).kind; k != "" {
			head += " " + k
		}
		width = max(width, utf8.RuneCountInString(head))
		rows = append(rows, row{head, envName(f.Name), f.Usage + defaultText(f)})
	})
	if len(rows) == 0 {
		b.WriteString("\nflags: none\n")
	} else {
		b.WriteString("\nflags (each also from the variable beside it; the command line wins):\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "%-*s  %s\n", width, r.head, r.env)
			wrap(&b, r.about, "      ", "      ")
		}
	}
	b.WriteString("\nenvironment:\n")
	if len(rows) > 0 {
		wrap(&b, "VMSHELF_<FLAG>: each flag above, as named beside it", "  ", "      ")
	}
	for _, e := range doc.env {
		fmt.Fprintf(&b, "  %s\n", e.name)
		wrap(&b, e.about, "      ", "      ")
	}
	if len(rows) == 0 && len(doc.env) == 0 {
		b.WriteString("  none read\n")
	}
	writeExits(&b, doc.exits)
	return b.String()
}

// defaultText is " (default X)" unless the default is the zero value.
func defaultText(f *flag.Flag) string {
	d := f.DefValue
	switch formOf(f.Value).kind {
	case "", "int", "uint", "float":
		if d == "false" || d == "0" {
			return ""
		}
	case "duration":
		if d == "0s" {
			return ""
		}
		// time.Duration writes 1h0m0s and 1m0s; 1h and 1m read better.
		if strings.HasSuffix(d, "m0s") {
			d = strings.TrimSuffix(d, "0s")
		}
		if strings.HasSuffix(d, "h0m") {
			d = strings.TrimSuffix(d, "0m")
		}
	case "string":
		if d == "" {
			return ""
		}
		d = fmt.Sprintf("%q", d)
	}
	return " (default " + d + ")"
}

func writeExits(b *strings.Builder, exits []string) {
	if exits == nil {
		exits = commonExits
	}
	b.WriteString("\nexit codes:\n")
	for _, e := range exits {
		code, text, _ := strings.Cut(e, " ")
		wrap(b, text, "  "+code+"  ", "     ")
	}
}

// paragraphs writes text wrapped, a blank line between its paragraphs.
func paragraphs(b *strings.Builder, text string) {
	for i, p := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if i > 0 {
			b.WriteString("\n")
		}
		wrap(b, p, "", "")
	}
}

// helpWidth is the width help text is wrapped to.
const helpWidth = 80

// wrap writes text's words in lines of at most helpWidth columns (a longer
// word stands alone), the first line starting with first, the others with
// indent.
func wrap(b *strings.Builder, text, first, indent string) {
	line, n := first, utf8.RuneCountInString(first)
	empty := true
	for _, w := range strings.Fields(text) {
		wn := utf8.RuneCountInString(w)
		if !empty && n+1+wn > helpWidth {
			b.WriteString(line + "\n")
			line, n, empty = indent, utf8.RuneCountInString(indent), true
		}
		if !empty {
			line, n = line+" ", n+1
		}
		line, n, empty = line+w, n+wn, false
	}
	b.WriteString(line + "\n")
}
