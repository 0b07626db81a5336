package main

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/trust"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make a cluster CA and issue node, operator and tenant certificates",
		Long: `certs makes the credentials a secure cluster needs, into one directory:

  node certs init  --dir DIR --cluster NAME
      a CA (ca.crt, ca.key) and a gossip keyring (gossip.keys).
  node certs issue --dir DIR --role ROLE --name NAME [--host H,...]
      a certificate and key (ROLE-NAME.crt, ROLE-NAME.key) signed by DIR's CA,
      for a node (role prefill, decode, router or all), an operator (role
      operator: status, drain) or a tenant's client (role tenant, NAME the
      tenant: its requests run as that tenant and no other).

Keys are written 0600 and the directory 0700. Give each process the
directory (--certs, or $KVWARDEN_CERTS) and its certificate's base name
(--cert ROLE-NAME); nodes other than clients also need gossip.keys and
ca.crt, never ca.key.

Gossip key rotation: add a new key as the second line of gossip.keys on
every node and restart them one by one; then move it to the first line
everywhere (restart again); then remove the old line.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var dir, clusterName string
	validFor := trust.DefaultCAValidFor
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Make a cluster CA and gossip keyring in --dir",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || clusterName == "" {
				return usageError{fmt.Errorf("--dir and --cluster are required")}
			}
			ca, err := trust.NewCA(clusterName, validFor, time.Now())
			if err != nil {
				return usageError{err}
			}
			if err := ca.WriteCA(dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA of cluster %s, valid until %s: %s\ngossip keyring: %s\n", clusterName,
				ca.Cert.NotAfter.Format(time.RFC3339), filepath.Join(dir, trust.CACertFile), filepath.Join(dir, trust.GossipFile))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", dir, "directory to write into (made 0700)")
	fs.StringVar(&clusterName, "cluster", clusterName, "the cluster's name, in every identity it issues")
	fs.DurationVar(&validFor, "valid-for", validFor, "how long the CA is valid")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	var dir, role, name string
	var hosts []string
	validFor := trust.DefaultCertValidFor
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue a certificate from --dir's CA",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || role == "" || name == "" {
				return usageError{fmt.Errorf("--dir, --role and --name are required")}
			}
			r, err := trust.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			ca, err := trust.LoadCA(dir)
			if err != nil {
				return err
			}
			return issue(cmd.OutOrStdout(), dir, ca, trust.Identity{Cluster: ca.Cluster, Role: r, Name: name}, hosts, validFor)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", dir, "directory of the CA; the certificate is written there")
	fs.StringVar(&role, "role", role, "prefill, decode, router, all, operator or tenant")
	fs.StringVar(&name, "name", name, "the node's, operator's or tenant's name (letters, digits, . _ -)")
	fs.StringSliceVar(&hosts, "host", hosts, "IP addresses or DNS names to put in the certificate, for other tools")
	fs.DurationVar(&validFor, "valid-for", validFor, "how long the certificate is valid")
	return cmd
}

// issue writes one certificate and says how to use it.
func issue(w io.Writer, dir string, ca *trust.CA, id trust.Identity, hosts []string, validFor time.Duration) error {
	is, err := ca.Issue(id, hosts, validFor, time.Now())
	if err != nil {
		return usageError{err}
	}
	if err := is.Write(dir); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: %s.crt, %s.key (use --certs %s --cert %s)\n", id, filepath.Join(dir, trust.FileName(id)),
		filepath.Join(dir, trust.FileName(id)), dir, trust.FileName(id))
	return nil
}
