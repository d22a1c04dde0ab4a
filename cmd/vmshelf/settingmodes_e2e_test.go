package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestE2ESettingsWithoutEffectWarned: serve without --vms-enable accepts
// the machine market's settings, set on its command line, in their
// VMSHELF_* variables or as secrets, and its start-up log warns of each
// once, naming it and what would give it effect, never its value; a
// serve that leaves them at their defaults warns of none.
func TestE2ESettingsWithoutEffectWarned(t *testing.T) {
	t.Parallel()
	key, whsec := stripeTestSecrets()
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{
		"--vms-domain", "vms.example.org", "--vm-cpu", "2", "--currency", "usd", "--kubeconfig", "/nonexistent",
		"--stripe-api-base", "https://stripe-elsewhere.example", "--consoles-per-tenant", "3",
	}, append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key,
		"STRIPE_WEBHOOK_SECRET_FILE="+secretFile(t, whsec), "VMSHELF_VM_MEMORY_MIB=4096")...)
	s.secret(key)
	s.secret(whsec)
	s.stop()
	logs := s.logs()
	want := []string{
		"--vms-domain has no effect without --vms-enable",
		"--vm-cpu has no effect without --vms-enable",
		"VMSHELF_VM_MEMORY_MIB (--vm-memory-mib) has no effect without --vms-enable",
		"--currency has no effect without --vms-enable",
		"--kubeconfig has no effect without --vms-enable",
		"--consoles-per-tenant has no effect without --vms-enable",
		// Stripe's settings still settle the orders of an earlier run
		// with --vms-enable, and their warnings say so.
		"--stripe-api-base has no effect without --vms-enable, but",
		"STRIPE_SECRET_KEY has no effect without --vms-enable, but",
		"STRIPE_WEBHOOK_SECRET_FILE has no effect without --vms-enable, but",
	}
	for _, w := range want {
		var lines []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, w) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") {
			t.Errorf("serve's log has %d lines saying %q, want one warning:\n%s", len(lines), w, logs)
		}
	}
	if n := strings.Count(logs, "has no effect"); n != len(want) {
		t.Errorf("serve warned of %d settings without effect, want %d:\n%s", n, len(want), logs)
	}
	for _, v := range []string{"vms.example.org", "/nonexistent", "stripe-elsewhere"} {
		if strings.Contains(logs, v) {
			t.Errorf("serve's log tells the value %q:\n%s", v, logs)
		}
	}

	d := startServe(t, filepath.Join(t.TempDir(), "data"), nil, noStripeEnv...)
	d.stop()
	if strings.Contains(d.logs(), "has no effect") {
		t.Errorf("serve with every setting at its default warns:\n%s", d.logs())
	}
}
