package cli

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
)

// program is the command tree Run was given, kept in the context of the
// command it runs: a command can then learn every variable the program
// reads (KnownEnv) without naming the table it is a row of, which would
// be an initialisation cycle.
type program struct {
	path string
	doc  Doc
	cmds []Command
}

type programKey struct{}

// walkingKey marks the context of KnownEnv's walk.
type walkingKey struct{}

// withProgram is ctx carrying the command tree.
func withProgram(ctx context.Context, p program) context.Context {
	return context.WithValue(ctx, programKey{}, p)
}

// KnownEnv is every PROG_* variable the program of ctx (the one Run
// runs) reads: each flag's PROG_<FLAG>, over all its commands, and every
// PROG_* name in a command's Doc.Env. The flag sets are learnt by asking
// each command for its help, which returns before the command does
// anything. ok is false when ctx comes from no Run, or from KnownEnv's own
// walk.
func KnownEnv(ctx context.Context) (names []string, ok bool) {
	p, ok := ctx.Value(programKey{}).(program)
	if !ok || ctx.Value(walkingKey{}) != nil {
		return nil, false
	}
	// A command that does not stop at -h would be run for real by the
	// walk below; one that asks for KnownEnv then gets nothing instead of
	// walking again.
	ctx = context.WithValue(ctx, walkingKey{}, true)
	prefix := envPrefix(p.path)
	seen := map[string]bool{}
	add := func(n string) {
		if strings.HasPrefix(n, prefix) && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	var walk func(words []string, doc Doc, cmds []Command)
	walk = func(words []string, doc Doc, cmds []Command) {
		for _, e := range doc.Env {
			for _, n := range envWord.FindAllString(e.Name, -1) {
				add(n)
			}
		}
		for _, c := range cmds {
			w := append(words[:len(words):len(words)], c.Name)
			switch {
			case c.Sub != nil:
				walk(w, c.Doc, c.Sub)
			case c.Run != nil:
				walk(w, c.Doc, nil)
				for _, n := range flagEnvNames(ctx, p, w) {
					add(n)
				}
			}
		}
	}
	walk(nil, p.doc, p.cmds)
	slices.Sort(names)
	return names, true
}

// envWord is a variable's name in a Doc.Env entry ("STRIPE_SECRET_KEY or
// STRIPE_SECRET_KEY_FILE").
var envWord = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*[A-Z0-9]\b`)

// flagEnvNames are the PROG_<FLAG> of the command the words name.
func flagEnvNames(ctx context.Context, p program, words []string) []string {
	err := Dispatch(ctx, p.path, p.doc, p.cmds, append(words, "-h"), io.Discard, io.Discard)
	var h HelpShown
	if !errors.As(err, &h) || h.Flags == nil {
		return nil
	}
	var out []string
	h.Flags.VisitAll(func(f *flag.Flag) { out = append(out, EnvName(h.Flags, f.Name)) })
	return out
}

// envPrefix is "PROG_" for the program path "prog ...".
func envPrefix(path string) string {
	prog, _, _ := strings.Cut(path, " ")
	return strings.ToUpper(prog) + "_"
}

// UnknownEnv returns a warning for each variable of environ ("NAME=value",
// as os.Environ gives them) whose name has prefix but is not in known,
// once per name, sorted, each naming the known name closest to it (edit
// distance, a swap of two neighbours counting as one edit). A warning
// names the variable, never its value: it could be a secret. Kubernetes'
// service links (PROG_SERVICE_HOST, PROG_PORT_8480_TCP, PROG_DATA_PORT and
// the like, set in every pod of a namespace with a Service named prog or
// prog-data) are no typo and are left alone.
func UnknownEnv(prefix string, known, environ []string) []string {
	prog := strings.ToLower(strings.TrimSuffix(prefix, "_"))
	seen := map[string]bool{}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, prefix) || seen[name] || slices.Contains(known, name) ||
			serviceLink.MatchString(strings.TrimPrefix(name, prefix)) {
			continue
		}
		seen[name] = true
		w := name + " is not a " + prog + " variable"
		if near, d := closest(name, known); near != "" && d <= maxTypo(name, prefix) {
			w += "; did you mean " + near + "?"
		} else if near != "" {
			w += "; it is ignored (the closest known is " + near + ")"
		}
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

// serviceLink matches what Kubernetes' service links add after PROG_ for
// a Service named prog or prog-something (PROG_DATA_PORT of vmshelf-data).
var serviceLink = regexp.MustCompile(`^([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$`)

// maxTypo is the distance up to which a name is read as a misspelling:
// a third of its length after the prefix, at least 2.
func maxTypo(name, prefix string) int { return max(2, (len(name)-len(prefix))/3) }

// closest is the name of known nearest to name, and its distance; the
// first in known's order on a tie.
func closest(name string, known []string) (string, int) {
	best, bestD := "", -1
	for _, k := range known {
		if d := editDistance(name, k); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	return best, bestD
}

// editDistance is the optimal string alignment distance of a and b:
// insertions, deletions, substitutions and swaps of two neighbouring
// bytes (ULR for URL) each cost one.
func editDistance(a, b string) int {
	// Three rows: the one before last, the last, and this one.
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// WarnUnknownEnv logs, at warning level, UnknownEnv's warnings for the
// program of ctx (KnownEnv) over environ: a misspelt PROG_* variable is
// otherwise ignored without a word. Outside Run it does nothing.
func WarnUnknownEnv(ctx context.Context, log *slog.Logger, environ []string) {
	known, ok := KnownEnv(ctx)
	if !ok {
		return
	}
	p := ctx.Value(programKey{}).(program)
	for _, w := range UnknownEnv(envPrefix(p.path), known, environ) {
		log.Warn(w)
	}
}
