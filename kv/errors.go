package kv

import (
	"errors"
	"fmt"
)

// ErrRefused is matched (errors.Is) by every error that refuses an access to
// a page: stale tag, wrong owner, wrong tenant, wrong state, bad token
// range, checksum mismatch. Callers that only need "the access was refused"
// test for it; callers that need the numbers use errors.As on the type.
var ErrRefused = errors.New("kv: access refused")

// PoolExhaustedError: a reservation needs more pages than are free, or
// than are free to its tenant, which may hold at most Share pages of the
// pool (tenancy.PoolShares: its share's part of any pool, and while other
// tenants wait for pages, its weight's part). Nothing was reserved.
type PoolExhaustedError struct {
	Need, Free, Capacity int
	// Tenant, Held and Share, when Share is not zero, say Free is what is
	// left to Tenant, which holds Held of the Share pages it may.
	Tenant      string
	Held, Share int
}

func (e *PoolExhaustedError) Error() string {
	s := fmt.Sprintf("kv: pool exhausted: need %d pages, %d free of %d", e.Need, e.Free, e.Capacity)
	if e.Share > 0 {
		s += fmt.Sprintf(" to tenant %q, which holds %d of the %d it may", e.Tenant, e.Held, e.Share)
	}
	return s
}

// StaleTagError: the presented tag does not name the current tenancy of the
// page, or names a page this pool does not hold (another incarnation, or an
// index past the pool's end). Want is the page's current tag; it is the
// zero Tag when the page does not exist here.
type StaleTagError struct {
	Page       uint32
	Want, Have Tag
}

func (e *StaleTagError) Error() string {
	if e.Want == (Tag{}) {
		return fmt.Sprintf("kv: no page %d here for tag %s", e.Page, e.Have)
	}
	return fmt.Sprintf("kv: stale tag for page %d: current %s, presented %s", e.Page, e.Want, e.Have)
}

func (e *StaleTagError) Is(target error) bool { return target == ErrRefused }

// WrongTenantError: the tag is current but the page belongs to another
// tenant. This is the access the runtime exists to prevent.
type WrongTenantError struct {
	Page        Tag
	Owner, Have string
}

func (e *WrongTenantError) Error() string {
	return fmt.Sprintf("kv: page %s belongs to tenant %q, refused to tenant %q", e.Page, e.Owner, e.Have)
}

func (e *WrongTenantError) Is(target error) bool { return target == ErrRefused }

// WrongOwnerError: the tag is current and the tenant matches, but the page
// belongs to another request.
type WrongOwnerError struct {
	Page        Tag
	Owner, Have uint64
}

func (e *WrongOwnerError) Error() string {
	return fmt.Sprintf("kv: page %s belongs to request %d, refused to request %d", e.Page, e.Owner, e.Have)
}

func (e *WrongOwnerError) Is(target error) bool { return target == ErrRefused }

// StateError: the operation is not allowed in the page's current state
// (a write to a sealed page, a lease on a filling page, a read without a
// lease, a second release…).
type StateError struct {
	Page  Tag
	Op    string
	State State
}

func (e *StateError) Error() string {
	return fmt.Sprintf("kv: %s refused on page %s in state %s", e.Op, e.Page, e.State)
}

func (e *StateError) Is(target error) bool { return target == ErrRefused }

// TokenRangeError: a write's token range is not the next contiguous range
// of the page, overflows it, or its byte length is not a whole number of
// tokens. Positions are sequence positions.
type TokenRangeError struct {
	Page                 Tag
	First, Count         int // the range presented; Count is -1 when Bytes is not a whole number of tokens
	Bytes, BytesPerToken int
	PageFirst            int // sequence position of the page's first row
	Filled, PageTokens   int // what the page holds and can hold
}

func (e *TokenRangeError) Error() string {
	if e.Count < 0 {
		return fmt.Sprintf("kv: write of %d bytes to page %s is not a whole number of %d-byte tokens",
			e.Bytes, e.Page, e.BytesPerToken)
	}
	return fmt.Sprintf("kv: write of tokens [%d, %d) to page %s refused: page holds [%d, %d) of %d tokens and takes only [%d, %d)",
		e.First, e.First+e.Count, e.Page, e.PageFirst, e.PageFirst+e.Filled, e.PageTokens,
		e.PageFirst+e.Filled, e.PageFirst+e.PageTokens)
}

func (e *TokenRangeError) Is(target error) bool { return target == ErrRefused }

// ChecksumMismatchError: the checksum computed over the bytes does not
// equal the one recorded (at seal, in a manifest, or in a frame header).
type ChecksumMismatchError struct {
	Where      string
	Want, Have uint64
}

func (e *ChecksumMismatchError) Error() string {
	return fmt.Sprintf("kv: checksum mismatch in %s: want %016x, have %016x", e.Where, e.Want, e.Have)
}

func (e *ChecksumMismatchError) Is(target error) bool { return target == ErrRefused }

// ManifestError: a manifest disagrees with itself or with the pool in a
// count (pages, tokens).
type ManifestError struct {
	Field      string
	Page       int // index in the manifest, -1 for the whole manifest
	Want, Have int
}

func (e *ManifestError) Error() string {
	if e.Page < 0 {
		return fmt.Sprintf("kv: manifest %s: want %d, have %d", e.Field, e.Want, e.Have)
	}
	return fmt.Sprintf("kv: manifest page %d %s: want %d, have %d", e.Page, e.Field, e.Want, e.Have)
}

func (e *ManifestError) Is(target error) bool { return target == ErrRefused }
