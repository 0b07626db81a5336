package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/messages"
)

// requestsOptions are the flags of "node requests".
type requestsOptions struct {
	Endpoint string
	Limit    int
	Timeout  time.Duration
	creds    credFlags
}

func newRequestsCmd() *cobra.Command {
	o := requestsOptions{Endpoint: defaultEndpoint, Limit: messages.InFlightListMax, Timeout: 10 * time.Second}
	cmd := &cobra.Command{
		Use:   "requests",
		Short: "List a node's requests in flight",
		Long: fmt.Sprintf(`requests asks the node at --endpoint for the requests it has in flight and
prints them, oldest first, one line each:

  ID         the request as the node names it, INCARNATION-NUMBER: the node's
             run and its own number for the request (node cancel takes it;
             a client's request id is unique only to that client)
  TENANT     whose request it is
  CLIENT ID  the request id its client chose
  PHASE      on a decode or all node: queued (waiting for decode pages),
             prefill (the transfer plan is out, no KV has come), transfer (KV
             arriving), decode (generating); on a router: routed (sent to
             its decode node, nothing back yet), decode (tokens coming back)
  DECODE     the decode node it runs on: the node itself, or the one a router
             sent it to
  PREFILL    the prefill node of its current transfer attempt
  AGE        since the node took it
  TOKENS     streamed to its client so far

At most --limit requests are listed (%d at most, the most one answer
carries); a last line says how many more are in flight. Only an operator's
certificate is answered.

Exit codes: 0 printed, 1 the node could not be reached or did not answer
within --timeout, 2 usage error.`, messages.InFlightListMax),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Limit < 1 || o.Limit > messages.InFlightListMax {
				return usageError{fmt.Errorf("--limit (%d) must be 1 to %d", o.Limit, messages.InFlightListMax)}
			}
			c, err := dialOperator(cmd, &o.creds, o.Endpoint, o.Timeout)
			if err != nil {
				return fmt.Errorf("requests: %w", err)
			}
			defer c.close()
			l, err := c.inFlight(o.Endpoint, o.Limit, o.Timeout)
			if err != nil {
				return err
			}
			printInFlight(cmd.OutOrStdout(), o.Endpoint, l)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the node (where node run listens)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "most requests to list, oldest first")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the node's answer")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	return cmd
}

// cancelOptions are the flags of "node cancel".
type cancelOptions struct {
	Endpoint string
	Timeout  time.Duration
	creds    credFlags
}

