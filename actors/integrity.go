package actors

import (
	"fmt"

	"github.com/kvwarden/kvwarden/messages"
)

// StrangerError: frames or a transfer report for the current transfer
// attempt came from someone other than the prefill node, and incarnation,
// the transfer was planned with. Whoever sent them knows the attempt's
// request id; the request fails rather than use anything of the transfer.
type StrangerError struct {
	What    string // "frames", "transfer done"
	From    string // who sent it, as authenticated
	Planned string // the prefill peer planned with
}

func (e *StrangerError) Error() string {
	return fmt.Sprintf("actors: %s from %s, the transfer was planned with %s", e.What, e.From, e.Planned)
}

func (e *StrangerError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeIntegrity, Message: e.Error()}
}
