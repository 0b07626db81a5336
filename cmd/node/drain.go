package main

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/messages"
)

// drainPollInterval is how often "node drain --wait" looks at the node
// while it drains.
const drainPollInterval = 100 * time.Millisecond

// statusPollTimeout bounds one status request made while watching a node
// (drain --wait, up): a node that is stopping may never answer, and the
// watcher must look again rather than wait.
const statusPollTimeout = 2 * time.Second

// drainOptions are the flags of "node drain".
type drainOptions struct {
	Endpoint string
	Wait     bool
	Stay     bool
	Timeout  time.Duration
	creds    credFlags
}

func newDrainCmd() *cobra.Command {
	o := drainOptions{Endpoint: defaultEndpoint, Timeout: 5 * time.Minute}
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Drain a node: it takes no new work, moves or finishes what it has, then leaves",
		Long: `drain asks the node at --endpoint to drain: it tells the cluster it is draining
(routers then send it no new request), moves each request it has in flight
that can move to another decode node, KV and all (node migrate), finishes
the others (or gives up on them after its --drain-timeout), leaves the
cluster gracefully and stops; its node run then exits 0. With --stay it
moves none and finishes them all, as a node of an older build does.

Without --wait, drain prints how many requests the node had in flight and
exits at once. With --wait it waits, at most --timeout, until the node has
left, and prints how many requests were still in flight when it left (0
unless the node's drain timeout passed).

Exit codes: 0 the node accepted the drain (and, with --wait, left), 1 the node
could not be reached, did not answer, or had not left within --timeout, 2
usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := dialOperator(cmd, &o.creds, o.Endpoint, o.Timeout)
			if err != nil {
				return fmt.Errorf("drain: %w", err)
			}
			defer c.close()
			if o.Wait {
				return drainAndWait(cmd.OutOrStdout(), c, o)
			}
			f, err := c.drainFuture(o.Endpoint, &messages.DrainRequest{Stay: o.Stay}, o.Timeout)
			if err != nil {
				return err
			}
			rep, err := drainReply(o.Endpoint, f)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "draining %s: %d requests in flight; it leaves the cluster when they are done\n",
				o.Endpoint, rep.InFlight)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the node to drain (where node run listens)")
	fs.BoolVar(&o.Wait, "wait", o.Wait, "wait until the node has drained and left")
	fs.BoolVar(&o.Stay, "stay", o.Stay, "move no request to another decode node: wait for each to finish here")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the node's answer, and with --wait for it to leave")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	return cmd
}

// drainAndWait asks for the drain and waits until the node has left.
//
// It asks without Wait, which the node answers at once with its in-flight
// count, and then watches the node until it no longer accepts connections,
// or answers as another incarnation (a supervisor restarted it at the same
// address): either way the drained run has left. What was in flight when it
// left is the count its last status showed. Watching, rather than waiting
// for the answer to a DrainRequest with Wait, also tells a node that died
// during the drain from one still draining.
func drainAndWait(w io.Writer, c *controlClient, o drainOptions) error {
	deadline := time.Now().Add(o.Timeout)
	before, err := c.status(o.Endpoint, o.Timeout)
	if err != nil {
		return fmt.Errorf("drain: %s: %w", o.Endpoint, err)
	}
	f, err := c.drainFuture(o.Endpoint, &messages.DrainRequest{Stay: o.Stay}, o.Timeout)
	if err != nil {
		return err
	}
	rep, err := drainReply(o.Endpoint, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "draining %s: %d requests in flight\n", o.Endpoint, rep.InFlight)
	inFlight, moved := int(rep.InFlight), uint64(0)
	left := func(also string) {
		fmt.Fprintf(w, "drained %s: it left the cluster with %d requests in flight, %d moved to other decode nodes by its last status%s\n",
			o.Endpoint, inFlight, moved, also)
	}
	tick := time.NewTicker(drainPollInterval)
	defer tick.Stop()
	for {
		<-tick.C
		if time.Now().After(deadline) {
			return fmt.Errorf("drain: %s has not left within %s (%d requests in flight at the last look)",
				o.Endpoint, o.Timeout, inFlight)
		}
		// Connecting first: a status request to a node that has gone would
		// wait out its timeout.
		if !reachable(o.Endpoint) {
			left("")
			return nil
		}
		if s, err := c.status(o.Endpoint, min(max(time.Until(deadline), time.Millisecond), statusPollTimeout)); err == nil {
			if s.Node.Incarnation != before.Node.Incarnation {
				left(fmt.Sprintf(" (incarnation %016x serves there now)", s.Node.Incarnation))
				return nil
			}
			inFlight, moved = int(s.Node.InFlight), s.Node.MovedOut-before.Node.MovedOut
		}
	}
}

// reachable says whether something accepts connections on endpoint.
func reachable(endpoint string) bool {
	conn, err := net.DialTimeout("tcp", endpoint, reachTimeout)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