func newCancelCmd() *cobra.Command {
	o := cancelOptions{Endpoint: defaultEndpoint, Timeout: 10 * time.Second}
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel one of a node's requests in flight",
		Long: `cancel asks the node at --endpoint to cancel its request in flight ID, as
node requests lists it there (INCARNATION-NUMBER): the request's client is
answered cancelled (code 5) and the request's KV pages are released. On a
router, the cancel goes to the decode node the request was routed to, which
answers the client through the router. An ID of another node, or of an
earlier run of this one, is refused, as is one no longer in flight. Only an
operator's certificate is answered.

Exit codes: 0 cancelled, 1 the request is not in flight there (the error
names ID) or the node could not be reached or did not answer within
--timeout, 2 usage error.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one request ID (node requests lists them), not %d arguments",
					cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseInFlightID(args[0])
			if err != nil {
				return usageError{err}
			}
			c, err := dialOperator(cmd, &o.creds, o.Endpoint, o.Timeout)
			if err != nil {
				return fmt.Errorf("cancel: %w", err)
			}
			defer c.close()
			r, err := c.cancel(o.Endpoint, id, o.Timeout)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancelled %s on %s: tenant %s, client id %d, %s, on decode node %s; its client is answered cancelled\n",
				args[0], o.Endpoint, r.Tenant, r.ClientID, r.Phase, r.Decode)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the node that lists the request (where node run listens)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the node's answer")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	return cmd
}

// dialOperator checks timeout, loads the operator's credentials the flags
// name and dials a control client for endpoint.
func dialOperator(cmd *cobra.Command, creds *credFlags, endpoint string, timeout time.Duration) (*controlClient, error) {
	if timeout <= 0 {
		return nil, usageError{fmt.Errorf("--timeout (%s) must be positive", timeout)}
	}
	if err := checkEndpoint(endpoint); err != nil {
		return nil, usageError{err}
	}
	// Where nothing runs, that is the news, not the credentials that a
	// cluster that is not there would need.
	if err := reachAny([]string{endpoint}); err != nil {
		return nil, err
	}
	creds.Endpoint = endpoint
	auth, err := creds.operator(cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	return dialControlFor(endpoint, auth)
}

// inFlightID names a request in flight as a node lists it.
type inFlightID struct{ incarnation, number uint64 }

func (id inFlightID) String() string { return fmt.Sprintf("%016x-%d", id.incarnation, id.number) }

// parseInFlightID reads an ID as node requests prints it.
func parseInFlightID(s string) (inFlightID, error) {
	inc, n, ok := strings.Cut(s, "-")
	id := inFlightID{}
	var err error
	if ok {
		if id.incarnation, err = strconv.ParseUint(inc, 16, 64); err == nil {
			id.number, err = strconv.ParseUint(n, 10, 64)
		}
	}
	if !ok || err != nil || id.incarnation == 0 || id.number == 0 {
		return inFlightID{}, fmt.Errorf("request ID %q: want INCARNATION-NUMBER as node requests prints it (such as 3c9e5a2b8f1d0e47-12)", s)
	}
	return id, nil
}

// inFlight asks the node on endpoint for at most limit of its requests in
// flight.
func (c *controlClient) inFlight(endpoint string, limit int, timeout time.Duration) (*messages.InFlightList, error) {
	rep, err := messages.Request(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName), &messages.ListInFlight{Limit: uint32(limit)}, timeout)
	if err != nil {
		return nil, fmt.Errorf("requests in flight on %s: %w", endpoint, err)
	}
	l, ok := rep.(*messages.InFlightList)
	if !ok {
		return nil, fmt.Errorf("requests in flight on %s: the answer is a %T, not an InFlightList", endpoint, rep)
	}
	return l, nil
}

// cancel asks the node on endpoint to cancel its request id, and returns
// the request as it was when the cancel reached it.
func (c *controlClient) cancel(endpoint string, id inFlightID, timeout time.Duration) (*messages.InFlight, error) {
	m := &messages.CancelInFlight{Incarnation: id.incarnation, Number: id.number}
	rep, err := messages.Request(c.sys.Root, actor.NewPID(endpoint, cluster.ControlName), m, timeout)
	if err != nil {
		return nil, fmt.Errorf("cancel %s on %s: %w", id, endpoint, err)
	}
	r, ok := rep.(*messages.CancelInFlightReply)
	switch {
	case !ok:
		return nil, fmt.Errorf("cancel %s on %s: the answer is a %T, not a CancelInFlightReply", id, endpoint, rep)
	case r.Err != nil:
		return nil, fmt.Errorf("cancel %s on %s: %w", id, endpoint, r.Err)
	}
	return r.Request, nil
}

// printInFlight writes l, the answer of the node on endpoint, for a person
// to read.
func printInFlight(w io.Writer, endpoint string, l *messages.InFlightList) {
	total := len(l.Requests) + int(l.Omitted)
	fmt.Fprintf(w, "%d requests in flight on %s (incarnation %016x)\n", total, endpoint, l.Incarnation)
	if len(l.Requests) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tCLIENT ID\tPHASE\tDECODE\tPREFILL\tAGE\tTOKENS")
	for _, r := range l.Requests {
		prefill := r.Prefill
		if prefill == "" {
			prefill = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\n", inFlightID{l.Incarnation, r.Number}, r.Tenant, r.ClientID, r.Phase,
			r.Decode, prefill, age(r.AgeMs), r.Tokens)
	}
	tw.Flush()
	if l.Omitted > 0 {
		fmt.Fprintf(w, "%d more in flight, not listed: the list holds the oldest %d\n", l.Omitted, len(l.Requests))
	}
}

// age is an age in milliseconds as a person reads it: to the millisecond
// below a second, to the tenth of a second above.
func age(ms uint64) string {
	d := time.Duration(min(ms, uint64(1<<62)/uint64(time.Millisecond))) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}
