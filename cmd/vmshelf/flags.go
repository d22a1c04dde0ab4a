package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// parseFlags parses args into fs, then fills every flag the command line
// did not set from VMSHELF_<FLAG>, so a unit file or container can
// configure the service without a long command line. Errors are usage
// errors naming the flag or variable.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return usageError{err.Error()}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "VMSHELF_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = usagef("%s=%q: %v", env, v, serr)
			}
		}
	})
	return err
}

// errHelp ends a command after its -h output, with exit code 0.
var errHelp = errors.New("help shown")

// gib converts a size in GiB (decimals allowed) to bytes.
func gib(v float64, flagName string) (int64, error) {
	b := v * (1 << 30)
	if !(v > 0) || b > math.MaxInt64/2 {
		return 0, usagef("--%s must be a positive number of GiB, got %v", flagName, v)
	}
	return int64(b), nil
}

// newFlagSet is a flag set that reports its own errors as usage errors.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("vmshelf "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage of vmshelf %s:\n", name)
		fs.PrintDefaults()
	}
	return fs
}
