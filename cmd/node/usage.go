package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// usageError marks an error as the caller's: bad flags, arguments or
// configuration. run maps it to exitUsage; every other error is exitFailed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }
func (e usageError) exitCode() int { return exitUsage }

// noArgs refuses positional arguments as a usage error. Cobra's own
// cobra.NoArgs returns a plain error, which would exit 1 instead of 2.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unknown command or argument %q for %q; see %q",
			args[0], cmd.CommandPath(), cmd.CommandPath()+" --help")}
	}
	return nil
}
