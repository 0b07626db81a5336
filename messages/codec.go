package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A frame is HeaderBytes of header, then the message body as one msgpack
// map:
//
//	offset 0  type code, uint16 big endian
//	offset 2  wire version of that type, uint8
//	offset 3  msgpack map keyed by the struct's msgpack tags
//
// Bodies are written by msgpack's encoder from the struct tags and read by
// the hand-written DecodeMsgpack methods below. The decoders exist because
// msgpack v5.4.1's reflection decoder allocates a slice of whatever length
// the input claims (a 5-byte array header can ask for 4 G elements) and
// silently truncates integers that do not fit the field; ours check every
// length against its limit before allocating, refuse out-of-range numbers,
// unknown and repeated fields, and never panic.

// Encode validates m and returns its frame. It refuses an invalid message
// with the error Validate returns, and a frame over MessageBytesMax with a
// *TooLargeError.
func Encode(m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	code, version := m.TypeCode(), m.TypeCode().Version()
	if v, ok := m.(versioned); ok {
		version = v.wireVersion()
	}
	var buf bytes.Buffer
	buf.Grow(256)
	buf.Write([]byte{byte(code >> 8), byte(code), version})
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("messages: encoding %s: %w", code, err)
	}
	if buf.Len() > MessageBytesMax {
		return nil, &TooLargeError{code, "message", buf.Len(), MessageBytesMax}
	}
	return buf.Bytes(), nil
}

// versioned is a message whose wire version depends on what it carries:
// it is encoded at the lowest version that carries it, so that a peer of an
// older build still decodes what it can understand and refuses by its
// version what it cannot.
type versioned interface{ wireVersion() uint8 }

// Decode reads one frame: it checks the size, the header, the body and then
// Validate, and returns a typed error (see errors.go) for anything it
// refuses. It never panics; it allocates a small multiple of len(frame),
// plus at most 1 MiB for a string whose header lies about its length
// (msgpack's first read buffer). The returned message does not alias frame.
func Decode(frame []byte) (Message, error) {
	if len(frame) > MessageBytesMax {
		return nil, &TooLargeError{0, "message", len(frame), MessageBytesMax}
	}
	if len(frame) < HeaderBytes {
		return nil, &TruncatedError{len(frame), HeaderBytes}
	}
	code := TypeCode(binary.BigEndian.Uint16(frame))
	t, ok := lookup(code)
	if !ok {
		return nil, &UnknownTypeError{code}
	}
	if v := frame[2]; v < t.versionMin || v > t.version {
		return nil, &VersionError{code, v, t.versionMin, t.version}
	}
	body := frame[HeaderBytes:]
	r := bytes.NewReader(body)
	d := msgpack.GetDecoder()
	defer msgpack.PutDecoder(d)
	d.Reset(r)
	m := t.new()
	if err := m.DecodeMsgpack(d); err != nil {
		var me *MalformedError
		if errors.As(err, &me) {
			me.Offset = len(body) - r.Len()
		}
		return nil, err
	}
	if r.Len() != 0 {
		return nil, &TrailingBytesError{code, r.Len()}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if v, ok := m.(versioned); ok && v.wireVersion() != frame[2] {
		// A field of a later version in an earlier one's frame (or the
		// reverse) is no frame this build writes: an older peer reading it
		// would take it for something else.
		return nil, &InvalidFieldError{code, "version", fmt.Sprint(frame[2]), fmt.Sprintf("%d for what it carries", v.wireVersion())}
	}
	return m, nil
}

// fields reads a msgpack map whose keys must be among keys, each at most
// once, and calls field with the key's index for each; field reads the
// value. The loop is bounded by len(keys) because repeats are refused.
func fields(d *msgpack.Decoder, t TypeCode, keys []string, field func(i int) error) error {
	n, err := d.DecodeMapLen()
	if err != nil {
		return malformed(t, "", err)
	}
	if n < 0 || n > len(keys) {
		return malformed(t, "", fmt.Errorf("map of %d fields, want 0 to %d", n, len(keys)))
	}
	var seen uint64 // len(keys) ≤ 64, checked by the tests
	for range n {
		k, err := d.DecodeString()
		if err != nil {
			return malformed(t, "", err)
		}
		i := slices.Index(keys, k)
		if i < 0 {
			return malformed(t, "", fmt.Errorf("unknown field %q", truncate(k, 64)))
		}
		if seen&(1<<i) != 0 {
			return malformed(t, k, errors.New("repeated field"))
		}
		seen |= 1 << i
		if err := field(i); err != nil {
			return err
		}
	}
	return nil
}

func malformed(t TypeCode, field string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // the body ended inside a value
	}
	return &MalformedError{Type: t, Field: field, Err: err}
}

