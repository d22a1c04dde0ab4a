package main

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// unsetEnv clears, for the test, every variable with one of prefixes: the
// developer's own settings are not under test.
func unsetEnv(t *testing.T, prefixes ...string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				t.Setenv(k, "")
				os.Unsetenv(k)
			}
		}
	}
}

// TestSettingsWithoutEffect: each setting that acts only in some modes,
// set on the command line, in its VMSHELF_* variable or as a secret in a
// mode where it has no effect, is named once in a warning that says what
// would give it effect (or, for --blob-capacity-gib, refused); set where
// it acts, or left at its default, it is not. The wanted warnings are
// written out here, not taken from settingModes: a setting dropped from
// the table fails its case.
func TestSettingsWithoutEffect(t *testing.T) {
	const noVMs = " has no effect without --vms-enable"
	const settles = ", but for the orders taken while it was on (their payments, webhooks and refunds)"
	machineFlags := []string{"--vm-cpu", "2", "--vm-memory-mib", "4096", "--vm-disk-gib", "30", "--vm-storage-class", "fast",
		"--vms-domain", "vms.example.org", "--kubeconfig", "/nonexistent", "--currency", "usd",
		"--stripe-api-base", "https://stripe.example", "--stripe-timeout", "5s", "--refund-deadline", "1h", "--refund-every", "2m",
		"--console-idle", "1m", "--console-timeout", "5s", "--consoles-per-tenant", "3", "--consoles-per-edge", "40"}
	said := "" // every warning and refusal wanted below
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		want    []string
		refused string
	}{
		{name: "defaults"},
		{name: "settings that act in every mode", args: []string{"--vm-catalogue", "../../catalogue/vm-images.json",
			"--checkout-return-url", "https://edge.example/machines", "--tus-checkpoint-mib", "8", "--dev", "--headroom-mib", "16"}},
		{name: "the machine market without --vms-enable", args: machineFlags, want: []string{
			"--vm-cpu" + noVMs, "--vm-memory-mib" + noVMs, "--vm-disk-gib" + noVMs, "--vm-storage-class" + noVMs,
			"--vms-domain" + noVMs, "--kubeconfig" + noVMs, "--currency" + noVMs,
			"--stripe-api-base" + noVMs + " and STRIPE_SECRET_KEY", "--stripe-timeout" + noVMs + " and STRIPE_SECRET_KEY",
			"--refund-deadline" + noVMs + " and STRIPE_SECRET_KEY", "--refund-every" + noVMs + " and STRIPE_SECRET_KEY",
			"--console-idle" + noVMs, "--console-timeout" + noVMs, "--consoles-per-tenant" + noVMs, "--consoles-per-edge" + noVMs,
		}},
		{name: "the machine market with --vms-enable and Stripe's secrets", args: append([]string{"--vms-enable"}, machineFlags...),
			env: []string{"STRIPE_SECRET_KEY=sk_test_x", "STRIPE_WEBHOOK_SECRET_FILE=/run/secrets/whsec"}},
		{name: "from variables and secrets", env: []string{"VMSHELF_VM_CPU=2", "VMSHELF_REFUND_EVERY=2m",
			"STRIPE_SECRET_KEY_FILE=/run/secrets/key", "STRIPE_WEBHOOK_SECRET=whsec_x"}, want: []string{
			"VMSHELF_VM_CPU (--vm-cpu)" + noVMs, "VMSHELF_REFUND_EVERY (--refund-every)" + noVMs + settles,
			"STRIPE_SECRET_KEY_FILE" + noVMs + settles, "STRIPE_WEBHOOK_SECRET" + noVMs + settles,
		}},
		{name: "Stripe's flags with --vms-enable and no key", args: []string{"--vms-enable", "--stripe-api-base", "https://stripe.example",
			"--refund-deadline", "1h"}, want: []string{
			"--stripe-api-base has no effect without STRIPE_SECRET_KEY", "--refund-deadline has no effect without STRIPE_SECRET_KEY",
		}},
		// The page's address is the origin the data plane always lets
		// upload, beside --cors-origin's: it acts in every mode.
		{name: "the page's address beside --cors-origin", args: []string{"--checkout-return-url", "https://edge.example/machines",
			"--cors-origin", "https://boxes.example"}},
		{name: "the image directory's and the bucket's", args: []string{"--blobs", "s3://bucket/edge", "--blob-capacity-gib", "4",
			"--tus-checkpoint-mib", "8"}, want: []string{
			"--tus-checkpoint-mib has no effect with --blobs s3://… (a resumable upload is made durable at the end of every part there)",
		}},
		{name: "the bucket's signing without a bucket", env: []string{"VMSHELF_S3_PAYLOAD_SIGNING=signed"}, want: []string{
			"VMSHELF_S3_PAYLOAD_SIGNING has no effect without --blobs s3://…",
		}},
		{name: "a bucket's capacity without a bucket", args: []string{"--blob-capacity-gib", "4"},
			refused: "--blob-capacity-gib has no effect without --blobs s3://…: "},
		{name: "a bucket's capacity without a bucket, from its variable", env: []string{"VMSHELF_BLOB_CAPACITY_GIB=4"},
			refused: "VMSHELF_BLOB_CAPACITY_GIB (--blob-capacity-gib) has no effect without --blobs s3://…: "},
	} {
		for _, w := range append(tc.want, tc.refused) {
			said += w + "\n"
		}
		t.Run(tc.name, func(t *testing.T) {
			unsetEnv(t, "VMSHELF_", "STRIPE_")
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			f, err := parseServeFlags(tc.args)
			if tc.refused != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.refused) || exitCode(err, &strings.Builder{}) != 2 {
					t.Errorf("%v: %v, want the usage error %q…", tc.args, err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.withoutEffect, tc.want) {
				t.Errorf("%v %v warns\n%q\nwant\n%q", tc.args, tc.env, f.withoutEffect, tc.want)
			}
		})
	}
	// A setting added to settingModes is added to a case above.
	for _, st := range settingModes {
		names := st.env
		if st.flag != "" {
			names = []string{"--" + st.flag}
		}
		if !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(said, n+" ") || strings.Contains(said, "("+n+")") }) {
			t.Errorf("settingModes has %s, which no case here sets where it has no effect", names[0])
		}
	}
}

