package kv

import "fmt"

// Tag names one tenancy of one physical page: the incarnation of the node
// that holds the page, the page's index in that node's pool, and the page's
// generation. The generation moves on every release, so a tag is never
// reused: a late write or read that presents an old tag is refused.
//
// The zero Tag names nothing: incarnations and generations start at 1.
type Tag struct {
	Incarnation uint64 `msgpack:"inc"`
	Index       uint32 `msgpack:"idx"`
	Generation  uint64 `msgpack:"gen"`
}

func (t Tag) String() string {
	return fmt.Sprintf("%x/%d@%d", t.Incarnation, t.Index, t.Generation)
}

// Owner is who may write a page and who may lease it for reading: one
// request of one tenant. Request ids are unique per node incarnation; the
// tenant is checked separately so that a cross-tenant access is reported as
// such even if request ids were ever confused.
type Owner struct {
	Request uint64 `msgpack:"req"`
	Tenant  string `msgpack:"tenant"`
}

func (o Owner) String() string { return fmt.Sprintf("request %d of tenant %q", o.Request, o.Tenant) }

// TenantBytesMax bounds a tenant name, so that frame headers and node
// messages stay small and fixed in the worst case.
const TenantBytesMax = 64

// Validate refuses the zero request id and empty or oversized tenants.
func (o Owner) Validate() error {
	if o.Request == 0 {
		return fmt.Errorf("kv: owner request id must be non-zero")
	}
	if n := len(o.Tenant); n == 0 || n > TenantBytesMax {
		return fmt.Errorf("kv: owner tenant is %d bytes, want 1 to %d", n, TenantBytesMax)
	}
	return nil
}

// State is where a page is in its lifecycle:
//
//	free → reserved → filling → sealed ⇄ leased → released → free
//	sealed → cached → (released →) free
//
// A page may also go straight from reserved, filling or sealed to free when
// its owner releases it and nobody holds it.
type State uint8

const (
	// Free: no owner; the page can be reserved.
	Free State = iota
	// Reserved: owned, nothing written yet.
	Reserved
	// Filling: owned, some token rows written, not yet sealed.
	Filling
	// Sealed: owned, immutable, checksum fixed; may be leased.
	Sealed
	// Leased: sealed and read by at least one lease holder.
	Leased
	// Released: the owner let it go but a lease holder or the peer has not
	// yet: it returns to Free on the last unlease and acknowledgement, or
	// when its reclaim deadline passes.
	Released
	// Cached: published (Page.Publish), read-only, shared by the leases
	// of its scope, owned by nobody; it returns to Free only by eviction
	// (at once, or through Released while leases are held).
	Cached
)

func (s State) String() string {
	switch s {
	case Free:
		return "free"
	case Reserved:
		return "reserved"
	case Filling:
		return "filling"
	case Sealed:
		return "sealed"
	case Leased:
		return "leased"
	case Released:
		return "released"
	case Cached:
		return "cached"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}
