package handoff

import (
	"errors"
	"fmt"
	"strings"

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

// UnavailableError: no node of a role the request needs is in sight of
// the node that admits it: none alive, verified, serving its model and not
// draining. Nothing was reserved. Unlike BusyError, waiting does not help
// unless a node joins; another router may see one.
type UnavailableError struct {
	// Roles are those of which no node is in sight: "decode", "prefill".
	Roles []string
	// Seen is what is in sight instead, for operators; may be empty.
	Seen string
}

// NoNodes is the refusal of a request that found decodes decode and
// prefills prefill nodes in sight, one of them none; seen says what is in
// sight, for operators.
func NoNodes(decodes, prefills int, seen string) *UnavailableError {
	e := &UnavailableError{Seen: seen}
	if decodes == 0 {
		e.Roles = append(e.Roles, "decode")
	}
	if prefills == 0 {
		e.Roles = append(e.Roles, "prefill")
	}
	return e
}

func (e *UnavailableError) Error() string {
	none := make([]string, len(e.Roles))
	for i, r := range e.Roles {
		none[i] = "no " + r + " node"
	}
	s := "handoff: " + strings.Join(none, " and ") + " is in sight"
	if e.Seen != "" {
		s += " (" + e.Seen + ")"
	}
	return s
}

// Wire is what a client is told of e: Where names the roles missing.
func (e *UnavailableError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeUnavailable, Message: e.Error(), Where: strings.Join(e.Roles, " and ") + " nodes"}
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
