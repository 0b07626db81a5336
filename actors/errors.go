package actors

import (
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// The handoff's errors, as the actor layer's callers name them.
type (
	// PromptTooLongError: admission refused a prompt before anything
	// existed for it.
	PromptTooLongError = handoff.PromptTooLongError
	// BusyError: a bounded queue was full, or pages did not come free in
	// time.
	BusyError = handoff.BusyError
	// UnavailableError: no node of a role the request needs is in sight.
	UnavailableError = handoff.UnavailableError
	// BadRequestError: the request itself is invalid.
	BadRequestError = handoff.BadRequestError
	// StrangerError: frames or a transfer report from someone other than
	// the planned prefill peer.
	StrangerError = handoff.StrangerError
	// FirstTokenError: prefill's first token is not the one the KV gives.
	FirstTokenError = handoff.FirstTokenError
)

// ErrCancelled and ErrDeadline end a request the client withdrew or that
// ran past its RequestTimeout.
var (
	ErrCancelled = handoff.ErrCancelled
	ErrDeadline  = handoff.ErrDeadline
)

// ForbiddenError: the sender's credential does not allow what it sent: a
// request for a tenant it does not name, or a message only another role
// may send.
type ForbiddenError struct {
	Sender string // who sent it, as authenticated
	Reason string
}

func (e *ForbiddenError) Error() string { return "actors: forbidden for " + e.Sender + ": " + e.Reason }

// Wire is what a client is told of e.
func (e *ForbiddenError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeForbidden, Message: e.Error()}
}
