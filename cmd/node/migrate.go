package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// migrateOptions are the flags of "node migrate".
type migrateOptions struct {
	Endpoint string
	Request  string
	Timeout  time.Duration
	creds    credFlags
}

func newMigrateCmd() *cobra.Command {
	o := migrateOptions{Endpoint: defaultEndpoint, Timeout: time.Minute}
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move a decode node's running requests to other decode nodes, KV and all",
		Long: `migrate asks the decode node at --endpoint to move its requests in flight, or
only --request ID (as node requests lists it there: INCARNATION-NUMBER), to
other decode nodes: each pauses, its KV moves page by page with the checks a
prefill transfer has (tags, seals, the last token recomputed where it lands),
and the other node streams the rest through the same router, so that the
client sees one uninterrupted answer. Each goes to the alive decode node of
the same model with the most free pages that takes it. A request that cannot
move stays and goes on where it is: one whose client sent it to the node
directly (not through a router), one with a token or two left, or one no other
node has room for. It prints how many moved and how many stayed.

Exit codes: 0 every request asked for moved (or there was none), 1 some
stayed (the last reason is printed), the request is not in flight there, or
the node could not be reached or did not answer within --timeout, 2 usage
error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var id inFlightID
			if o.Request != "" {
				var err error
				if id, err = parseInFlightID(o.Request); err != nil {
					return usageError{err}
				}
			}
			c, err := dialOperator(cmd, &o.creds, o.Endpoint, o.Timeout)
			if err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			defer c.close()
			rep, err := c.migrate(o.Endpoint, id, o.Timeout)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d requests moved, %d stayed\n", o.Endpoint, rep.Moved, rep.Stayed)
			if rep.Stayed > 0 {
				return fmt.Errorf("migrate: %d requests stayed on %s: %v", rep.Stayed, o.Endpoint, rep.Err)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the decode node whose requests move (where node run listens)")
	fs.StringVar(&o.Request, "request", o.Request, "move only this request (INCARNATION-NUMBER, as node requests lists it)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the node's answer, every move done")
	o.creds.bind(fs, "the only operator-*.crt in --certs")
	return cmd
}
