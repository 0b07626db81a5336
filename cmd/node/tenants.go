package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/internal/atomicfile"
	"github.com/kvwarden/kvwarden/tenancy"
)

// tenantsOptions are the flags of "node tenants set".
type tenantsOptions struct {
	File, Tenant                                    string
	Default                                         bool
	Weight, ConcurrentMax, PagesMax, PoolPercentMax int
}

func newTenantsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenants",
		Short: "Manage the tenants' shares file: each tenant's weight, requests and KV pages in flight",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTenantsSetCmd())
	return cmd
}

func newTenantsSetCmd() *cobra.Command {
	var o tenantsOptions
	cmd := &cobra.Command{
		Use:   "set --file FILE (--tenant TENANT | --default) [--weight W] [--concurrent-max N] [--pages-max P] [--pool-percent-max PCT]",
		Short: "Set a tenant's share, or the default share, in a tenants' shares file",
		Long: `tenants set sets the share of --tenant (or, with --default, of every tenant the
file does not name) in the tenants' shares file --file, made if missing, mode
0600, replaced whole so that a node reading it sees the old file or the new.
Routers and nodes that clients send to (node run --tenants FILE) read the file
again on SIGHUP. Only the fields given change; a named tenant's field never
given is the default share's.

--weight is the tenant's part of a saturated decode worker's steps against the
other tenants with sequences there (1 to 1000); --concurrent-max the most
requests it has in flight at each router or node it sends to (1 to 65536; one
more is answered busy, 429 tenant_concurrency_limit over HTTP); --pages-max
the most KV pages its requests in flight hold there (0: bounded by
--concurrent-max and the pools only); --pool-percent-max the most of any one
KV pool its requests hold at once (1 to 100; the default share's 75 leaves
room for others however long its requests run), and while other tenants wait
for pages, it holds no more than its weight's part of a pool. A tenant is who its API key or
certificate names, never what a request says.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.File == "" || (o.Tenant == "") == !o.Default {
				return usageError{fmt.Errorf("--file (%q) is required, and one of --tenant (%q) and --default (%t)", o.File, o.Tenant, o.Default)}
			}
			// A value given is a value: zero, which the file reads as the
			// default's, is refused here but for --pages-max's "none".
			for _, f := range []struct {
				name     string
				v, least int
			}{{"weight", o.Weight, 1}, {"concurrent-max", o.ConcurrentMax, 1}, {"pool-percent-max", o.PoolPercentMax, 1},
				{"pages-max", o.PagesMax, 0}} {
				if cmd.Flags().Changed(f.name) && f.v < f.least {
					return usageError{fmt.Errorf("--%s %d, want at least %d", f.name, f.v, f.least)}
				}
			}
			return setShare(o.File, o.Tenant, func(s *tenancy.Share) {
				fs := cmd.Flags()
				if fs.Changed("weight") {
					s.Weight = o.Weight
				}
				if fs.Changed("concurrent-max") {
					s.ConcurrentMax = o.ConcurrentMax
				}
				if fs.Changed("pages-max") {
					s.PagesMax = o.PagesMax
				}
				if fs.Changed("pool-percent-max") {
					s.PoolPercentMax = o.PoolPercentMax
				}
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.File, "file", "", "tenants' shares file to change")
	fs.StringVar(&o.Tenant, "tenant", "", "the tenant whose share to set")
	fs.BoolVar(&o.Default, "default", false, "set the default share, of every tenant the file does not name")
	fs.IntVar(&o.Weight, "weight", 0, fmt.Sprintf("the tenant's weight, 1 to %d", tenancy.WeightMax))
	fs.IntVar(&o.ConcurrentMax, "concurrent-max", 0, fmt.Sprintf("the tenant's most requests in flight, 1 to %d", tenancy.ConcurrentMax))
	fs.IntVar(&o.PoolPercentMax, "pool-percent-max", 0, "the most of any one KV pool the tenant's requests hold at once, in percent, 1 to 100")
	fs.IntVar(&o.PagesMax, "pages-max", 0, fmt.Sprintf("the most KV pages the tenant's requests in flight hold, 0 (no bound of its own) or 1 to %d", tenancy.PagesMax))
	return cmd
}

// setShare changes, by edit, tenant's share in the policy file at path
// (the default share when tenant is empty), making the file if there is
// none. The new file is checked as a node reads it before it replaces the
// old; on any error the file is as it was.
func setShare(path, tenant string, edit func(*tenancy.Share)) error {
	p, err := tenancy.Load(path)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		p = tenancy.DefaultPolicy()
	default:
		return err
	}
	if tenant == "" {
		edit(&p.Default)
	} else {
		if p.Tenants == nil {
			p.Tenants = map[string]tenancy.Share{}
		}
		s := p.Tenants[tenant]
		edit(&s)
		p.Tenants[tenant] = s
	}
	out, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	if _, err := tenancy.Parse(path, out); err != nil {
		return usageError{err}
	}
	return atomicfile.Write(path, out, 0o600)
}
