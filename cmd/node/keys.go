package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/httpapi"
)

// keysOptions are the flags of "node keys new".
type keysOptions struct {
	File, Name, Tenant string
	Models             []string
}

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage the API keys of the OpenAI-compatible HTTP API",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newKeysNewCmd())
	return cmd
}

func newKeysNewCmd() *cobra.Command {
	var o keysOptions
	cmd := &cobra.Command{
		Use:   "new --file FILE --tenant TENANT [--name NAME] [--model M]",
		Short: "Make an API key, add its hash to a keys file and print the key",
		Long: `keys new makes a random API key for --tenant, adds its SHA-256 (never the key)
to the keys file --file (made if missing, mode 0600, replaced whole so that a
node reading it sees the old file or the new), and prints the key on stdout:
it is shown this once. A node serving the API (node run --api-keys FILE)
reads the file again on SIGHUP.

--model, repeatable, restricts the key to those models (by name or
fingerprint); a request for another is answered 403. The tenant's share
(weight, requests and KV pages in flight) is the tenants' shares file's
("node tenants set"), whatever key or certificate its requests come by.

A key made elsewhere can be added by hand: the file stores
printf %s "$KEY" | sha256sum.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.File == "" || o.Tenant == "" {
				return usageError{fmt.Errorf("--file (%q) and --tenant (%q) are required", o.File, o.Tenant)}
			}
			key, err := httpapi.NewKey()
			if err != nil {
				return err
			}
			e := httpapi.KeyEntry{Name: o.Name, Tenant: o.Tenant, SHA256: httpapi.HashKey(key), Models: o.Models}
			if err := httpapi.AddKey(o.File, e); err != nil {
				return usageError{err}
			}
			fmt.Fprintln(cmd.OutOrStdout(), key)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.File, "file", "", "keys file to add the key to")
	fs.StringVar(&o.Tenant, "tenant", "", "tenant the key's requests run as")
	fs.StringVar(&o.Name, "name", "", "the key's name in logs and errors, unique in the file (default: the tenant for its first key, then TENANT-2, TENANT-3, …)")
	fs.StringArrayVar(&o.Models, "model", nil, "a model the key may use, by name or fingerprint (repeatable; default: any)")
	return cmd
}
