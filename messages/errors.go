package messages

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// Errors of encoding, decoding and validation. Each carries the numbers that
// explain it; match them with errors.As. ToWireError turns any of them into
// the WireError a peer or client is told.

// TooLargeError: a frame or a field exceeds its limit.
type TooLargeError struct {
	Type  TypeCode // 0 when the frame's type is not known yet
	Field string   // "message" for the whole frame
	Have  int      // bytes, tokens or tags, as the limit counts them
	Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("messages: %s.%s is %d, limit %d", e.Type, e.Field, e.Have, e.Limit)
}

// TruncatedError: the frame is shorter than its header.
type TruncatedError struct {
	Have, Need int // bytes
}

func (e *TruncatedError) Error() string {
	return fmt.Sprintf("messages: frame of %d bytes is shorter than the %d-byte header", e.Have, e.Need)
}

// UnknownTypeError: the frame names a type code this build does not know.
type UnknownTypeError struct {
	Code TypeCode
}

func (e *UnknownTypeError) Error() string {
	return fmt.Sprintf("messages: unknown type code %d", uint16(e.Code))
}

// VersionError: the frame's wire version is outside what this build decodes.
type VersionError struct {
	Type     TypeCode
	Version  uint8
	Min, Max uint8
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("messages: %s wire version %d, this build decodes %d to %d", e.Type, e.Version, e.Min, e.Max)
}

// MalformedError: the body is not the msgpack this type expects (wrong kind
// of value, unknown or repeated field, number out of range, cut short). Err
// is the underlying cause; a body cut short matches io.ErrUnexpectedEOF.
type MalformedError struct {
	Type   TypeCode
	Field  string // "" when the problem is the body's shape
	Offset int    // bytes into the body where decoding stopped
	Err    error
}

func (e *MalformedError) Error() string {
	f := ""
	if e.Field != "" {
		f = "." + e.Field
	}
	return fmt.Sprintf("messages: malformed %s%s at body byte %d: %v", e.Type, f, e.Offset, e.Err)
}

func (e *MalformedError) Unwrap() error { return e.Err }

// TrailingBytesError: bytes follow a complete body. A frame is exactly one
// value, so this means corruption or a framing bug, never a newer peer.
type TrailingBytesError struct {
	Type  TypeCode
	Bytes int
}

func (e *TrailingBytesError) Error() string {
	return fmt.Sprintf("messages: %d trailing bytes after %s body", e.Bytes, e.Type)
}

// InvalidFieldError: a field holds a value outside its domain (empty tenant,
// zero request id, counts that disagree). Value and Want say which.
type InvalidFieldError struct {
	Type  TypeCode
	Field string
	Value string
	Want  string
}

func (e *InvalidFieldError) Error() string {
	return fmt.Sprintf("messages: %s.%s is %s, want %s", e.Type, e.Field, e.Value, e.Want)
}

// ErrorCode is the stable numeric code of an error that crosses the wire.
// Codes are never renumbered and a retired code is never reused: clients
// and older nodes match on them.
type ErrorCode uint16

const (
	// CodePromptTooLong: the prompt exceeds the context window or the
	// smallest KV pool on its path. Have: prompt tokens; Limit: the bound;
	// Where: which bound.
	CodePromptTooLong ErrorCode = 1
	// CodeBusy: admission refused the request for lack of capacity; retry
	// later. Have/Limit: the queue or pool figures.
	CodeBusy ErrorCode = 2
	// CodeIntegrity: a checksum, tag or token count did not match; the answer
	// was withheld rather than risked.
	CodeIntegrity ErrorCode = 3
	// CodeNodeLost: a node on the request's path left or died.
	CodeNodeLost ErrorCode = 4
	// CodeCancelled: the client (or a deadline) cancelled the request.
	CodeCancelled ErrorCode = 5
	// CodeBadRequest: the request or a message was invalid; Message says why.
	CodeBadRequest ErrorCode = 6
	// CodeInternal: a bug or an unexpected failure.
	CodeInternal ErrorCode = 7
	// CodeForbidden: the sender's credential does not allow the request
	// (another tenant's name, a role that may not send it).
	CodeForbidden ErrorCode = 8
	// CodeModelMismatch: two nodes on the request's path compute different
	// models (weights, tokenizer or KV type); the KV one computed would
	// decode into a wrong answer on the other. Message names both
	// fingerprints.
	CodeModelMismatch ErrorCode = 9
	// CodeUnavailable: no node of a role the request needs (decode,
	// prefill) is in sight of the node that admitted it: none alive,
	// verified, serving its model and not draining. Nothing was reserved.
	// Unlike CodeBusy, waiting does not help unless a node joins; another
	// router may see one. Where names the roles missing.
	CodeUnavailable ErrorCode = 10
)

// CodesMax bounds every code a count by code holds (NodeStatus
// FailedByCode): codes are below it.
const CodesMax = 16

// KnownCodes are the codes this build names, in order.
func KnownCodes() []ErrorCode {
	var out []ErrorCode
	for c := ErrorCode(1); c < CodesMax; c++ {
		if !strings.HasPrefix(c.String(), "code(") {
			out = append(out, c)
		}
	}
	return out
}

// SumCounts adds two lists of counts element by element; the shorter
// counts as zeros where it ends.
func SumCounts(a, b []uint64) []uint64 {
	out := make([]uint64, max(len(a), len(b)))
	copy(out, a)
	for i, v := range b {
		out[i] += v
	}
	return out
}

