package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/uploadclient"
)

// ordersHelp is "vmshelf orders -h".
var ordersHelp = cli.Doc{
	Args:    "COMMAND [arguments] [flags]",
	Summary: "list this box's machine orders, cancel one not paid yet, start, stop and restart machines",
	About: `The machines this box ordered on the edge's market (the Machines page places them): ` +
		`list them, cancel one that is still awaiting payment, which gives its replicas back ` +
		`to the offer, and start, stop or restart the machines of a running order. The commands ` +
		`ask the edge's control plane with this box's token.`,
}

// ordersExits are the exit codes of both orders commands.
var ordersExits = []string{
	"1  refused: the control plane said no (an order not this box's, one not awaiting payment, " +
		"a machine that cannot take the action, not sharing, token); the message says why",
	"2  a usage error, or the token file cannot be read",
	"3  the control plane did not answer, or was busy; run the same command again",
}

// ordersListHelp is "vmshelf orders list -h".
var ordersListHelp = cli.Doc{
	Args:    "[--control URL] --token-file F [flags]",
	Summary: "list this box's orders",
	About: `Lists the machines this box ordered on the edge, newest first, as the control plane's ` +
		`status has them: a table of order id, name, state, replicas, total, host and when it was ` +
		`ordered (UTC). An order awaiting payment is paid at Stripe Checkout (the Machines page ` +
		`links it) or cancelled with 'vmshelf orders cancel'. With --json, the orders as one JSON ` +
		`array on stdout.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: append([]string{"0  listed (no order: nothing on stdout, or [] with --json)"}, ordersExits...),
}

// ordersCancelHelp is "vmshelf orders cancel -h".
var ordersCancelHelp = cli.Doc{
	Args:    "[--control URL] --token-file F [flags] ORDER_ID...",
	Summary: "cancel this box's orders that are awaiting payment",
	About: `Cancels orders of this box that are awaiting payment, in the order given, and prints ` +
		`"cancelled ORDER_ID" for each. The order's replicas go back to the offer at once, and its ` +
		`Stripe Checkout is ended, so it can be paid no more. A payment that reached Stripe before ` +
		`the cancel is refunded in full. An order that is paid, running, over or cancelled already ` +
		`is refused, saying which. The first refusal ends the command: the orders before it are ` +
		`cancelled, the ones after it are not tried. 'vmshelf orders list' lists the ORDER_IDs.

The token is read from the --token-file (never from a flag or the environment).`,
	Exits: append([]string{"0  every order given is cancelled"}, ordersExits...),
}

// ordersCommands are "vmshelf orders COMMAND".
var ordersCommands = []cli.Command{
	{Name: "list", Doc: ordersListHelp, Run: ordersList},
	{Name: "cancel", Doc: ordersCancelHelp, Run: ordersCancel},
	{Name: "start", Doc: ordersStartHelp, Run: ordersPower("start", "started", ordersStartHelp)},
	{Name: "stop", Doc: ordersStopHelp, Run: ordersPower("stop", "stopped", ordersStopHelp)},
	{Name: "restart", Doc: ordersRestartHelp, Run: ordersPower("restart", "restarted", ordersRestartHelp)},
}

// ordersCancel is 'vmshelf orders cancel'.
func ordersCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return idCommand{name: "orders cancel", doc: ordersCancelHelp, kind: orderIDs, what: "of the orders to cancel",
		done: "cancelled", call: uploadclient.Control.CancelOrder}.run(ctx, args, stdout)
}

// ordersList is 'vmshelf orders list'.
func ordersList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cf, rest, err := parseControlCommand("orders list", ordersListHelp, args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the list as one JSON array")
	})
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("orders list takes no arguments, got %q", rest[0])
	}
	c, err := cf.dial("orders list")
	if err != nil {
		return err
	}
	orders, err := c.Orders(ctx)
	if err != nil {
		return clientExit(err)
	}
	if asJSON {
		b, err := json.Marshal(orders)
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(b, '\n'))
		return err
	}
	if len(orders) == 0 {
		fmt.Fprintln(stderr, "this box has no orders on the edge")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER_ID\tNAME\tSTATE\tREPLICAS\tTOTAL\tHOST\tORDERED (UTC)")
	for _, o := range orders {
		state := o.State
		if o.Reason != "" {
			state += " (" + o.Reason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", o.OrderID, o.Name, state, o.Quantity,
			billing.Amount(o.Total, o.Currency), o.Host, utcMinute(o.CreatedAt))
	}
	return tw.Flush()
}
