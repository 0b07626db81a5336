package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/trust"
)

// MetaVersion is the only metadata encoding this package writes and reads.
// A peer that gossips another version is refused (counted, logged and kept
// out of Members) rather than half understood.
const MetaVersion uint8 = 2

// AddrLenMax is the longest address, in bytes, that Meta may carry in
// RemoteAddr or DataAddr. It is chosen so that MetaEncodedLenMax stays under
// memberlist.MetaMaxSize with room for later fields; it is below the 253
// bytes DNS allows, so very long host names must be replaced by an IP
// address.
const AddrLenMax = 200

// Layout of encoding version 1, little-endian like the kv frame codec:
//
//	offset size field
//	     0    1 version (MetaVersion)
//	     1    1 role (Role, 1..4)
//	     2    1 flags (bit 0: draining, bit 1: leaving; others zero)
//	     3    8 incarnation (non-zero)
//	    11    8 started, Unix milliseconds (non-zero)
//	    19    4 pool capacity, pages
//	    23    4 free pages (≤ capacity)
//	    27   16 model fingerprint (non-zero)
//	    43    1 length of RemoteAddr (1..AddrLenMax)
//	    44    n RemoteAddr
//	     .    1 length of DataAddr (0..AddrLenMax)
//	     .    m DataAddr
//
// Nothing may follow DataAddr. Every accepted input re-encodes to the same
// bytes, so two members agree on what a metadata blob means.
const (
	metaFixedLen = 1 + 1 + 1 + 8 + 8 + 4 + 4 + len(engine.Fingerprint{})
	// MetaEncodedLenMax is the worst-case encoded size: both addresses at
	// AddrLenMax.
	MetaEncodedLenMax = metaFixedLen + 1 + AddrLenMax + 1 + AddrLenMax
)

// The build fails here if the worst case ever outgrows memberlist's limit
// (memberlist panics on oversized metadata); TestMetaWorstCaseFits and
// Meta.Validate check the same bound at test time and at startup.
var _ [memberlist.MetaMaxSize - MetaEncodedLenMax]struct{}

const (
	flagDraining = 1 << 0
	flagLeaving  = 1 << 1
	flagsKnown   = flagDraining | flagLeaving
)

// Role is what a node serves.
type Role uint8

