package cli

import (
	"flag"
	"fmt"
	"strings"
	"unicode/utf8"
)

// groupHelp is the help of a group: what it is for and its commands, each
// with its usage line (a group's commands listed in turn).
func groupHelp(path string, doc Doc, cmds []Command) string {
	var b strings.Builder
	wrap(&b, path+" — "+doc.Summary, "", "    ")
	fmt.Fprintf(&b, "\nusage: %s %s\n\n", path, doc.Args)
	paragraphs(&b, doc.About)
	b.WriteString("\ncommands:\n")
	var list func(path string, cmds []Command)
	list = func(path string, cmds []Command) {
		for _, c := range cmds {
			if c.Sub != nil {
				list(path+" "+c.Name, c.Sub)
				continue
			}
			fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(path+" "+c.Name+" "+c.Doc.Args))
			wrap(&b, c.Doc.Summary, "      ", "      ")
		}
	}
	list(path, cmds)
	b.WriteString("\n")
	prog, rest, _ := strings.Cut(path, " ")
	helpPath := strings.TrimSpace(prog + " help " + rest)
	wrap(&b, fmt.Sprintf("%q (or %q) shows a command's flags, the environment variables it reads and its exit codes.",
		path+" COMMAND -h", helpPath+" COMMAND"), "", "")
	writeExits(&b, doc.Exits)
	return b.String()
}

// leafHelp is the help of a command that runs: its doc and every flag fs
// defines, each with its default and its PROG_<FLAG> variable.
func leafHelp(fs *flag.FlagSet, doc Doc) string {
	var b strings.Builder
	wrap(&b, fs.Name()+" — "+doc.Summary, "", "    ")
	fmt.Fprintf(&b, "\nusage: %s\n\n", strings.TrimSpace(fs.Name()+" "+doc.Args))
	paragraphs(&b, doc.About)
	type row struct{ head, env, about string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		head := "  --" + f.Name
		if k := formOf(f.Value).kind; k != "" {
			head += " " + k
		}
		width = max(width, utf8.RuneCountInString(head))
		rows = append(rows, row{head, EnvName(fs, f.Name), f.Usage + defaultText(f)})
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
		wrap(&b, EnvName(fs, "<FLAG>")+": each flag above, as named beside it", "  ", "      ")
	}
	for _, e := range doc.Env {
		fmt.Fprintf(&b, "  %s\n", e.Name)
		wrap(&b, e.About, "      ", "      ")
	}
	if len(rows) == 0 && len(doc.Env) == 0 {
		b.WriteString("  none read\n")
	}
	writeExits(&b, doc.Exits)
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
		exits = CommonExits
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

// Width is the width help text is wrapped to.
const Width = 80

// wrap writes text's words in lines of at most Width columns (a longer
// word stands alone), the first line starting with first, the others with
// indent.
func wrap(b *strings.Builder, text, first, indent string) {
	line, n := first, utf8.RuneCountInString(first)
	empty := true
	for _, w := range strings.Fields(text) {
		wn := utf8.RuneCountInString(w)
		if !empty && n+1+wn > Width {
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
