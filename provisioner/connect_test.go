package provisioner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConnectRefusesABadKubeconfig: a kubeconfig that cannot be parsed is a
// *ConfigError of one line naming the file.
func TestConnectRefusesABadKubeconfig(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("clusters: [this is: not: a kubeconfig\n\t{"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Connect(garbage, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var ce *ConfigError
	if !errors.As(err, &ce) || strings.ContainsAny(err.Error(), "\n\t") || !strings.Contains(err.Error(), garbage) {
		t.Fatalf("Connect(%s): %q, want a *ConfigError of one line naming the file", garbage, err)
	}
}

// TestConnectOutsideACluster: no kubeconfig outside a cluster is no
// error but a cluster that says why it cannot be reached.
func TestConnectOutsideACluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	c, err := Connect("", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Connect(\"\"): %v, want an unreachable cluster", err)
	}
	if err := c.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("Ping of the unreachable cluster: %v, want the reason naming --kubeconfig", err)
	}
}
