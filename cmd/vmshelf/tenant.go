package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/cli"
)

// tenantHelp is "vmshelf tenant -h".
var tenantHelp = cli.Doc{
	Args:    "COMMAND [arguments] [flags]",
	Summary: "manage the boxes (tenants) the edge knows",
	About: `Adds, lists, changes and removes the boxes (tenants) in the store of --data-dir, also while ` +
		`serve runs. A token is printed once, on stdout, and stored only as a hash.`,
}

// tenantCommands are "vmshelf tenant COMMAND".
var tenantCommands = []cli.Command{
	cli.SubCommand("add", tenant, cli.Doc{
		Args:    "NAME [flags]",
		Summary: "add a box and print its token once",
		About: `Adds the box NAME (1 to 63 characters a-z, 0-9 and '-') with the attributes ` +
			`the flags give, and prints its new token on stdout, once; the store keeps only its ` +
			`hash. The data dir is created if it is missing.`,
		Env: []cli.EnvVar{storeURLVar},
		Exits: []string{"0  added; the token is on stdout", "1  a box NAME exists already, or the store failed",
			"2  a usage error (a bad flag, value or NAME); nothing was changed"},
	}),
	cli.SubCommand("list", tenant, cli.Doc{
		Args:    "[flags]",
		Summary: "list the boxes and their attributes",
		About:   `Prints a table of the boxes on stdout: name, attributes and when each was added (UTC). No token is shown.`,
		Env:     []cli.EnvVar{storeURLVar},
	}),
	cli.SubCommand("set", tenant, cli.Doc{
		Args:    "NAME [flags]",
		Summary: "change a box's attributes (only those given)",
		About: `Changes the attributes of the box NAME that the flags give, and no others ` +
			`(--sharing=false turns one off), then prints the box's line as list does.`,
		Env: []cli.EnvVar{storeURLVar},
		Exits: []string{"0  changed", "1  no box NAME, or the store failed",
			"2  a usage error (a bad flag, value or NAME); nothing was changed"},
	}),
	cli.SubCommand("token", tenant, cli.Doc{
		Args:    "NAME [flags]",
		Summary: "rotate a box's token and print the new one once",
		About: `Gives the box NAME a new token and prints it on stdout, once; the old token ` +
			`stops working at once.`,
		Env: []cli.EnvVar{storeURLVar},
		Exits: []string{"0  rotated; the token is on stdout", "1  no box NAME, or the store failed",
			"2  a usage error (a bad flag or NAME); nothing was changed"},
	}),
	cli.SubCommand("rm", tenant, cli.Doc{
		Args:    "NAME [flags]",
		Summary: "remove a box that holds nothing on the edge",
		About: `Removes the box NAME; its token stops working at once. A box that still holds ` +
			`something is refused, and the message says what and how it ends: images (the box ` +
			`removes them with 'vmshelf rm'), unused upload tickets ('vmshelf cancel', or they ` +
			`expire), uploads running or resumable (they end, or expire 24 hours after their ` +
			`last byte), open listings (closed by the box), and orders as buyer or host in any ` +
			`state: order records are the market's history and keep their boxes, so such a box ` +
			`is locked out instead ('tenant set NAME --sharing=false', then 'tenant token NAME'). ` +
			`Its ended tickets and closed listings go with it.`,
		Env: []cli.EnvVar{storeURLVar},
		Exits: []string{"0  removed", "1  no box NAME, it still holds something (the message says what), or the store failed",
			"2  a usage error (a bad flag or NAME); nothing was changed"},
	}),
}

