package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/internal/cli"
)

// Some of serve's settings act only in some modes: the machine market's
// only with --vms-enable, Stripe's only with a key, the image directory's
// only without an S3 bucket. Every flag is still parsed and checked in
// every mode, but one set where it does nothing would otherwise be
// accepted without a word: an operator who sets --vm-cpu and forgets
// --vms-enable learns of it only when a box asks why no machine is
// offered. settingModes says what gives each such setting effect; serve
// warns once of each one set (on the command line or in its variable)
// where it has none, refuses those whose being ignored would mislead, and
// its -h puts the same condition before each flag's text.

// serveMode is what decides which settings act.
type serveMode struct {
	vms       bool // --vms-enable
	stripeKey bool // STRIPE_SECRET_KEY or STRIPE_SECRET_KEY_FILE is set
	s3        bool // --blobs s3://…
}

// modeNeed is one condition a setting acts under: with is how -h says it
// ("with --vms-enable"), without how a warning says it is not met.
type modeNeed struct {
	with, without string
	met           func(serveMode) bool
}

var (
	needVMs = modeNeed{"with --vms-enable", "without --vms-enable",
		func(m serveMode) bool { return m.vms }}
	needStripeKey = modeNeed{"with STRIPE_SECRET_KEY", "without STRIPE_SECRET_KEY",
		func(m serveMode) bool { return m.stripeKey }}
	needImageDir = modeNeed{"without --blobs s3://…",
		"with --blobs s3://… (a resumable upload is made durable at the end of every part there)",
		func(m serveMode) bool { return !m.s3 }}
	needS3 = modeNeed{"with --blobs s3://…", "without --blobs s3://…", func(m serveMode) bool { return m.s3 }}
)

// modeSetting is a setting that some modes ignore: a flag of serve, or a
// variable that is no flag's (a secret is read from NAME or NAME_FILE).
type modeSetting struct {
	flag  string   // the flag's name; "" for variables
	env   []string // or the variables that set it (a secret or its _FILE)
	needs []modeNeed
	// settles: the orders an earlier run with --vms-enable took are
	// still paid, confirmed and refunded with it, so without
	// --vms-enable alone it is not quite idle, and its warning says so.
	settles bool
	// refuse is why serve refuses to start with the setting where it has
	// no effect, for a setting whose being ignored would mislead about
	// what the edge does; "" warns.
	refuse string
}

// settingModes are the settings that act only in some modes, in the order
// of serve's flags. Every other flag acts in every mode: --vm-catalogue,
// say, is what GET /market/vm-images and the Machines page list with or
// without --vms-enable.
var settingModes = []modeSetting{
	{flag: "vm-cpu", needs: []modeNeed{needVMs}},
	{flag: "vm-memory-mib", needs: []modeNeed{needVMs}},
	{flag: "vm-disk-gib", needs: []modeNeed{needVMs}},
	{flag: "vm-storage-class", needs: []modeNeed{needVMs}},
	{flag: "vms-domain", needs: []modeNeed{needVMs}},
	{flag: "kubeconfig", needs: []modeNeed{needVMs}},
	{flag: "currency", needs: []modeNeed{needVMs}},
	{flag: "stripe-api-base", needs: []modeNeed{needVMs, needStripeKey}, settles: true},
	{flag: "stripe-timeout", needs: []modeNeed{needVMs, needStripeKey}, settles: true},
	{flag: "refund-deadline", needs: []modeNeed{needVMs, needStripeKey}, settles: true},
	{flag: "refund-every", needs: []modeNeed{needVMs, needStripeKey}, settles: true},
	{flag: "console-idle", needs: []modeNeed{needVMs}},
	{flag: "console-timeout", needs: []modeNeed{needVMs}},
	{flag: "consoles-per-tenant", needs: []modeNeed{needVMs}},
	{flag: "consoles-per-edge", needs: []modeNeed{needVMs}},
	{flag: "tus-checkpoint-mib", needs: []modeNeed{needImageDir}},
	// A capacity the image directory ignored would be a limit on the
	// disk's use that is not there.
	{flag: "blob-capacity-gib", needs: []modeNeed{needS3},
		refuse: "the image directory's free space is its disk's, and nothing caps what vmshelf may use of it"},
	{env: []string{"STRIPE_SECRET_KEY", "STRIPE_SECRET_KEY_FILE"}, needs: []modeNeed{needVMs}, settles: true},
	{env: []string{"STRIPE_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET_FILE"}, needs: []modeNeed{needVMs}, settles: true},
	{env: []string{s3.PayloadSigningEnv}, needs: []modeNeed{needS3}},
}

// describeSettingModes puts, before the text of each flag of fs that
// settingModes names, the condition it acts under: -h then tells which
// flags a mode reads.
func describeSettingModes(fs *flag.FlagSet) {
	for _, s := range settingModes {
		if s.flag == "" {
			continue
		}
		f := fs.Lookup(s.flag)
		if f == nil {
			panic("settingModes names --" + s.flag + ", which serve does not define")
		}
		var with []string
		for _, n := range s.needs {
			with = append(with, n.with)
		}
		f.Usage = joinConditions(with) + ": " + f.Usage
	}
}

// settingsWithoutEffect is a warning for each setting of settingModes set
// in a mode where it has no effect, or the refusal of the first one that
// must not be. fs is serve's parsed flag set, getenv reads the variables.
func (f *serveFlags) settingsWithoutEffect(fs *flag.FlagSet, getenv func(string) string) ([]string, error) {
	m := serveMode{vms: f.vmsEnable, s3: blobsFlagS3(f.blobs),
		stripeKey: getenv("STRIPE_SECRET_KEY") != "" || getenv("STRIPE_SECRET_KEY_FILE") != ""}
	var warnings []string
	for _, s := range settingModes {
		name := s.setBy(fs, getenv)
		if name == "" {
			continue
		}
		var unmet []string
		for _, n := range s.needs {
			if !n.met(m) {
				unmet = append(unmet, n.without)
			}
		}
		if len(unmet) == 0 {
			continue
		}
		w := name + " has no effect " + joinConditions(unmet)
		if s.refuse != "" {
			return nil, usagef("%s: %s; leave it out", w, s.refuse)
		}
		if s.settles && len(unmet) == 1 && !needVMs.met(m) {
			w += ", but for the orders taken while it was on (their payments, webhooks and refunds)"
		}
		warnings = append(warnings, w)
	}
	return warnings, nil
}

// joinConditions is "with A and B" of "with A" and "with B".
func joinConditions(conds []string) string {
	word, _, _ := strings.Cut(conds[0], " ")
	out := conds[0]
	for _, c := range conds[1:] {
		out += " and " + strings.TrimPrefix(c, word+" ")
	}
	return out
}

// setBy is how the operator set s: "--flag" or "VMSHELF_FLAG (--flag)"
// for a flag, else the first of its variables that is set; "" if none.
func (s modeSetting) setBy(fs *flag.FlagSet, getenv func(string) string) string {
	if s.flag != "" {
		by := cli.SetBy(fs, s.flag)
		if by != "" && by != "--"+s.flag {
			by = fmt.Sprintf("%s (--%s)", by, s.flag)
		}
		return by
	}
	for _, name := range s.env {
		if getenv(name) != "" {
			return name
		}
	}
	return ""
}
