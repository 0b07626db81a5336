package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// statusOptions are the flags of "node status".
type statusOptions struct {
	Endpoint string
	Timeout  time.Duration
	JSON     bool
	creds    credFlags
}

func newStatusCmd() *cobra.Command {
	o := statusOptions{Endpoint: defaultEndpoint, Timeout: 10 * time.Second}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print a node's status and the cluster's members as it sees them",
		Long: `status asks the node at --endpoint (where its node run listens) for its status
and prints it: one line for the node (name, role, incarnation, request
counts), one line per KV pool it holds (capacity and free pages), then a table
of the members it sees alive, with each member's pages as it last published
them and whether it is draining. A member that left or failed is no longer
listed. --json prints the same as one JSON object instead.

A chaos build of the node (go build -tags chaos ./cmd/node) says so, with the
faults it injects (node run --faults) and how many of each kind so far, and
each pool's line counts the rows its reads returned that another tenant or
another request wrote: 0 unless the node is broken.

Exit codes: 0 printed, 1 the node could not be reached or did not answer
within --timeout, 2 usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Timeout <= 0 {
				return usageError{fmt.Errorf("--timeout (%s) must be positive", o.Timeout)}
			}
			o.creds.Endpoint = o.Endpoint
			auth, err := o.creds.operator(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			c, err := dialControlFor(o.Endpoint, auth)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			defer c.close()
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
	fmt.Fprintf(w, "  requests: %d in flight, %d admitted, %d completed, %d failed, %d rejected too long, %d rejected busy\n",
		n.InFlight, n.Admitted, n.Completed, n.Failed, n.RejectedTooLong, n.RejectedBusy)
	var failed []string
	for c, v := range n.FailedByCode {
		if v > 0 {
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
