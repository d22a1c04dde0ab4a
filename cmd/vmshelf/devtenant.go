package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore"
)

// ensureDevTenant gives `make run` a tenant to try the service with. The
// token goes to a 0600 file; only its path is printed (devNextStep).
func ensureDevTenant(ctx context.Context, st devTenants, dataDir string) error {
	path := filepath.Join(dataDir, devToken)
	_, err := st.Tenant(ctx, "dev")
	switch {
	case err == nil && devTokenValid(ctx, st, path):
		// Keep the token the developer already uses.
	case errors.Is(err, imagestore.ErrNotFound):
		token := imagestore.NewSecret()
		t := imagestore.Tenant{Name: "dev", InMesh: true, Sharing: true, HostsVMs: true}
		if _, err := st.CreateTenant(ctx, t, imagestore.HashSecret(token)); err != nil {
			return fmt.Errorf("create dev tenant: %w", err)
		}
		if err := writePrivateFile(path, token); err != nil {
			return err
		}
	case err == nil: // the file is lost or stale (rotated by 'tenant token dev'): rotate and write it
		token := imagestore.NewSecret()
		if err := st.SetTenantToken(ctx, "dev", imagestore.HashSecret(token)); err != nil {
			return fmt.Errorf("rotate dev token: %w", err)
		}
		if err := writePrivateFile(path, token); err != nil {
			return err
		}
	default:
		return fmt.Errorf("look up dev tenant: %w", err)
	}
	return nil
}

// devNextStep tells the developer who ran `make run`, once the planes
// listen, where the dev token is and what to do with it: paste it into
// the Machines page at pageURL. Never the token itself.
func devNextStep(stdout io.Writer, tokenPath, pageURL string) {
	fmt.Fprintln(stdout, "dev tenant token in", tokenPath)
	fmt.Fprintf(stdout, "next: open the Machines page, %s, and paste that token (cat %s) as its \"Tenant token\"\n", pageURL, tokenPath)
}

// devTokenValid reports whether the dev-token file holds dev's current token.
func devTokenValid(ctx context.Context, st devTenants, path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	t, err := st.TenantByToken(ctx, imagestore.HashSecret(strings.TrimSpace(string(b))))
	return err == nil && t.Name == "dev"
}

// writePrivateFile writes line to path, readable by its owner only, whole
// or not at all (a file beside it, then renamed over it).
func writePrivateFile(path, line string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(line+"\n"), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