// tenant runs "vmshelf tenant SUB". Tokens are printed once, to stdout,
// and stored only as hashes.
func tenant(ctx context.Context, sub string, doc cli.Doc, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenant "+sub, doc)
	dataDir := fs.String("data-dir", defaultData, "directory of the store")
	var attrs tenantAttrs
	if sub == "add" || sub == "set" {
		attrs.define(fs)
	}
	// NAME may come before the flags (as the usage shows) or after them.
	name := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usagef("tenant %s: unexpected argument %q", sub, fs.Arg(0))
	}
	if sub == "list" && name != "" {
		return usagef("tenant list takes no arguments, got %q", name)
	}
	if sub != "list" && name == "" {
		return usagef("tenant %s needs a NAME; see vmshelf tenant %s -h", sub, sub)
	}
	if sub != "list" && !validTenantName(name) {
		return usagef("tenant name %q: use 1-63 characters a-z, 0-9 and '-'", name)
	}
	st, err := openRecords(ctx, *dataDir, sub == "add", os.Getenv, 0)
	if err != nil {
		return err
	}
	defer st.Close()

	switch sub {
	case "add":
		t := imagestore.Tenant{Name: name}
		attrs.apply(fs, &t)
		token := imagestore.NewSecret()
		if _, err := st.CreateTenant(ctx, t, imagestore.HashSecret(token)); err != nil {
			if errors.Is(err, imagestore.ErrExists) {
				return fmt.Errorf("tenant %s exists already; use 'vmshelf tenant token %s' for a new token", name, name)
			}
			return err
		}
		fmt.Fprintln(stderr, "tenant", name, "added; its token follows, shown only this once:")
		fmt.Fprintln(stdout, token)
	case "set":
		t, err := st.Tenant(ctx, name)
		if err != nil {
			return notFound(err, name)
		}
		attrs.apply(fs, &t)
		if err := st.UpdateTenant(ctx, t); err != nil {
			return err
		}
		printTenants(stdout, []imagestore.Tenant{t})
	case "token":
		token := imagestore.NewSecret()
		if err := st.SetTenantToken(ctx, name, imagestore.HashSecret(token)); err != nil {
			return notFound(err, name)
		}
		fmt.Fprintln(stderr, "tenant", name, "has a new token (the old one no longer works); shown only this once:")
		fmt.Fprintln(stdout, token)
	case "rm":
		if err := st.RemoveTenant(ctx, name, time.Now()); err != nil {
			return tenantHeld(notFound(err, name), name)
		}
		fmt.Fprintln(stderr, "tenant", name, "removed; its token no longer works")
		fmt.Fprintln(stdout, "removed", name)
	case "list":
		ts, err := st.Tenants(ctx)
		if err != nil {
			return err
		}
		printTenants(stdout, ts)
	}
	return nil
}

// tenantHeld explains a refused tenant rm: what the box still holds, and
// how each ends.
func tenantHeld(err error, name string) error {
	var h *imagestore.TenantInUse
	if !errors.As(err, &h) {
		return err
	}
	var held []string
	for _, c := range []struct {
		n         int
		what, how string
	}{
		{h.Images, "image(s)", "the box removes them: vmshelf rm"},
		{h.Tickets, "unused upload ticket(s)", "vmshelf cancel, or they expire"},
		{h.Uploads, "upload(s) running", "they end with their connection"},
		{h.Sessions, "resumable upload(s)", "ended by DELETE on the session, or 24 hours after their last byte"},
		{h.Listings, "open listing(s)", "the box closes them"},
		{h.Orders, "order(s) as buyer or host", "kept as history: lock the box out with 'tenant set " + name +
			" --sharing=false' and 'tenant token " + name + "' instead"},
	} {
		if c.n > 0 {
			held = append(held, fmt.Sprintf("%d %s (%s)", c.n, c.what, c.how))
		}
	}
	return fmt.Errorf("tenant %s was not removed: it still holds %s", name, strings.Join(held, "; "))
}

func notFound(err error, name string) error {
	if errors.Is(err, imagestore.ErrNotFound) {
		return fmt.Errorf("no tenant named %s ('vmshelf tenant list' shows them)", name)
	}
	return err
}

// tenantAttrs are the flags of add and set; set changes only those given.
type tenantAttrs struct {
	sharing, inMesh, hostsVMs *bool
	appliance, stripeAccount  *string
}

func (a *tenantAttrs) define(fs *flag.FlagSet) {
	a.sharing = fs.Bool("sharing", false, "the box shares its disk")
	a.inMesh = fs.Bool("in-mesh", false, "the box is a member of the mesh")
	a.hostsVMs = fs.Bool("hosts-vms", false, "the box hosts VMs (joined with host-vms on)")
	a.appliance = fs.String("appliance", "", "the box's Kubernetes node label value")
	a.stripeAccount = fs.String("stripe-account", "", "the box's Stripe Connect account id")
}

func (a *tenantAttrs) apply(fs *flag.FlagSet, t *imagestore.Tenant) {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sharing":
			t.Sharing = *a.sharing
		case "in-mesh":
			t.InMesh = *a.inMesh
		case "hosts-vms":
			t.HostsVMs = *a.hostsVMs
		case "appliance":
			t.Appliance = *a.appliance
		case "stripe-account":
			t.StripeAccount = *a.stripeAccount
		}
	})
}

func printTenants(w io.Writer, ts []imagestore.Tenant) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tIN_MESH\tSHARING\tHOSTS_VMS\tAPPLIANCE\tSTRIPE_ACCOUNT\tCREATED (UTC)")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%t\t%t\t%t\t%s\t%s\t%s\n", t.Name, t.InMesh, t.Sharing, t.HostsVMs,
			dash(t.Appliance), dash(t.StripeAccount), utcMinute(t.CreatedAt))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// validTenantName keeps names DNS-label shaped: they become namespace parts.
func validTenantName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}
