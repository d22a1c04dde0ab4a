package main

import (
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// TestE2EReadyzEveryProblem: a serve with --vms-enable, a Stripe key but
// no webhook secret, and no cluster answers /readyz 200 with both
// problems: the webhook first (as machines, where it always was), then
// the cluster, which the first used to hide. The answer is checked
// against docs/openapi.yaml like every answer of these tests.
func TestE2EReadyzEveryProblem(t *testing.T) {
	needTool(t, "curl")
	key, _ := stripeTestSecrets()
	fake, err := stripetest.New(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--vms-enable", "--stripe-api-base", fake.URL},
		append(append([]string{}, noStripeEnv...), "STRIPE_SECRET_KEY="+key)...)
	s.secret(key)
	code, body := s.readyz(t)
	var ready struct {
		Status   string   `json:"status"`
		Machines string   `json:"machines"`
		Reasons  []string `json:"reasons"`
	}
	decode(t, body, &ready)
	want := []string{"webhookNotConfigured", "clusterUnreachable"}
	if code != http.StatusOK || ready.Status != "ok" || ready.Machines != want[0] || !slices.Equal(ready.Reasons, want) {
		t.Errorf("/readyz: %d %s, want 200 ok with machines %q and reasons %q", code, body, want[0], want)
	}
}
