package actors

import (
	"fmt"

	"github.com/kvwarden/kvwarden/messages"
)

// StrangerError: frames or a transfer report for the current transfer
// attempt came from someone other than the prefill node, and incarnation,
// the transfer was planned with. They are refused (a data-plane sender's
// connection is closed) and counted; the request waits on for its planned
// peer, since a stranger must not be able to end it. Frames of the planned
// identity from pages of another incarnation do end it.
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

// FirstTokenError: the first token prefill sent is not the one decode
// recomputes from the KV it received and the prompt's last token (Err says
// why the recomputation failed, if it did: the KV's last row is not the
// one that token gives).
type FirstTokenError struct {
	Prefill, Decode int
	Err             error
}

func (e *FirstTokenError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("actors: first token %d from prefill not confirmed by the KV received: %v", e.Prefill, e.Err)
	}
	return fmt.Sprintf("actors: first token %d from prefill, the KV received gives %d", e.Prefill, e.Decode)
}

func (e *FirstTokenError) Unwrap() error { return e.Err }

func (e *FirstTokenError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeIntegrity, Message: e.Error()}
}
