package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/cli"
)

// maxFetchURLTTL is the longest --ttl: 31 days, the longest month an order
// runs, which is as long as the edge itself lets a fetch token live (the
// provisioner's end with the order). A fetch URL is a capability that
// anyone holding it may use; one that works for years is a leak waiting
// to happen, and nothing needs one longer than an order.
const maxFetchURLTTL = 31 * 24 * time.Hour

// fetchURLHelp is "vmshelf fetch-url -h".
var fetchURLHelp = cli.Doc{
	Args:    "UPLOAD_ID [flags]",
	Summary: "mint a fetch URL for an image and print it once",
	About: `Mints a fetch capability for the image UPLOAD_ID in the store of --data-dir and ` +
		`prints its URL on stdout, once: the operator's way to hand an image to an importer ` +
		`(CDI, curl, qemu-img) by hand. The URL works for --ttl, at most 744h (31 days, an ` +
		`order's month); its base is --public-url, or http://<data-addr>, or, with ` +
		`neither set, the base the edge serving --data-dir hands out (it records it there ` +
		`when it starts). Works while serve runs.`,
	Env: []cli.EnvVar{storeURLVar},
	Exits: []string{"0  minted; the URL is on stdout", "1  no image UPLOAD_ID, or the store failed",
		"2  a usage error (a bad flag, value or UPLOAD_ID, or a data dir that is not one)"},
}

// fetchURL mints a fetch capability for an image and prints its URL once:
// the operator's way to hand an image to an importer by hand.
func fetchURL(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fetch-url", fetchURLHelp)
	dataDir := fs.String("data-dir", defaultData, "directory of the store")
	ttl := fs.Duration("ttl", time.Hour, "how long the URL works, at most 744h")
	dataAddr := fs.String("data-addr", "127.0.0.1:8480", "the data plane's address (the URL's base when --public-url is empty)")
	publicURL := fs.String("public-url", "", "base of the URL (default http://<data-addr>)")
	id := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usagef("fetch-url takes one UPLOAD_ID")
	}
	if !imagestore.ValidUploadID(id) {
		return usagef("fetch-url needs an UPLOAD_ID (24 hex characters), got %q", id)
	}
	if *ttl <= 0 {
		return usagef("--ttl must be positive")
	}
	if *ttl > maxFetchURLTTL {
		return usagef("--ttl %v is longer than 744h (31 days), the longest a fetch URL may work: an order's month", *ttl)
	}
	base, err := fetchURLBase(fs, *dataDir, *publicURL, *dataAddr, stderr)
	if err != nil {
		return err
	}
	st, err := openRecords(ctx, *dataDir, false, os.Getenv, 0)
	if err != nil {
		return err
	}
	defer st.Close()
	token := imagestore.NewSecret()
	ft := imagestore.FetchToken{UploadID: id, ExpiresAt: time.Now().Add(*ttl).UTC()}
	if err := st.CreateFetchToken(ctx, imagestore.HashSecret(token), ft); err != nil {
		if errors.Is(err, imagestore.ErrNotFound) {
			where := *dataDir
			if st.shared() {
				where = st.name
			}
			return fmt.Errorf("no image %s in %s", id, where)
		}
		return err
	}
	fmt.Fprintf(stderr, "fetch URL for %s, valid until %s (shown only this once):\n", id, ft.ExpiresAt.Format(time.RFC3339))
	fmt.Fprintln(stdout, base+"/market/vm-images/fetch/"+token)
	return nil
}

// fetchURLBase is the base of the URL fetch-url prints: --public-url or
// --data-addr when either is set (as a flag or a variable); otherwise the
// one the edge serving dataDir recorded there, since that edge's flags are
// not fetch-url's; otherwise the default address, said on stderr.
func fetchURLBase(fs *flag.FlagSet, dataDir, publicURL, dataAddr string, stderr io.Writer) (string, error) {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "public-url" || f.Name == "data-addr" })
	if set {
		return publicBase(publicURL, dataAddr)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, publicURLFile))
	switch {
	case err == nil:
		return publicBase(strings.TrimSpace(string(b)), dataAddr)
	case !errors.Is(err, iofs.ErrNotExist):
		return "", fmt.Errorf("reading the edge's public URL: %w", err)
	}
	fmt.Fprintf(stderr, "no edge has served %s yet, so the URL's base is http://%s; --public-url sets it\n", dataDir, dataAddr)
	return publicBase(publicURL, dataAddr)
}