// TestSettingModesInHelp: serve -h puts the mode each such flag acts in
// before its text, and the table names only serve's flags.
func TestSettingModesInHelp(t *testing.T) {
	for _, s := range settingModes {
		for _, name := range s.env {
			if !strings.HasPrefix(name, "VMSHELF_") && !strings.HasPrefix(name, "STRIPE_") {
				t.Errorf("settingModes names the variable %s, which serve does not read", name)
			}
		}
	}
	var h cli.HelpShown
	if _, err := parseServeFlags([]string{"-h"}); !errors.As(err, &h) {
		t.Fatalf("serve -h: %v", err)
	}
	help := h.Text
	for flag, want := range map[string]string{
		"vm-cpu":             "with --vms-enable: vCPUs per replica",
		"refund-every":       "with --vms-enable and STRIPE_SECRET_KEY: how often refunds",
		"tus-checkpoint-mib": "without --blobs s3://…: a resumable upload",
		"blob-capacity-gib":  "with --blobs s3://…: what the bucket may hold",
	} {
		_, text, _ := strings.Cut(help, "  --"+flag+" ")
		if text = strings.Join(strings.Fields(text), " "); !strings.Contains(text, want) || strings.Index(text, want) > 60 {
			t.Errorf("serve -h: --%s does not start %q", flag, want)
		}
	}
}

// TestSettingModesDocumented: docs/operations.md's table of the settings
// that act only in some modes names every one settingModes has.
func TestSettingModesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### Settings that act only in some modes\n")
	section, _, _ = strings.Cut(section, "\n#")
	if !ok {
		t.Fatal(`docs/operations.md has no "### Settings that act only in some modes"`)
	}
	for _, s := range settingModes {
		name := s.env
		if s.flag != "" {
			name = []string{"--" + s.flag}
		}
		if !strings.Contains(section, "| `"+name[0]+"`") && !strings.Contains(section, ", `"+name[0]+"`") {
			t.Errorf("docs/operations.md's settings by mode do not name %s in a row", name[0])
		}
	}
}