// readUint reads a non-negative integer of at most limit.
func readUint(d *msgpack.Decoder, t TypeCode, field string, limit uint64) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, malformed(t, field, err)
	}
	var v uint64
	switch {
	case c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64):
		v, err = d.DecodeUint64()
	case c >= msgpcode.NegFixedNumLow || (c >= msgpcode.Int8 && c <= msgpcode.Int64):
		var s int64
		s, err = d.DecodeInt64()
		if err == nil && s < 0 {
			return 0, malformed(t, field, fmt.Errorf("negative integer %d", s))
		}
		v = uint64(s)
	default:
		return 0, malformed(t, field, fmt.Errorf("msgpack code 0x%02x is not an integer", c))
	}
	if err != nil {
		return 0, malformed(t, field, err)
	}
	if v > limit {
		return 0, malformed(t, field, fmt.Errorf("integer %d out of range [0, %d]", v, limit))
	}
	return v, nil
}

func readU32(d *msgpack.Decoder, t TypeCode, field string, dst *uint32) error {
	v, err := readUint(d, t, field, math.MaxUint32)
	*dst = uint32(v)
	return err
}

func readU64(d *msgpack.Decoder, t TypeCode, field string, dst *uint64) error {
	v, err := readUint(d, t, field, math.MaxUint64)
	*dst = v
	return err
}

// readString reads a string (or nil, as "") of at most limit bytes. msgpack
// caps its first allocation at 1 MiB and grows only with bytes actually
// read, so a lying length costs at most the frame's size.
func readString(d *msgpack.Decoder, t TypeCode, field string, limit int, dst *string) error {
	s, err := d.DecodeString()
	if err != nil {
		return malformed(t, field, err)
	}
	if len(s) > limit {
		return &TooLargeError{t, field, len(s), limit}
	}
	*dst = s
	return nil
}

func readBool(d *msgpack.Decoder, t TypeCode, field string, dst *bool) error {
	v, err := d.DecodeBool()
	if err != nil {
		return malformed(t, field, err)
	}
	*dst = v
	return nil
}

// readLen reads an array header of at most limit elements, before anything is
// allocated for them. nil reads as 0.
func readLen(d *msgpack.Decoder, t TypeCode, field string, limit int) (int, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return 0, malformed(t, field, err)
	}
	if n > limit {
		return 0, &TooLargeError{t, field, n, limit}
	}
	return max(n, 0), nil
}

// readSlice reads an array of at most limit elements, allocating them only
// after the bound is checked, and reads each in place with elem. nil and
// an empty array read as a nil slice.
func readSlice[E any](d *msgpack.Decoder, t TypeCode, field string, limit int, dst *[]E, elem func(e *E) error) error {
	n, err := readLen(d, t, field, limit)
	if err != nil || n == 0 {
		return err
	}
	out := make([]E, n)
	for i := range out {
		if err := elem(&out[i]); err != nil {
			return err
		}
	}
	*dst = out
	return nil
}

// readCounts reads an array of at most limit counters.
func readCounts(d *msgpack.Decoder, t TypeCode, field string, limit int, dst *[]uint64) error {
	return readSlice(d, t, field, limit, dst, func(v *uint64) error {
		return readU64(d, t, field, v)
	})
}

func readTokens(d *msgpack.Decoder, t TypeCode, field string, limit int, dst *[]uint32) error {
	return readSlice(d, t, field, limit, dst, func(tok *uint32) error {
		return readU32(d, t, field, tok)
	})
}

var tagKeys = []string{"inc", "idx", "gen"}

func readTags(d *msgpack.Decoder, t TypeCode, field string, limit int, dst *[]kv.Tag) error {
	return readSlice(d, t, field, limit, dst, func(tag *kv.Tag) error {
		return fields(d, t, tagKeys, func(k int) error {
			switch k {
			case 0:
				return readU64(d, t, field+".inc", &tag.Incarnation)
			case 1:
				return readU32(d, t, field+".idx", &tag.Index)
			default:
				return readU64(d, t, field+".gen", &tag.Generation)
			}
		})
	})
}

