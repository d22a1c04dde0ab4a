package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/uploadclient"
)

// powerDoc is the help of "vmshelf orders ACTION": start, stop or
// restart (done, its past tense, is what it prints).
func powerDoc(action, done, about string) cli.Doc {
	return cli.Doc{
		Args:    "--token-file F [flags] ORDER_ID[/N]...",
		Summary: action + " machines of this box's orders",
		About: about + ` ORDER_ID alone names every replica of the order; ORDER_ID/N its replica N ` +
			`(0 is the first, as the Machines page counts them). For each replica the edge takes it ` +
			`on, it prints "` + done + ` vm-ORDER_ID-N"; the machine ` + action + `s a moment after. ` +
			`A replica that cannot take it (already in that state, still importing its disk, an order ` +
			`not running or over) is printed with the reason, and the command exits 1. The first ` +
			`argument refused as a whole ends the command: the ones after it are not tried. ` +
			`A lost answer is asked again with the same request id, so a machine is never ` + done +
			` twice by one command.

The token is read from the --token-file (never from a flag or the environment).`,
		Exits: append([]string{"0  every replica named took the action"}, ordersExits...),
	}
}

var (
	ordersStartHelp = powerDoc("start", "started",
		`Starts machines of this box's orders that were stopped. A started machine boots from its `+
			`own disk as it was left. A machine past its order's paid month cannot be started.`)
	ordersStopHelp = powerDoc("stop", "stopped",
		`Stops machines of this box's orders, as their power button would: KubeVirt asks the guest `+
			`to shut down, and turns it off if it does not within its grace period. The disk stays as `+
			`it is, and the machine starts again with 'vmshelf orders start'. Stopped time is part of `+
			`the paid month: it is not refunded and does not move the order's end.`)
	ordersRestartHelp = powerDoc("restart", "restarted",
		`Restarts running machines of this box's orders: KubeVirt stops the machine and starts it `+
			`again from its disk, which helps a guest that hangs. A stopped machine is started, not `+
			`restarted.`)
)

// ordersPower is 'vmshelf orders start|stop|restart'.
func ordersPower(action, done string, doc cli.Doc) func(context.Context, []string, io.Writer, io.Writer) error {
	name := "orders " + action
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		cf, targets, err := parseControlCommand(name, doc, args, nil)
		if err != nil {
			return err
		}
		if len(targets) == 0 {
			return usagef("%s needs the ORDER_ID[/N]s of the machines to %s (see 'vmshelf orders list')", name, action)
		}
		type target struct {
			order   string
			replica int
		}
		var ts []target
		for _, arg := range targets {
			order, rep, hasReplica := strings.Cut(arg, "/")
			t := target{order: order, replica: uploadclient.AllReplicas}
			if !imagestore.ValidOrderID(order) {
				return usagef("%s: %q is not an ORDER_ID ('o' and 16 hex characters; see 'vmshelf orders list')", name, order)
			}
			if hasReplica {
				n, err := strconv.Atoi(rep)
				if err != nil || n < 0 || rep != strconv.Itoa(n) {
					return usagef("%s: %q: the replica after '/' is a number, 0 for the first", name, arg)
				}
				t.replica = n
			}
			ts = append(ts, t)
		}
		c, err := cf.dial(name)
		if err != nil {
			return err
		}
		refused := 0
		for i, t := range ts {
			outcomes, err := c.Power(ctx, t.order, t.replica, action)
			if err != nil {
				if left := targets[i+1:]; len(left) > 0 {
					err = fmt.Errorf("%w (not tried: %s)", err, strings.Join(left, " "))
				}
				return clientExit(err)
			}
			for _, o := range outcomes {
				if o.Accepted() {
					fmt.Fprintln(stdout, done, o.Name)
					continue
				}
				refused++
				fmt.Fprintf(stdout, "not %s %s: %s (%s)\n", done, o.Name, o.Error, o.Outcome)
			}
		}
		if refused > 0 {
			return fmt.Errorf("%d of the machines named not %s; the lines above say why", refused, done)
		}
		return nil
	}
}
