package kv

import (
	"fmt"
	"strings"
	"time"
)

// Scope names who may read a cached page: the pages one scope publishes are
// found and leased only under that scope. A scope is made from what the
// node knows of a request's credential (TenantScope: the tenant its API key
// or certificate names; SharedScope: a group an operator declared), never
// from what the request says; a request may only narrow it (Narrow). The
// zero Scope is no scope: nothing is published or leased under it.
type Scope struct{ name string }

// ScopeBytesMax bounds a scope's name: a tenant or group name with its
// kind, and a narrowing of up to CacheSaltBytesMax bytes.
const ScopeBytesMax = 2 + TenantBytesMax + 1 + CacheSaltBytesMax

// CacheSaltBytesMax bounds what a request may narrow its scope by.
const CacheSaltBytesMax = 64

// TenantScope is the scope of one tenant alone.
func TenantScope(tenant string) Scope { return Scope{name: "t:" + tenant} }

// SharedScope is the scope an operator declared for a group of tenants. Its
// names cannot collide with a tenant's scope.
func SharedScope(group string) Scope { return Scope{name: "g:" + group} }

// Narrow is a sub-scope of s: pages published under it are leased only by
// requests that name the same salt inside s, and never under s itself. An
// empty salt narrows nothing.
func (s Scope) Narrow(salt string) Scope {
	if salt == "" || s.IsZero() {
		return s
	}
	return Scope{name: s.name + "\x00" + salt}
}

// admits says whether a reader of tenant may lease under s at all: a
// tenant's scope (narrowed or not) only that tenant; a group's any tenant,
// since the group's members are the policy's to say. A scope made for the
// wrong tenant is refused at the page, whatever made it.
func (s Scope) admits(tenant string) bool {
	own := "t:" + tenant
	return !strings.HasPrefix(s.name, "t:") || s.name == own || strings.HasPrefix(s.name, own+"\x00")
}

// IsZero says s is no scope.
func (s Scope) IsZero() bool { return s.name == "" }

// String is the scope's name, for logs of the node that holds it.
func (s Scope) String() string { return fmt.Sprintf("%q", s.name) }

// Validate refuses the zero scope and one longer than ScopeBytesMax.
func (s Scope) Validate() error {
	if n := len(s.name); n == 0 || n > ScopeBytesMax {
		return fmt.Errorf("kv: scope is %d bytes, want 1 to %d", n, ScopeBytesMax)
	}
	return nil
}

// CachedPage is the handle of a published page: sealed, read-only, shared
// within its scope. It is the only way to name a cached page, and nothing
// that writes, seals, acknowledges or releases a page takes one: a cached
// page can be leased (LeaseShared), read and unleased through the lease,
// and evicted (Evict), nothing else. Its tag is that of the cached tenancy:
// publishing moves the page's generation on, so the tags its writer held
// are stale, and eviction moves it on again, so a CachedPage kept past its
// eviction is refused.
type CachedPage struct {
	Tag   Tag
	Scope Scope
	// First is the sequence position of the page's first row; Tokens is
	// how many rows it holds (always a full page).
	First, Tokens int
	// Checksum covers the cached tenancy's header (tag, scope, token
	// range) and the rows; every shared lease verifies it afresh.
	Checksum uint64
	// Content is the rows' ContentChecksum: what a copy of them hashes to
	// in any pool, for a reader to compare with what another node
	// computed for the same positions.
	Content uint64
}

// Origin is where a copy of the page's rows comes from, for the page the
// rows are copied into to seal only if they are exactly these
// (Page.SealFrom): a copy at the same position hashes, under the cached
// tenancy's header, to the page's checksum.
func (c CachedPage) Origin() Origin {
	return Origin{Tag: c.Tag, Owner: cacheOwner(c.Scope), Checksum: c.Checksum}
}

// cacheOwner is the owner a cached page's checksum header names: no
// request, and the scope in the tenant's place.
func cacheOwner(s Scope) Owner { return Owner{Tenant: s.name} }

// Publish turns a full sealed page that owner holds (no lease outstanding,
// no acknowledgement awaited) into a cached page of scope: the generation
// moves on, the owner is gone, and the checksum is fixed afresh under the
// cached tenancy's header, once the bytes are checked against the seal's
// (bytes changed at rest since the seal are refused, not sealed again as
// the cache's). From then on the page is read only through shared leases
// and freed only by Evict.
func (pg *Page) Publish(tag Tag, owner Owner, scope Scope) (CachedPage, error) {
	if err := pg.access(tag, owner, "publish"); err != nil {
		return CachedPage{}, err
	}
	if err := scope.Validate(); err != nil {
		return CachedPage{}, err
	}
	if pg.state != Sealed || pg.awaitAck {
		return CachedPage{}, &StateError{Page: tag, Op: "publish", State: pg.state}
	}
	if pg.filled != pg.params.pageTokens {
		return CachedPage{}, &TokenRangeError{Page: tag, First: pg.first, Count: pg.filled, Bytes: pg.filled * pg.params.bpt,
			BytesPerToken: pg.params.bpt, PageFirst: pg.first, Filled: pg.filled, PageTokens: pg.params.pageTokens}
	}
	if have := pg.checksum(); have != pg.sum {
		return CachedPage{}, &ChecksumMismatchError{Where: "page " + tag.String() + " at publish", Want: pg.sum, Have: have}
	}
	pg.gen++
	pg.owner = cacheOwner(scope)
	pg.rows.published(pg.owner)
	pg.scope = scope
	pg.state = Cached
	pg.deadline = time.Time{}
	pg.sum = pg.checksum()
	pg.content = ContentChecksum(pg.first, pg.filled, pg.bytes[:pg.filled*pg.params.bpt])
	return pg.cached(), nil
}