// CodeCounts counts events by code, from any goroutine.
type CodeCounts [CodesMax]atomic.Uint64

// Add counts one of code; a code at or past CodesMax counts as
// CodeInternal.
func (c *CodeCounts) Add(code ErrorCode) {
	if code >= CodesMax {
		code = CodeInternal
	}
	c[code].Add(1)
}

// Counts is every count, index the code, up to the last non-zero one.
func (c *CodeCounts) Counts() []uint64 {
	out := make([]uint64, 0, CodesMax)
	for i := range c {
		out = append(out, c[i].Load())
	}
	for len(out) > 0 && out[len(out)-1] == 0 {
		out = out[:len(out)-1]
	}
	return out
}

func (c ErrorCode) String() string {
	switch c {
	case CodePromptTooLong:
		return "prompt_too_long"
	case CodeBusy:
		return "busy"
	case CodeIntegrity:
		return "integrity_failure"
	case CodeNodeLost:
		return "node_lost"
	case CodeCancelled:
		return "cancelled"
	case CodeBadRequest:
		return "bad_request"
	case CodeInternal:
		return "internal"
	case CodeForbidden:
		return "forbidden"
	case CodeModelMismatch:
		return "model_mismatch"
	case CodeUnavailable:
		return "unavailable"
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// HTTPStatus maps a code to the status an HTTP front end answers with;
// never 2xx. A code this build does not know (from a newer peer) is 500.
func (c ErrorCode) HTTPStatus() int {
	switch c {
	case CodePromptTooLong, CodeBadRequest:
		return http.StatusBadRequest
	case CodeBusy:
		return http.StatusTooManyRequests
	case CodeNodeLost, CodeModelMismatch, CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeCancelled:
		return 499 // client closed request, as nginx reports it
	case CodeForbidden:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

// WireError is an error that crosses the wire: a stable code, a message for
// people, and the numbers behind it. The decoder accepts any non-zero code,
// so that a newer peer's code reaches the client (as a 500) instead of
// failing the whole message.
type WireError struct {
	Code    ErrorCode `msgpack:"code"`
	Message string    `msgpack:"msg,omitempty"`
	// Have and Limit are the numbers behind the error (tokens, pages, queue
	// length), 0 when they do not apply.
	Have  uint64 `msgpack:"have,omitempty"`
	Limit uint64 `msgpack:"limit,omitempty"`
	// Where names the bound or the node involved ("context window",
	// "decode pool", a node address).
	Where string `msgpack:"where,omitempty"`
}

// WhereDrainingRouter is the Where of a router's CodeBusy answer while it
// drains: the cluster behind it may have room, and a client that knows
// other routers sends the request through one of them.
const WhereDrainingRouter = "draining router"

func (e *WireError) Error() string {
	s := fmt.Sprintf("%s (%d): %s", e.Code, uint16(e.Code), e.Message)
	if e.Have != 0 || e.Limit != 0 {
		s += fmt.Sprintf(" [have %d, limit %d]", e.Have, e.Limit)
	}
	if e.Where != "" {
		s += " at " + e.Where
	}
	return s
}

// Is matches another *WireError with the same code, so that
// errors.Is(err, &WireError{Code: CodeBusy}) works.
func (e *WireError) Is(target error) bool {
	t, ok := target.(*WireError)
	return ok && t.Code == e.Code
}

func (e *WireError) validate(in TypeCode, field string) error {
	if e.Code == 0 {
		return &InvalidFieldError{in, field + ".code", "0", "a non-zero error code"}
	}
	if err := checkLen(in, field+".msg", len(e.Message), ErrorMessageBytesMax); err != nil {
		return err
	}
	return checkLen(in, field+".where", len(e.Where), WhereBytesMax)
}

// Bounded is e with its message and where cut to their limits (on a UTF-8
// boundary), so that it passes validation however long the error it tells
// of was; nil stays nil.
func (e *WireError) Bounded() *WireError {
	if e == nil || len(e.Message) <= ErrorMessageBytesMax && len(e.Where) <= WhereBytesMax {
		return e
	}
	b := *e
	b.Message, b.Where = truncate(e.Message, ErrorMessageBytesMax), truncate(e.Where, WhereBytesMax)
	return &b
}

// ToWireError is what to tell a peer or client about err: err itself if it
// is (or wraps) a *WireError; CodeBadRequest with the numbers for a message
// this package refused; CodeInternal otherwise.
func ToWireError(err error) *WireError {
	if err == nil {
		return nil
	}
	var we *WireError
	if errors.As(err, &we) {
		return we
	}
	out := &WireError{Code: CodeBadRequest, Message: truncate(err.Error(), ErrorMessageBytesMax)}
	var tl *TooLargeError
	switch {
	case errors.As(err, &tl):
		out.Have, out.Limit, out.Where = uint64(tl.Have), uint64(tl.Limit), truncate(tl.Type.String()+"."+tl.Field, WhereBytesMax)
	case isCodecError(err):
	default:
		out.Code = CodeInternal
	}
	return out
}

func isCodecError(err error) bool {
	var (
		t *TruncatedError
		u *UnknownTypeError
		v *VersionError
		m *MalformedError
		b *TrailingBytesError
		f *InvalidFieldError
	)
	return errors.As(err, &t) || errors.As(err, &u) || errors.As(err, &v) ||
		errors.As(err, &m) || errors.As(err, &b) || errors.As(err, &f)
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
