package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// statusOptions are the flags of "node status".
type statusOptions struct {
	Endpoint string
	Timeout  time.Duration
	JSON     bool
	Watch    bool
	Interval time.Duration
	creds    credFlags
}

func newStatusCmd() *cobra.Command {
	o := statusOptions{Endpoint: defaultEndpoint, Timeout: 10 * time.Second, Interval: time.Second}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print a node's status and the cluster's members as it sees them",
		Long: `status asks the node at --endpoint (where its node run listens) for its status
and prints it: one line for the node (name, role, incarnation, request
counts: completed, cancelled, failed, rejected too long or busy, and the
failures by code), one line per KV pool it holds (capacity and free pages),
then a table of the members it sees alive, with each member's pages as it
last published them and whether it is draining. A member that left or failed
is no longer listed. --json prints the same as one JSON object instead.

--watch asks again every --interval and draws a compact table each time:
the node's requests, tokens and errors by code (each with what it moved
since the table before; tokens also per second), its pools' used and free
pages and the members it sees. On a terminal each table replaces the last;
otherwise the tables follow each other. Ctrl-C (or SIGTERM) stops it, and it
exits 0. A failed look is shown as such and the next one is made as usual.

A chaos build of the node (go build -tags chaos ./cmd/node) says so, with the
faults it injects (node run --faults) and how many of each kind so far, and
each pool's line counts the rows its reads returned that another tenant or
another request wrote: 0 unless the node is broken.

Exit codes: 0 printed (with --watch: stopped), 1 the node could not be
reached or did not answer within --timeout, 2 usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case o.Watch && o.Interval <= 0:
				return usageError{fmt.Errorf("--interval (%s) must be positive", o.Interval)}
			case o.Watch && o.JSON:
				return usageError{fmt.Errorf("--watch draws tables; --json prints one status: give one of them")}
			}
			c, err := dialOperator(cmd, &o.creds, o.Endpoint, o.Timeout)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			defer c.close()
			if o.Watch {
				watchUntilStopped(cmd.OutOrStdout(), c, o)
				return nil
			}
			s, err := c.status(o.Endpoint, o.Timeout)
			if err != nil {
				return err
			}
			if o.JSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(s)
			}
			printStatus(cmd.OutOrStdout(), s)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the node (where node run listens)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the node's answer")
	fs.BoolVar(&o.JSON, "json", o.JSON, "print the status as JSON")
	fs.BoolVar(&o.Watch, "watch", o.Watch, "ask again every --interval and redraw a compact table, until Ctrl-C")
	fs.DurationVar(&o.Interval, "interval", o.Interval, "with --watch, how often to ask")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	return cmd
}

// printStatus writes s for a person to read.
func printStatus(w io.Writer, s *messages.StatusReply) {
	n := s.Node
	draining := ""
	if n.Draining {
		draining = ", draining"
	}
	fmt.Fprintf(w, "node %s: role %s, incarnation %016x, address %s%s\n", n.Name, n.Role, n.Incarnation, n.Address, draining)
	if n.DataPlane != "" {
		fmt.Fprintf(w, "  data plane %s\n", n.DataPlane)
	}
	if n.Model != "" {
		fmt.Fprintf(w, "  model %s, fingerprint %s\n", n.Model, n.ModelFingerprint)
	}
	f := figuresOf(&n)
	fmt.Fprintf(w, "  requests: %d in flight, %d admitted, %d completed, %d cancelled, %d failed, %d rejected too long, %d rejected busy, %d rejected unavailable\n",
		n.InFlight, n.Admitted, n.Completed, f.cancelled, f.failed, n.RejectedTooLong, n.RejectedBusy, rejectedUnavailable(&n))
	if n.MovedOut+n.MovedIn+n.StreamsMoved > 0 {
		fmt.Fprintf(w, "  moved between decode nodes: %d requests out, %d in; %d streams followed\n", n.MovedOut, n.MovedIn, n.StreamsMoved)
	}
	if ts := n.Tenants; ts != nil {
		pages := "no pages_max"
		if ts.DefaultPagesMax > 0 {
			pages = fmt.Sprintf("pages_max %d", ts.DefaultPagesMax)
		}
		fmt.Fprintf(w, "  tenants: %d with requests here; %d named in the shares, the rest weight %d, concurrent_max %d, %s, pool_percent_max %d; refused %d at a tenant's concurrent_max, %d at its pages_max\n",
			ts.Active, ts.Named, ts.DefaultWeight, ts.DefaultConcurrentMax, pages, ts.DefaultPoolPercentMax,
			at(n.RejectedBy, actors.RejectTenantConcurrent), at(n.RejectedBy, actors.RejectTenantPages))
	}
	if ft := n.FirstToken; ft != nil && ft.Requests > 0 {
		m := meanPhases(ft, nil)
		fmt.Fprintf(w, "  first token, mean of %d requests: queue %s, prefill %s, transfer %s, verify %s; first decode step %s (of %d)\n",
			ft.Requests, msText(m[0]*1000), msText(m[1]*1000), msText(m[2]*1000), msText(m[3]*1000), msText(m[4]*1000), ft.Decoded)
	}
	var failed []string
	for c, v := range n.FailedByCode {
		if v > 0 && messages.ErrorCode(c) != messages.CodeCancelled {
			failed = append(failed, fmt.Sprintf("%s %d", messages.ErrorCode(c), v))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "  failed by code: %s\n", strings.Join(failed, ", "))
	}
	if n.Chaos {
		spec := "none"
		if n.Faults != "" {
			spec = n.Faults
		}
		fmt.Fprintf(w, "  CHAOS BUILD: faults %s; injected:%s\n", spec, counted(n.FaultCounts, faults.KindNames()))
	}
	for _, p := range n.Pools {
		cross := ""
		if n.Chaos {
			cross = fmt.Sprintf(", %d rows read that another tenant wrote, %d that another request did", p.CrossTenantRows, p.CrossRequestRows)
		}
		fmt.Fprintf(w, "  pool %s: %d of %d pages free%s\n", p.Name, p.Free, p.Capacity, cross)
		if p.CachePagesMax > 0 {
			fmt.Fprintf(w, "    prefix cache: %d of at most %d pages; %d lookups, %d of %d prompt tokens read from it (%s); %d pages kept, %d evicted, %d found gone\n",
				p.CachePages, p.CachePagesMax, p.CacheQueries, p.CacheHitTokens, p.CacheQueryTokens,
				percent(p.CacheHitTokens, p.CacheQueryTokens), p.CachePublished, p.CacheEvicted, p.CacheGone)
		}
	}
	if n.Insecure {
		fmt.Fprintf(w, "  INSECURE: the node authenticates nobody\n")
	} else {
		fmt.Fprintf(w, "  identity %s\n", n.Identity)
	}
	fmt.Fprintf(w, "  refused:%s\n", counted(n.Refused, trust.RefusalNames()))
	fmt.Fprintf(w, "\n%d members:\n", len(s.Members))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tINCARNATION\tADDRESS\tDATA PLANE\tSTATE\tCAPACITY\tFREE\tDRAINING\tVERIFIED\tMODEL")
	for _, m := range s.Members {
		dp := m.DataPlane
		if dp == "" {
			dp = "-"
		}
		model := "-"
		if len(m.Model) >= 12 {
			model = m.Model[:12] // as engine.Fingerprint.Short writes it
		}
		fmt.Fprintf(tw, "%s\t%s\t%016x\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", m.Name, m.Role, m.Incarnation, m.Address, dp, m.State,
			m.CapacityPages, m.FreePages, yesNo(m.Draining), yesNo(m.Verified), model)
	}
	tw.Flush()
	for _, m := range s.Members {
		if !m.Verified {
			fmt.Fprintf(w, "%s unverified: %s\n", m.Name, cmp.Or(m.Unverified, "no reason given (a node of an older build)"))
		}
	}
}

// counted names each of counts by its kind in names (a node of a newer
// build may count kinds this one does not name).
func counted(counts []uint64, names []string) string {
	out := ""
	for i, n := range counts {
		name := fmt.Sprintf("kind%d", i)
		if i < len(names) {
			name = names[i]
		}
		out += fmt.Sprintf(" %s %d", name, n)
	}
	if out == "" {
		return " none counted"
	}
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// figures are the counts of a node's status that a watch compares between
// two looks. Cancelled requests (code cancelled, which a request timeout
// also answers) are counted apart from the other failures.
type figures struct{ completed, cancelled, failed, rejected, tokens uint64 }

func figuresOf(n *messages.NodeStatus) figures {
	cancelled := countOf(n.FailedByCode, messages.CodeCancelled)
	return figures{completed: n.Completed, cancelled: cancelled, failed: n.Failed - min(cancelled, n.Failed),
		rejected: n.RejectedTooLong + n.RejectedBusy + rejectedUnavailable(n), tokens: n.TokensOut}
}

// at is counts[b], 0 past its end (a node of an older build).
func at(counts []uint64, b actors.RejectBound) uint64 {
	if int(b) < len(counts) {
		return counts[b]
	}
	return 0
}

// rejectedUnavailable is how many requests n refused because no node of a
// role they need was in sight (code unavailable): those it counts by that
// bound.
func rejectedUnavailable(n *messages.NodeStatus) uint64 { return at(n.RejectedBy, actors.RejectNoPeer) }

// countOf is counts' entry for code, 0 past its end.
func countOf(counts []uint64, code messages.ErrorCode) uint64 {
	if int(code) < len(counts) {
		return counts[code]
	}
	return 0
}

// watchUntilStopped draws the status of o.Endpoint every o.Interval until
// SIGINT or SIGTERM, redrawing in place on a terminal.
func watchUntilStopped(w io.Writer, c *controlClient, o statusOptions) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	ask := func() (*messages.StatusReply, error) { return c.status(o.Endpoint, o.Timeout) }
	watchStatus(ctx, w, ask, tick.C, watchHead{endpoint: o.Endpoint, interval: o.Interval, clear: isTerminal(w)})
}

// clearScreen moves a terminal's cursor home and clears the screen.
const clearScreen = "\x1b[H\x1b[2J"

// watchHead is what every table of a watch starts with, and how it is
// drawn.
type watchHead struct {
	endpoint string
	interval time.Duration
	clear    bool // redraw in place (a terminal)
}

// reading is one answer to a status request, and when it came.
type reading struct {
	s   *messages.StatusReply
	err error
	at  time.Time
}

// watchStatus draws a table of ask's answer at once and after each tick,
// until ctx ends. Each table is written in one Write, so that a reader of
// w sees whole tables; a look that fails is drawn as its error.
func watchStatus(ctx context.Context, w io.Writer, ask func() (*messages.StatusReply, error), ticks <-chan time.Time, h watchHead) {
	var prev *reading
	for {
		got := make(chan reading, 1)
		go func() {
			s, err := ask()
			got <- reading{s: s, err: err, at: time.Now()}
		}()
		var r reading
		select {
		case <-ctx.Done():
			return
		case r = <-got:
		}
		var b bytes.Buffer
		if h.clear {
			b.WriteString(clearScreen)
		}
		drawWatch(&b, h, r, prev)
		if _, err := w.Write(b.Bytes()); err != nil {
			return // nobody reads what is drawn any more
		}
		if r.err == nil {
			prev = &r
		}
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
	}
}

// drawWatch writes one table of r, with what moved since prev (nil: the
// first look, or none succeeded yet).
func drawWatch(w io.Writer, h watchHead, r reading, prev *reading) {
	fmt.Fprintf(w, "status of %s at %s, every %s (Ctrl-C stops)\n", h.endpoint, r.at.Format("15:04:05"), h.interval)
	if r.err != nil {
		fmt.Fprintf(w, "no answer: %v\n\n", r.err)
		return
	}
	n := r.s.Node
	var was *messages.NodeStatus
	restarted := ""
	switch {
	case prev == nil:
	case prev.s.Node.Incarnation != n.Incarnation:
		restarted = fmt.Sprintf(" (restarted: was incarnation %016x)", prev.s.Node.Incarnation)
	default:
		was = &prev.s.Node
	}
	draining := ""
	if n.Draining {
		draining = ", draining"
	}
	fmt.Fprintf(w, "node %s, role %s, incarnation %016x%s%s\n", n.Name, n.Role, n.Incarnation, restarted, draining)
	now, then := figuresOf(&n), figures{}
	if was != nil {
		then = figuresOf(was)
	}
	moved := func(now, then uint64) string {
		if was == nil {
			return fmt.Sprint(now)
		}
		return fmt.Sprintf("%d (%+d)", now, int64(now-then))
	}
	fmt.Fprintf(w, "requests  in flight %d  completed %s  cancelled %s  failed %s  rejected %s\n", n.InFlight,
		moved(now.completed, then.completed), moved(now.cancelled, then.cancelled), moved(now.failed, then.failed),
		moved(now.rejected, then.rejected))
	fmt.Fprintf(w, "tokens    %d", now.tokens)
	if was != nil {
		d := int64(now.tokens - then.tokens)
		fmt.Fprintf(w, " (%+d, %.1f/s)", d, float64(d)/max(r.at.Sub(prev.at).Seconds(), 1e-3))
	}
	fmt.Fprintf(w, "\nerrors    %s\n", errorsByCode(n, was))
	drawPages(w, r.s)
}

// drawPages writes a watch's tables of the node's pools and of the members
// it sees.
func drawPages(w io.Writer, s *messages.StatusReply) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tUSED\tCACHED\tFREE\tCAPACITY\tCACHE HITS")
	for _, p := range s.Node.Pools {
		hits := "-"
		if p.CachePagesMax > 0 {
			hits = percent(p.CacheHitTokens, p.CacheQueryTokens)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", p.Name, p.Capacity-p.Free-p.CachePages, p.CachePages, p.Free, p.Capacity, hits)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tROLE\tSTATE\tFREE/CAPACITY\tDRAINING")
	for _, m := range s.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", m.Name, m.Role, m.State, m.FreePages, m.CapacityPages, yesNo(m.Draining))
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// errorsByCode is what the node's clients were told, by code, with what
// moved since was (nil: nothing to compare with).
func errorsByCode(n messages.NodeStatus, was *messages.NodeStatus) string {
	now := told(&n)
	var then []uint64
	if was != nil {
		then = told(was)
	}
	var out []string
	for code, v := range now {
		switch {
		case v == 0:
		case was == nil:
			out = append(out, fmt.Sprintf("%s %d", messages.ErrorCode(code), v))
		default:
			out = append(out, fmt.Sprintf("%s %d (%+d)", messages.ErrorCode(code), v, int64(v-countOf(then, messages.ErrorCode(code)))))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// told counts the errors a node's clients were told, by code: the
// failures by code and the refusals before a request ran (too long, busy,
// unavailable).
func told(s *messages.NodeStatus) []uint64 {
	refused := make([]uint64, messages.CodeUnavailable+1)
	refused[messages.CodePromptTooLong], refused[messages.CodeBusy] = s.RejectedTooLong, s.RejectedBusy
	refused[messages.CodeUnavailable] = rejectedUnavailable(s)
	return messages.SumCounts(s.FailedByCode, refused)
}

// percent is part of whole as a percentage, "-" when whole is 0.
func percent(part, whole uint64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}

// meanPhases is the mean, in seconds, of each phase of the first tokens
// counted in to and not in from (nil: none): queue, prefill, transfer,
// verify and the first decode step (over the requests that had one); zero
// for a phase no request is between (or from is of an earlier run of the
// node).
func meanPhases(to, from *messages.FirstTokenStatus) [5]float64 {
	var m [5]float64
	if from == nil {
		from = &messages.FirstTokenStatus{}
	}
	for i, ph := range [...]struct{ sum, was, n, had uint64 }{
		{to.QueueNs, from.QueueNs, to.Requests, from.Requests}, {to.PrefillNs, from.PrefillNs, to.Requests, from.Requests},
		{to.TransferNs, from.TransferNs, to.Requests, from.Requests}, {to.VerifyNs, from.VerifyNs, to.Requests, from.Requests},
		{to.FirstDecodeNs, from.FirstDecodeNs, to.Decoded, from.Decoded},
	} {
		if ph.n > ph.had && ph.sum >= ph.was {
			m[i] = float64(ph.sum-ph.was) / float64(ph.n-ph.had) / 1e9
		}
	}
	return m
}
