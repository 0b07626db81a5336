package kv

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// A frame carries one contiguous token range of one page from a source page
// (prefill's) to a destination page (decode's). Wire layout, little-endian:
//
//	off  size  field
//	  0     4  magic "KVF1"
//	  4     1  version (1)
//	  5     1  tenant length, 1..TenantBytesMax
//	  6     2  reserved, zero
//	  8     8  request id, non-zero
//	 16    20  source tag (incarnation, index, generation)
//	 36    20  destination tag
//	 56     4  sequence position of the first token
//	 60     4  token count, ≥ 1
//	 64     4  payload length in bytes = token count × bytes per token
//	 68     8  checksum
//	 76     …  tenant bytes, then payload
//
// The checksum is XXH3 over the whole header with the checksum field zeroed
// (tenant included), seeding XXH3 over the payload: every bit of the frame is
// covered, so a misdirected or corrupted frame is refused at the receiver.
const (
	frameMagic          = "KVF1"
	frameVersion        = 1
	frameFixedBytes     = 76
	frameChecksumAt     = 68
	frameHeaderBytesMax = frameFixedBytes + TenantBytesMax
)

// Frame is one decoded frame. Payload aliases the buffer it was decoded from.
type Frame struct {
	Owner  Owner
	Source Tag
	Dest   Tag
	// FirstToken is the sequence position of the first token carried.
	FirstToken int
	Tokens     int
	Checksum   uint64
	Payload    []byte
}

// FrameLimits are the bounds a decoder enforces, from the geometry of the
// pool the frame is meant for.
type FrameLimits struct {
	// PageTokens is the most tokens a frame may carry.
	PageTokens int
	// BytesPerToken fixes the payload length: Tokens × BytesPerToken.
	BytesPerToken int
}

// Limits returns the frame limits of pages of geometry g.
func (g Geometry) Limits() FrameLimits {
	return FrameLimits{PageTokens: g.PageTokens, BytesPerToken: g.BytesPerToken()}
}

// FrameBytesMax is the largest encoded frame under these limits.
func (l FrameLimits) FrameBytesMax() int { return frameHeaderBytesMax + l.PageTokens*l.BytesPerToken }

// ErrFrameShort is returned (wrapped in a *FrameShortError) when the buffer
// holds the start of a frame but not all of it: read more and decode again.
var ErrFrameShort = errors.New("kv: frame incomplete")

// FrameShortError says how many bytes a frame needs and how many are there.
type FrameShortError struct{ Need, Have int }

func (e *FrameShortError) Error() string {
	return fmt.Sprintf("kv: frame incomplete: need %d bytes, have %d", e.Need, e.Have)
}

func (e *FrameShortError) Is(target error) bool { return target == ErrFrameShort }

// FrameError is a malformed frame: a field out of range or inconsistent
// with another. Limit is the bound it broke (or the value it should have).
type FrameError struct {
	Field        string
	Value, Limit uint64
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("kv: malformed frame: %s is %d, limit %d", e.Field, e.Value, e.Limit)
}

func (e *FrameError) Is(target error) bool { return target == ErrRefused }

// AppendFrame encodes f (Checksum is computed, not read) onto dst and
// returns the extended slice and the checksum. It refuses a frame that its
// own decoder would refuse, so nothing invalid leaves the sender.
func AppendFrame(dst []byte, f *Frame, lim FrameLimits) ([]byte, uint64, error) {
	dst, sum, err := AppendFrameHeader(dst, f, lim)
	if err != nil {
		return dst, 0, err
	}
	return append(dst, f.Payload...), sum, nil
}

// AppendFrameHeader encodes f's header, checksum included, onto dst
// without its payload: a sender may then write f.Payload from where it
// lies (a page) instead of copying it behind the header. The frame on the
// wire is the header followed by the payload, exactly as AppendFrame
// writes it.
func AppendFrameHeader(dst []byte, f *Frame, lim FrameLimits) ([]byte, uint64, error) {
	if err := f.Owner.Validate(); err != nil {
		return dst, 0, err
	}
	if err := checkRange(f.FirstToken, f.Tokens, len(f.Payload), lim); err != nil {
		return dst, 0, err
	}
	start := len(dst)
	dst = append(dst, frameMagic...)
	dst = append(dst, frameVersion, byte(len(f.Owner.Tenant)), 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, f.Owner.Request)
	dst = appendTag(dst, f.Source)
	dst = appendTag(dst, f.Dest)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(f.FirstToken))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(f.Tokens))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(f.Payload)))
	dst = binary.LittleEndian.AppendUint64(dst, 0)
	dst = append(dst, f.Owner.Tenant...)
	sum := xxh3.HashSeed(f.Payload, headerSeed(dst[start:]))
	binary.LittleEndian.PutUint64(dst[start+frameChecksumAt:], sum)
	return dst, sum, nil
}

// FrameBytes is the encoded length of f: header, tenant and payload.
func FrameBytes(f *Frame) int { return frameFixedBytes + len(f.Owner.Tenant) + len(f.Payload) }

