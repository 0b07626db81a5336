package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes of every subcommand.
const (
	exitOK     = 0 // the command did what was asked
	exitFailed = 1 // it ran and failed: preflight refused the node, discovery failed
	exitUsage  = 2 // bad flags, arguments or configuration
)

// subcommands builds each subcommand; every one lives in its own file.
var subcommands = []func() *cobra.Command{newPreflightCmd}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is main without the process: flags → config → validate → run happen
// inside each subcommand's RunE, and the error decides the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{Use: "node", Short: "Run and check kvwarden nodes",
		SilenceUsage: true, SilenceErrors: true, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	for _, newCmd := range subcommands {
		root.AddCommand(newCmd())
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "node:", err)
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitFailed
}