// Roles. The zero Role is invalid so that a forgotten field is refused.
const (
	RolePrefill Role = 1 + iota
	RoleDecode
	RoleRouter
	RoleAll
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleRouter:
		return "router"
	case RoleAll:
		return "all"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

func (r Role) valid() bool { return r >= RolePrefill && r <= RoleAll }

// identityRole is the certificate role a node of this role holds; ""
// for an invalid role, which no certificate names.
func (r Role) identityRole() trust.Role {
	switch r {
	case RolePrefill:
		return trust.RolePrefill
	case RoleDecode:
		return trust.RoleDecode
	case RoleRouter:
		return trust.RoleRouter
	case RoleAll:
		return trust.RoleAll
	}
	return ""
}

// servesKV reports whether a node in this role holds a KV pool and so must
// advertise a data-plane address.
func (r Role) servesKV() bool { return r != RoleRouter }

// receivesKV reports whether a node in this role receives KV frames and so
// must publish its data-plane address: prefill nodes only send.
func (r Role) receivesKV() bool { return r == RoleDecode || r == RoleAll }

// ParseRole maps "prefill", "decode", "router" or "all" to its Role.
func ParseRole(s string) (Role, error) {
	for r := RolePrefill; r <= RoleAll; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("cluster: unknown role %q (want prefill, decode, router or all)", s)
}

// Meta is what a node tells the cluster about itself through memberlist's
// node metadata. It is small and changes rarely (free pages, draining);
// anything larger or faster-moving travels by actor message.
type Meta struct {
	Role Role
	// Incarnation identifies this run of the node; it is chosen at start
	// and never reused, so a restarted node is never taken for its old
	// self. It must be non-zero and is also part of the member name.
	Incarnation uint64
	// StartedUnixMilli is when this run started, in Unix milliseconds.
	// Start sets it; the value passed to Start is ignored and UpdateMeta
	// keeps the one Start chose. It orders two runs that claim the same
	// address: the later start wins.
	StartedUnixMilli uint64
	// RemoteAddr is the host:port of the node's actor-system remote.
	// Required; at most AddrLenMax bytes; no wildcard host, no port 0.
	RemoteAddr string
	// DataAddr is the host:port of the node's KV data plane. Required for
	// roles that receive KV (decode, all); optional otherwise; same rules
	// as RemoteAddr.
	DataAddr string
	// CapacityPages is the size of the node's KV pool, in pages.
	CapacityPages uint32
	// FreePages is how many of those pages are free; ≤ CapacityPages.
	FreePages uint32
	// Model is the fingerprint of the model the node serves (for a
	// router, the one whose tokenizer it counts prompts with); nodes of
	// one request's path must share it. Required.
	Model engine.Fingerprint
	// Draining is set while the node takes no new work.
	Draining bool
	// Leaving is set by Membership.Leave just before the node announces
	// its departure; it is how other members tell a graceful leave from a
	// failure (memberlist does not say). Callers never set it.
	Leaving bool
}

// ErrMetaInvalid is matched (errors.Is) by every error that refuses a
// metadata value or blob; errors.As on the concrete types gives the numbers.
var ErrMetaInvalid = errors.New("cluster: invalid node metadata")

// MetaSizeError: an encoded metadata blob is larger than Limit bytes.
type MetaSizeError struct {
	Size, Limit int
}

func (e *MetaSizeError) Error() string {
	return fmt.Sprintf("cluster: node metadata is %d bytes, limit %d", e.Size, e.Limit)
}

func (e *MetaSizeError) Is(target error) bool { return target == ErrMetaInvalid }

// MetaTruncatedError: a blob ended inside Field, which needs Need bytes at
// Offset where only Have remain.
type MetaTruncatedError struct {
	Field              string
	Offset, Need, Have int
}

func (e *MetaTruncatedError) Error() string {
	return fmt.Sprintf("cluster: node metadata truncated in %s at offset %d: need %d bytes, have %d",
		e.Field, e.Offset, e.Need, e.Have)
}

func (e *MetaTruncatedError) Is(target error) bool { return target == ErrMetaInvalid }

// MetaVersionError: a blob carries an encoding version this build does not
// read.
type MetaVersionError struct {
	Version, Supported uint8
}

func (e *MetaVersionError) Error() string {
	return fmt.Sprintf("cluster: node metadata version %d, this build reads version %d", e.Version, e.Supported)
}

func (e *MetaVersionError) Is(target error) bool { return target == ErrMetaInvalid }

// MetaAddrError: an address field is too long, malformed, a wildcard or
// has port 0. Len and LenMax are in bytes.
type MetaAddrError struct {
	Field       string
	Addr        string
	Len, LenMax int
	Reason      string
}

func (e *MetaAddrError) Error() string {
	return fmt.Sprintf("cluster: node metadata %s %q (%d bytes, limit %d): %s",
		e.Field, e.Addr, e.Len, e.LenMax, e.Reason)
}

func (e *MetaAddrError) Is(target error) bool { return target == ErrMetaInvalid }

// MetaFieldError: a numeric field is out of range. Limit is the bound it
// broke where there is one.
type MetaFieldError struct {
	Field        string
	Value, Limit uint64
	Reason       string
}

func (e *MetaFieldError) Error() string {
	return fmt.Sprintf("cluster: node metadata %s = %d (limit %d): %s", e.Field, e.Value, e.Limit, e.Reason)
}

func (e *MetaFieldError) Is(target error) bool { return target == ErrMetaInvalid }

// Validate checks every field and that the encoding fits in
// memberlist.MetaMaxSize, whose excess makes memberlist panic.
func (m Meta) Validate() error { return m.validate(memberlist.MetaMaxSize) }

func (m Meta) validate(sizeLimit int) error {
	switch {
	case !m.Role.valid():
		return &MetaFieldError{Field: "role", Value: uint64(m.Role), Limit: uint64(RoleAll), Reason: "unknown role"}
	case m.Incarnation == 0:
		return &MetaFieldError{Field: "incarnation", Reason: "must be non-zero"}
	case m.StartedUnixMilli == 0:
		return &MetaFieldError{Field: "started", Reason: "must be non-zero"}
	case m.Model.IsZero():
		return &MetaFieldError{Field: "model fingerprint", Reason: "must be non-zero"}
	case m.FreePages > m.CapacityPages:
		return &MetaFieldError{Field: "free pages", Value: uint64(m.FreePages), Limit: uint64(m.CapacityPages),
			Reason: "more free pages than the pool holds"}
	}
	if err := CheckAddr("remote address", m.RemoteAddr, true); err != nil {
		return err
	}
	if err := CheckAddr("data address", m.DataAddr, m.Role.receivesKV()); err != nil {
		return err
	}
	if !m.Role.servesKV() && m.CapacityPages != 0 {
		return &MetaFieldError{Field: "capacity pages", Value: uint64(m.CapacityPages),
			Reason: "role router holds no KV pool"}
	}
	if n := m.EncodedLen(); n > sizeLimit {
		return &MetaSizeError{Size: n, Limit: sizeLimit}
	}
	return nil
}

// CheckAddr is the check of an address that Meta carries, for the field
// named: host:port with a port in 1..65535, a host made of address
// characters only, and no wildcard IP (it would name every host); ""
// only when not required.
func CheckAddr(field, addr string, required bool) error {
	bad := func(reason string) error {
		return &MetaAddrError{Field: field, Addr: addr, Len: len(addr), LenMax: AddrLenMax, Reason: reason}
	}
	if addr == "" {
		if required {
			return bad("required")
		}
		return nil
	}
	if len(addr) > AddrLenMax {
		return bad("too long")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return bad("not host:port")
	}
	if host == "" {
		return bad("empty host")
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '-' || c == ':' || c == '_' || c == '%'
		if !ok {
			return bad(fmt.Sprintf("byte 0x%02x not allowed in host", c))
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || strconv.FormatUint(p, 10) != port {
		return bad("port must be 1..65535 in canonical decimal")
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return bad("wildcard host names no node")
	}
	return nil
}

// EncodedLen is the size of m's encoding in bytes. It does not validate.
func (m Meta) EncodedLen() int {
	return metaFixedLen + 1 + len(m.RemoteAddr) + 1 + len(m.DataAddr)
}

// EncodeMeta validates m and appends its encoding to dst.
func EncodeMeta(dst []byte, m Meta) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return dst, err
	}
	var flags uint8
	if m.Draining {
		flags |= flagDraining
	}
	if m.Leaving {
		flags |= flagLeaving
	}
	le := binary.LittleEndian
	dst = append(dst, MetaVersion, uint8(m.Role), flags)
	dst = le.AppendUint64(dst, m.Incarnation)
	dst = le.AppendUint64(dst, m.StartedUnixMilli)
	dst = le.AppendUint32(dst, m.CapacityPages)
	dst = le.AppendUint32(dst, m.FreePages)
	dst = append(dst, m.Model[:]...)
	// Validate bounded both lengths by AddrLenMax < 256.
	dst = append(dst, uint8(len(m.RemoteAddr)))
	dst = append(dst, m.RemoteAddr...)
	dst = append(dst, uint8(len(m.DataAddr)))
	dst = append(dst, m.DataAddr...)
	return dst, nil
}

// metaReader walks a blob and remembers the first shortfall.
type metaReader struct {
	b   []byte
	off int
}

func (r *metaReader) take(field string, n int) ([]byte, error) {
	if have := len(r.b) - r.off; have < n {
		return nil, &MetaTruncatedError{Field: field, Offset: r.off, Need: n, Have: have}
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *metaReader) addr(field string) (string, error) {
	n, err := r.take(field+" length", 1)
	if err != nil {
		return "", err
	}
	if int(n[0]) > AddrLenMax {
		// Refuse on the length alone, before reading (or echoing) the bytes.
		return "", &MetaAddrError{Field: field, Len: int(n[0]), LenMax: AddrLenMax, Reason: "too long"}
	}
	s, err := r.take(field, int(n[0]))
	if err != nil {
		return "", err
	}
	return string(s), nil
}

// DecodeMeta parses and validates a blob written by EncodeMeta. It refuses
// anything oversized, truncated, of another version, out of range or with
// trailing bytes, with an error that matches ErrMetaInvalid; it never
// panics and never keeps a reference to b.
func DecodeMeta(b []byte) (Meta, error) {
	if len(b) > memberlist.MetaMaxSize {
		return Meta{}, &MetaSizeError{Size: len(b), Limit: memberlist.MetaMaxSize}
	}
	r := metaReader{b: b}
	fixed, err := r.take("fixed header", metaFixedLen)
	if err != nil {
		return Meta{}, err
	}
	if fixed[0] != MetaVersion {
		return Meta{}, &MetaVersionError{Version: fixed[0], Supported: MetaVersion}
	}
	if flags := fixed[2]; flags&^flagsKnown != 0 {
		return Meta{}, &MetaFieldError{Field: "flags", Value: uint64(flags), Limit: flagsKnown,
			Reason: "unknown flag bits"}
	}
	le := binary.LittleEndian
	m := Meta{
		Role:             Role(fixed[1]),
		Draining:         fixed[2]&flagDraining != 0,
		Leaving:          fixed[2]&flagLeaving != 0,
		Incarnation:      le.Uint64(fixed[3:]),
		StartedUnixMilli: le.Uint64(fixed[11:]),
		CapacityPages:    le.Uint32(fixed[19:]),
		FreePages:        le.Uint32(fixed[23:]),
	}
	copy(m.Model[:], fixed[27:])
	if m.RemoteAddr, err = r.addr("remote address"); err != nil {
		return Meta{}, err
	}
	if m.DataAddr, err = r.addr("data address"); err != nil {
		return Meta{}, err
	}
	if extra := len(b) - r.off; extra != 0 {
		return Meta{}, &MetaFieldError{Field: "trailing bytes", Value: uint64(extra), Reason: "nothing may follow the data address"}
	}
	if err := m.Validate(); err != nil {
		return Meta{}, err
	}
	return m, nil
}
