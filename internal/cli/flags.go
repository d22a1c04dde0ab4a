package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// NewFlagSet is the flag set of the command path ("vmshelf tenant add":
// the program's name, then the command's words): -h prints doc with the
// flags, and its errors are usage errors of one line.
func NewFlagSet(path string, doc Doc) *flag.FlagSet {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), leafHelp(fs, doc)) }
	return fs
}

// ParseFlags parses args into fs, then fills every flag the command line
// did not set from PROG_<FLAG> (EnvName), so a unit file or container can
// configure the service without a long command line. A mistake is a usage
// error of one line naming the flag or variable and the form it wants (the
// flag list is for -h only: in an error it buries the line that matters);
// -h or --help is HelpShown, which Run prints on stdout.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	fs.VisitAll(func(f *flag.Flag) { f.Value = withForm(f.Value) })
	// flag writes its own message and the whole usage on an error; both go
	// here and only the help is kept.
	var out bytes.Buffer
	fs.SetOutput(&out)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return HelpShown{Text: out.String(), Flags: fs}
		}
		return flagError(fs, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := EnvName(fs, f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = Usagef("%s=%q: %v", env, v, serr)
			} else if fv, ok := f.Value.(*formValue); ok {
				fv.fromEnv = true
			}
		}
	})
	return err
}

// SetBy is where the flag flagName of fs got its value in ParseFlags:
// "--FLAG" from the command line, its PROG_<FLAG> variable (EnvName), or
// "" when it kept its default. A message about a setting names it as the
// operator wrote it, so that it can be found.
func SetBy(fs *flag.FlagSet, flagName string) string {
	by := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name != flagName {
			return
		}
		by = "--" + f.Name
		if fv, ok := f.Value.(*formValue); ok && fv.fromEnv {
			by = EnvName(fs, f.Name)
		}
	})
	return by
}

// EnvName is the variable the flag flagName of fs also comes from:
// PROG_<FLAG>, PROG being the first word of fs's name, both upper case,
// "-" as "_" (VMSHELF_DATA_DIR).
func EnvName(fs *flag.FlagSet, flagName string) string {
	prog, _, _ := strings.Cut(fs.Name(), " ")
	return strings.ToUpper(strings.ReplaceAll(prog+"_"+flagName, "-", "_"))
}

// flagError turns what flag.Parse refused into one line. flag.Parse only
// formats its errors, so a refused value is found in the formValue that
// refused it, and the two other mistakes by flag's wording.
func flagError(fs *flag.FlagSet, err error) error {
	var msg error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := f.Value.(*formValue); ok && v.refused != nil && msg == nil {
			msg = Usagef("--%s %q: %v", f.Name, *v.refused, v.err)
		}
	})
	if msg != nil {
		return msg
	}
	see := "; see " + fs.Name() + " -h"
	text := err.Error()
	if name, ok := strings.CutPrefix(text, "flag provided but not defined: "); ok {
		return Usagef("unknown flag --%s%s", strings.TrimLeft(name, "-"), see)
	}
	if name, ok := strings.CutPrefix(text, "flag needs an argument: "); ok {
		name = strings.TrimLeft(name, "-")
		if f := fs.Lookup(name); f != nil {
			if want := formOf(f.Value).want; want != "" {
				return Usagef("--%s needs a value, %s%s", name, want, see)
			}
		}
		return Usagef("--%s needs a value%s", name, see)
	}
	return Usagef("%s%s", text, see)
}

// form is what a flag's value looks like: the word help shows after the
// flag and, for a value that can be wrong, the form an error asks for.
type form struct {
	kind string // "duration", "int", "float", "string"; "" for a bool
	want string // "a duration like 60s or 2m"; "" for any string
}

// formOf tells the form from the value a flag holds (every Value of the
// flag package is a Getter), so every command gets the same messages
// without saying anything per flag.
func formOf(v flag.Value) form {
	if fv, ok := v.(*formValue); ok {
		return fv.form
	}
	g, ok := v.(flag.Getter)
	if !ok {
		return form{kind: "value"}
	}
	switch g.Get().(type) {
	case bool:
		return form{"", "true or false"}
	case time.Duration:
		return form{"duration", "a duration like 60s or 2m"}
	case int, int64:
		return form{"int", "a whole number like 4"}
	case uint, uint64:
		return form{"uint", "a whole number like 4, not negative"}
	case float64:
		return form{"float", "a number like 32 or 0.25"}
	case string:
		return form{kind: "string"}
	}
	return form{kind: "value"}
}

// formValue is a flag's Value that answers a value it refuses with the
// form it wants instead of strconv's "parse error", and remembers the
// value for flagError.
type formValue struct {
	flag.Value
	form
	refused *string
	err     error
	fromEnv bool // set from PROG_<FLAG> (SetBy)
}

// withForm wraps v once (a command may parse the same flag set several
// times).
func withForm(v flag.Value) flag.Value {
	if fv, ok := v.(*formValue); ok {
		fv.refused, fv.err, fv.fromEnv = nil, nil, false
		return fv
	}
	return &formValue{Value: v, form: formOf(v)}
}

func (v *formValue) Set(s string) error {
	err := v.Value.Set(s)
	if err == nil {
		return nil
	}
	if v.want != "" {
		err = errors.New("needs " + v.want)
	}
	v.refused, v.err = &s, err
	return err
}

// Get keeps the wrapped value a flag.Getter, as every Value of the flag
// package is (a test reads the defaults' types through it).
func (v *formValue) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return nil
}

// IsBoolFlag keeps "--sharing" (no "=true") working through the wrapper.
func (v *formValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// GiB converts a size in GiB (decimals allowed) to bytes; anything but a
// positive size is a usage error naming the flag.
func GiB(v float64, flagName string) (int64, error) {
	b := v * (1 << 30)
	if !(v > 0) || b > math.MaxInt64/2 {
		return 0, Usagef("--%s must be a positive number of GiB, got %v", flagName, v)
	}
	return int64(b), nil
}