func (pg *Page) cached() CachedPage {
	return CachedPage{Tag: pg.Tag(), Scope: pg.scope, First: pg.first, Tokens: pg.filled, Checksum: pg.sum, Content: pg.content}
}

// sharedAccess is the handshake of a shared lease: the tag must name the
// page's current tenancy, the page must be cached (or evicted and not yet
// freed, for a lease already held), and the scope must be the page's.
func (pg *Page) sharedAccess(tag Tag, scope Scope, op string, evicted bool) error {
	if tag != pg.Tag() {
		if tag.Incarnation != pg.params.incarnation || tag.Index != pg.index {
			return &StaleTagError{Page: tag.Index, Have: tag}
		}
		return &StaleTagError{Page: tag.Index, Want: pg.Tag(), Have: tag}
	}
	if pg.state != Cached && (!evicted || pg.state != Released || pg.scope.IsZero()) {
		return &StateError{Page: tag, Op: op, State: pg.state}
	}
	if pg.scope != scope {
		return &WrongScopeError{Page: tag, Have: scope}
	}
	return nil
}

// LeaseShared grants reader a read lease on a cached page of scope, after
// checking its bytes against the checksum it was published with: a cache
// bug shows as a ChecksumMismatchError, never as bytes. Leases are counted;
// while any is held the page is not freed, short of a reclaim after its
// eviction and the reclaim deadline.
func (pg *Page) LeaseShared(c CachedPage, reader Owner, scope Scope) (Lease, error) {
	if err := reader.Validate(); err != nil {
		return Lease{}, err
	}
	if !scope.admits(reader.Tenant) {
		return Lease{}, &WrongScopeError{Page: c.Tag, Have: scope}
	}
	if err := pg.sharedAccess(c.Tag, scope, "shared lease", false); err != nil {
		return Lease{}, err
	}
	if have := pg.checksum(); have != pg.sum || pg.sum != c.Checksum {
		return Lease{}, &ChecksumMismatchError{Where: "cached page " + c.Tag.String(), Want: c.Checksum, Have: have}
	}
	pg.readers++
	return Lease{Tag: c.Tag, Owner: reader, Scope: scope}, nil
}

// Evict gives a cached page up: at once when no lease holds it, otherwise
// once the last lease is given back (or at now + ReclaimAfter, whichever
// comes first). Either way the generation moves on when it is freed.
func (pg *Page) Evict(c CachedPage, now time.Time) (freed bool, err error) {
	if err := pg.sharedAccess(c.Tag, c.Scope, "evict", false); err != nil {
		return false, err
	}
	return pg.letGo(now) // a cached page awaits no acknowledgement
}

// WrongScopeError: a shared lease or read under a scope that is not the
// cached page's. The page's own scope is not named: it is another
// tenant's business.
type WrongScopeError struct {
	Page Tag
	Have Scope
}

func (e *WrongScopeError) Is(target error) bool { return target == ErrRefused }

func (e *WrongScopeError) Error() string {
	return fmt.Sprintf("kv: page %s is not cached under scope %s", e.Page, e.Have)
}

// AckPublish is Ack for a page sent from a prefill worker's pool whose
// bytes are worth keeping: when the acknowledgement would free the page
// (released, no lease outstanding), it is full and its bytes are still
// those sealed, the page is published under scope instead (as Publish
// does) and its handle returned; otherwise it is an Ack, and the handle is
// the zero CachedPage (freed says whether the ack freed the page). It
// never refuses what Ack would take: bytes changed at rest (which decode
// refused, and aborted) are freed, never kept for later prompts.
func (pg *Page) AckPublish(tag Tag, owner Owner, scope Scope) (c CachedPage, freed bool, err error) {
	if err := pg.access(tag, owner, "ack"); err != nil {
		return CachedPage{}, false, err
	}
	if !pg.awaitAck {
		return CachedPage{}, false, &StateError{Page: tag, Op: "ack without await", State: pg.state}
	}
	if pg.state != Released || pg.readers != 0 || pg.filled != pg.params.pageTokens || scope.Validate() != nil ||
		pg.checksum() != pg.sum {
		freed, err = pg.Ack(tag, owner)
		return CachedPage{}, freed, err
	}
	pg.awaitAck = false
	pg.state = Sealed
	c, err = pg.Publish(tag, owner, scope)
	return c, false, err
}