var wireErrorKeys = []string{"code", "msg", "have", "limit", "where"}

// readWireError reads a WireError map, or nil when allowNil.
func readWireError(d *msgpack.Decoder, t TypeCode, field string, allowNil bool) (*WireError, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil && allowNil {
		return nil, d.DecodeNil()
	}
	e := new(WireError)
	err := fields(d, t, wireErrorKeys, func(k int) error {
		switch k {
		case 0:
			v, err := readUint(d, t, field+".code", math.MaxUint16)
			e.Code = ErrorCode(v)
			return err
		case 1:
			return readString(d, t, field+".msg", ErrorMessageBytesMax, &e.Message)
		case 2:
			return readU64(d, t, field+".have", &e.Have)
		case 3:
			return readU64(d, t, field+".limit", &e.Limit)
		default:
			return readString(d, t, field+".where", WhereBytesMax, &e.Where)
		}
	})
	return e, err
}

// Checks shared by the Validate methods.

func checkLen(t TypeCode, field string, have, limit int) error {
	if have > limit {
		return &TooLargeError{t, field, have, limit}
	}
	return nil
}

// checkOwner checks the request id and tenant that name a request's owner.
func checkOwner(t TypeCode, id uint64, tenant string) error {
	if err := checkRequestID(t, id); err != nil {
		return err
	}
	return checkTenant(t, tenant)
}

func checkRequestID(t TypeCode, id uint64) error {
	if id == 0 {
		return &InvalidFieldError{t, "id", "0", "a non-zero request id"}
	}
	return nil
}

// CheckTenant is the rule every tenant name on the wire obeys, for names
// that arrive another way (an API keys file), so that they fail where they
// are read rather than on every request.
func CheckTenant(tenant string) error { return checkTenant(TypeGenerateRequest, tenant) }

// checkTenant wants 1 to TenantBytesMax visible ASCII bytes: tenant names
// end up in logs, metrics labels and page owners, where an invisible or
// look-alike character would let two tenants seem one.
func checkTenant(t TypeCode, tenant string) error {
	if tenant == "" {
		return &InvalidFieldError{t, "tenant", `""`, "a non-empty tenant"}
	}
	if err := checkLen(t, "tenant", len(tenant), TenantBytesMax); err != nil {
		return err
	}
	for i := 0; i < len(tenant); i++ {
		if c := tenant[i]; c < 0x21 || c > 0x7e {
			return &InvalidFieldError{t, "tenant", fmt.Sprintf("byte 0x%02x at %d", c, i), "visible ASCII (0x21 to 0x7e)"}
		}
	}
	return nil
}

func checkUTF8(t TypeCode, field, s string) error {
	if !utf8.ValidString(s) {
		return &InvalidFieldError{t, field, "invalid UTF-8", "valid UTF-8"}
	}
	return nil
}

func checkRange(t TypeCode, field string, v, lo, hi uint64) error {
	if v > hi {
		return &TooLargeError{t, field, int(min(v, math.MaxInt)), int(hi)}
	}
	if v < lo {
		return &InvalidFieldError{t, field, fmt.Sprint(v), fmt.Sprintf("%d to %d", lo, hi)}
	}
	return nil
}

// checkAddr wants "" when optional, or else at most AddrBytesMax bytes
// that net.SplitHostPort splits into a host and a non-empty port.
func checkAddr(t TypeCode, field, addr string, optional bool) error {
	if addr == "" && optional {
		return nil
	}
	if err := checkLen(t, field, len(addr), AddrBytesMax); err != nil {
		return err
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return &InvalidFieldError{t, field, fmt.Sprintf("%q", truncate(addr, 64)), "host:port"}
	}
	return nil
}

// checkName wants 1 to limit bytes of UTF-8.
func checkName(t TypeCode, field, name string, limit int) error {
	if err := checkRange(t, field, uint64(len(name)), 1, uint64(limit)); err != nil {
		return err
	}
	return checkUTF8(t, field, name)
}

// checkWord wants one of words.
func checkWord(t TypeCode, field, s string, words []string) error {
	if !slices.Contains(words, s) {
		return &InvalidFieldError{t, field, fmt.Sprintf("%q", truncate(s, 64)), "one of " + strings.Join(words, ", ")}
	}
	return nil
}
