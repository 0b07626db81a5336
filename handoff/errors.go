package handoff

import (
	"errors"
	"fmt"

	"github.com/kvwarden/kvwarden/messages"
)

// PromptTooLongError: admission refused a prompt before anything existed
// for it. Tokens is what the request needs (prompt, or prompt plus the
// tokens it asks for); Limit is the bound named by Where.
type PromptTooLongError struct {
	Tokens, Limit int
	Where         string
	// AtLeast says Tokens is a lower bound: the prompt was refused by its
	// length in bytes, unencoded (engine.EncodeWithin).
	AtLeast bool
}

func (e *PromptTooLongError) Error() string {
	least := ""
	if e.AtLeast {
		least = "at least "
	}
	return fmt.Sprintf("handoff: prompt too long: needs %s%d tokens, %s holds %d", least, e.Tokens, e.Where, e.Limit)
}

// Wire is what a client is told of e.
func (e *PromptTooLongError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodePromptTooLong, Message: e.Error(),
		Have: uint64(e.Tokens), Limit: uint64(e.Limit), Where: e.Where}
}

// BusyError: a bounded queue was full, or pages did not come free in time.
type BusyError struct {
	Where       string
	Have, Limit int
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("handoff: busy: %s is full (%d of %d)", e.Where, e.Have, e.Limit)
}

// Wire is what a client is told of e.
func (e *BusyError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBusy, Message: e.Error(),
		Have: uint64(e.Have), Limit: uint64(e.Limit), Where: e.Where}
}

// BadRequestError: the request itself is invalid.
type BadRequestError struct{ Reason string }

func (e *BadRequestError) Error() string { return "handoff: bad request: " + e.Reason }

// Wire is what a client is told of e.
func (e *BadRequestError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBadRequest, Message: e.Error()}
}

// StrangerError: frames or a transfer report for the current transfer
// attempt came from someone other than the prefill node, and incarnation,
// the transfer was planned with. They are refused and counted; the request
// waits on for its planned peer, since a stranger must not be able to end
// it. Frames of the planned identity from pages of another incarnation do
// end it.
type StrangerError struct {
	What    string // "frames", "transfer done"
	From    string // who sent it, as authenticated
	Planned string // the prefill peer planned with
}

func (e *StrangerError) Error() string {
	return fmt.Sprintf("handoff: %s from %s, the transfer was planned with %s", e.What, e.From, e.Planned)
}

// Wire is what a client is told of e.
func (e *StrangerError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeIntegrity, Message: e.Error()}
}

// ErrCancelled: the client cancelled the request.
var ErrCancelled = errors.New("handoff: request cancelled")

// ErrDeadline: the request ran past its RequestTimeout.
var ErrDeadline = errors.New("handoff: request timed out")