func checkRange(first, tokens, payload int, lim FrameLimits) error {
	switch {
	case tokens < 1 || tokens > lim.PageTokens:
		return &FrameError{Field: "token count", Value: uint64(max(tokens, 0)), Limit: uint64(lim.PageTokens)}
	case first < 0 || first > SequenceTokensMax:
		return &FrameError{Field: "first token", Value: uint64(max(first, 0)), Limit: SequenceTokensMax}
	case payload != tokens*lim.BytesPerToken:
		return &FrameError{Field: "payload length", Value: uint64(payload), Limit: uint64(tokens * lim.BytesPerToken)}
	}
	return nil
}

// DecodeFrame decodes the frame at the start of buf and returns it with the
// number of bytes it took. A buffer that holds only part of a valid-looking
// frame yields a *FrameShortError (errors.Is ErrFrameShort); anything
// malformed, oversized or inconsistent yields a *FrameError, and a checksum
// that does not match a *ChecksumMismatchError. It never panics and never
// reads past what the header's lengths allow under lim.
func DecodeFrame(buf []byte, lim FrameLimits) (Frame, int, error) {
	if len(buf) < frameFixedBytes {
		if err := checkPrefix(buf); err != nil {
			return Frame{}, 0, err
		}
		return Frame{}, 0, &FrameShortError{Need: frameFixedBytes, Have: len(buf)}
	}
	if err := checkPrefix(buf); err != nil {
		return Frame{}, 0, err
	}
	le := binary.LittleEndian
	tenantLen := int(buf[5])
	if tenantLen < 1 || tenantLen > TenantBytesMax {
		return Frame{}, 0, &FrameError{Field: "tenant length", Value: uint64(tenantLen), Limit: TenantBytesMax}
	}
	if r := le.Uint16(buf[6:]); r != 0 {
		return Frame{}, 0, &FrameError{Field: "reserved", Value: uint64(r), Limit: 0}
	}
	first, tokens, payload := le.Uint32(buf[56:]), le.Uint32(buf[60:]), le.Uint32(buf[64:])
	// Compare as uint64 so that no header value can overflow an int.
	if uint64(payload) > uint64(lim.PageTokens)*uint64(lim.BytesPerToken) {
		return Frame{}, 0, &FrameError{Field: "payload length", Value: uint64(payload),
			Limit: uint64(lim.PageTokens) * uint64(lim.BytesPerToken)}
	}
	if uint64(tokens) > uint64(lim.PageTokens) {
		return Frame{}, 0, &FrameError{Field: "token count", Value: uint64(tokens), Limit: uint64(lim.PageTokens)}
	}
	if err := checkRange(int(first), int(tokens), int(payload), lim); err != nil {
		return Frame{}, 0, err
	}
	hdrEnd := frameFixedBytes + tenantLen
	total := hdrEnd + int(payload)
	if len(buf) < total {
		return Frame{}, 0, &FrameShortError{Need: total, Have: len(buf)}
	}
	f := Frame{
		Owner:      Owner{Request: le.Uint64(buf[8:]), Tenant: string(buf[frameFixedBytes:hdrEnd])},
		Source:     readTag(buf[16:]),
		Dest:       readTag(buf[36:]),
		FirstToken: int(first),
		Tokens:     int(tokens),
		Checksum:   le.Uint64(buf[frameChecksumAt:]),
		Payload:    buf[hdrEnd:total:total],
	}
	if f.Owner.Request == 0 {
		return Frame{}, 0, &FrameError{Field: "request id", Value: 0, Limit: 1}
	}
	var hdr [frameHeaderBytesMax]byte
	h := append(hdr[:0], buf[:hdrEnd]...)
	clear(h[frameChecksumAt : frameChecksumAt+8])
	if have := xxh3.HashSeed(f.Payload, headerSeed(h)); have != f.Checksum {
		return Frame{}, 0, &ChecksumMismatchError{Where: "frame for " + f.Dest.String(), Want: f.Checksum, Have: have}
	}
	return f, total, nil
}

// checkPrefix refuses a buffer whose first bytes cannot start a frame, so a
// stream that is not frames fails at once rather than waiting for more.
func checkPrefix(buf []byte) error {
	n := min(len(buf), len(frameMagic))
	if string(buf[:n]) != frameMagic[:n] {
		return &FrameError{Field: "magic", Value: uint64(binary.BigEndian.Uint32(append(buf[:n:n], make([]byte, 4-n)...))),
			Limit: uint64(binary.BigEndian.Uint32([]byte(frameMagic)))}
	}
	if len(buf) > 4 && buf[4] != frameVersion {
		return &FrameError{Field: "version", Value: uint64(buf[4]), Limit: frameVersion}
	}
	return nil
}

func readTag(b []byte) Tag {
	le := binary.LittleEndian
	return Tag{Incarnation: le.Uint64(b), Index: le.Uint32(b[8:]), Generation: le.Uint64(b[12:])}
}

// Accept writes a decoded frame into the destination page of pool: the
// destination tag must be current and held by the frame's request and
// tenant, and the token range must be the page's next positions. The frame's checksum
// was verified by DecodeFrame.
func (p *Pool) Accept(f *Frame) error {
	return p.Write(f.Dest, f.Owner, f.FirstToken, f.Payload)
}
