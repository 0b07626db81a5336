package actors

import (
	"errors"
	"fmt"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// PromptTooLongError: admission refused a prompt before anything existed
// for it. Tokens is what the request needs (prompt, or prompt plus the
// tokens it asks for); Limit is the bound named by Where.
type PromptTooLongError struct {
	Tokens, Limit int
	Where         string
}

func (e *PromptTooLongError) Error() string {
	return fmt.Sprintf("actors: prompt too long: needs %d tokens, %s holds %d", e.Tokens, e.Where, e.Limit)
}

func (e *PromptTooLongError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodePromptTooLong, Message: e.Error(),
		Have: uint64(e.Tokens), Limit: uint64(e.Limit), Where: e.Where}
}

// BusyError: a bounded queue was full, or pages did not come free in time.
type BusyError struct {
	Where       string
	Have, Limit int
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("actors: busy: %s is full (%d of %d)", e.Where, e.Have, e.Limit)
}

func (e *BusyError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBusy, Message: e.Error(),
		Have: uint64(e.Have), Limit: uint64(e.Limit), Where: e.Where}
}

// BadRequestError: the request itself is invalid.
type BadRequestError struct{ Reason string }

func (e *BadRequestError) Error() string { return "actors: bad request: " + e.Reason }

func (e *BadRequestError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBadRequest, Message: e.Error()}
}

// ForbiddenError: the sender's credential does not allow what it sent: a
// request for a tenant it does not name, or a message only another role
// may send.
type ForbiddenError struct {
	Sender string // who sent it, as authenticated
	Reason string
}

func (e *ForbiddenError) Error() string { return "actors: forbidden for " + e.Sender + ": " + e.Reason }

func (e *ForbiddenError) wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeForbidden, Message: e.Error()}
}

// ErrCancelled: the client cancelled the request.
var ErrCancelled = errors.New("actors: request cancelled")

// ErrDeadline: the request ran past its RequestTimeout.
var ErrDeadline = errors.New("actors: request timed out")

// wireError is what a client is told of err. Refusals by the pool (stale
// tag, wrong owner or tenant, checksum, token range) are integrity failures:
// the answer is withheld rather than risked.
func wireError(err error) *messages.WireError {
	var w interface{ wire() *messages.WireError }
	var ex *kv.PoolExhaustedError
	switch {
	case errors.As(err, &w):
		return w.wire()
	case errors.Is(err, ErrCancelled):
		return &messages.WireError{Code: messages.CodeCancelled, Message: err.Error()}
	case errors.Is(err, ErrDeadline):
		return &messages.WireError{Code: messages.CodeCancelled, Message: err.Error(), Where: "request timeout"}
	case errors.As(err, &ex):
		return &messages.WireError{Code: messages.CodeBusy, Message: err.Error(),
			Have: uint64(ex.Need), Limit: uint64(ex.Free), Where: "kv pool"}
	case errors.Is(err, kv.ErrRefused):
		return &messages.WireError{Code: messages.CodeIntegrity, Message: err.Error()}
	}
	return messages.ToWireError(err)
}
