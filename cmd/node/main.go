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
	exitOK          = 0   // the command did what was asked
	exitFailed      = 1   // it ran and failed: preflight refused the node, discovery failed
	exitUsage       = 2   // bad flags, arguments or configuration
	exitViolations  = 3   // node chaos found a violation: a wrong answer, a cross-tenant byte, a leaked page…
	exitInvariant   = 70  // an actor broke an invariant (EX_SOFTWARE)
	exitInterrupted = 130 // Ctrl-C (128 + SIGINT), as a shell reports it
)

// exitCoder is an error that decides its own exit code; any other error
// exits exitFailed.
type exitCoder interface{ exitCode() int }

// subcommands builds each subcommand; every one lives in its own file.
var subcommands = []func() *cobra.Command{newPreflightCmd, newRunCmd, newGenerateCmd, newUpCmd, newStatusCmd,
	newDownCmd, newDrainCmd, newMigrateCmd, newRequestsCmd, newCancelCmd, newCertsCmd, newChaosCmd, newKeysCmd, newTenantsCmd, newBenchCmd, newPlanCmd}

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
	var coded exitCoder
	if errors.As(err, &coded) {
		return coded.exitCode()
	}
	return exitFailed
}
