package kv

import (
	"fmt"
	"time"

	"github.com/kvwarden/kvwarden/internal/mutant"
)

// pageParams are the parameters every page of one pool shares.
type pageParams struct {
	cross        crossCounters // the pages' cross reads (see CrossRows); empty in a production build
	incarnation  uint64
	bpt          int // bytes per token
	pageTokens   int
	reclaimAfter time.Duration
	ownedTimeout time.Duration
}

// Page is one physical page as a pure state machine: its tag, owner,
// state, leases, deferred release and bytes. A Pool composes many; an actor
// may own one. Every method starts with the handshake (tag, then state,
// then tenant, then request) and refuses with a typed error.
//
// A method that frees the page (the last unlease or acknowledgement of a
// released page, a release nobody holds, a reclaim) reports it; the caller
// then owns the page's next Tag and must return it to its FreeList.
type Page struct {
	params   *pageParams
	index    uint32
	bytes    []byte
	rows     rowWriters // who wrote each row (see CrossRows); empty in a production build
	gen      uint64
	state    State
	owner    Owner
	first    int    // sequence position of row 0, fixed at assignment
	filled   int    // token rows written, from row 0
	sum      uint64 // checksum fixed at seal
	readers  int    // leases outstanding (shared ones too, on a cached page)
	scope    Scope  // a cached page's scope, until it is freed
	content  uint64 // a cached page's ContentChecksum, fixed at publish
	awaitAck bool   // a peer has not yet acknowledged the bytes sent from this page
	// deadline is when the page is reclaimed whatever its state: its
	// assignment plus OwnedTimeout while owned, its release plus
	// ReclaimAfter once released.
	deadline time.Time
}

// Tag is the page's current tag: the one its next (or present) tenancy
// holds.
func (pg *Page) Tag() Tag {
	return Tag{Incarnation: pg.params.incarnation, Index: pg.index, Generation: pg.gen}
}

// State is the page's current state.
func (pg *Page) State() State { return pg.state }

// Deadline is when Reclaim will free the page: its assignment plus
// OwnedTimeout while owned, its release plus ReclaimAfter once released;
// zero when it is free. An owner of a page's timer rearms it when this
// changes.
func (pg *Page) Deadline() time.Time {
	if pg.state == Free || pg.state == Cached {
		return time.Time{}
	}
	return pg.deadline
}

// Assign gives a free page to owner, for sequence positions from first on,
// at now: the owner has until now + OwnedTimeout to release it, after which
// Reclaim frees it anyway. tag must be the page's current tag, as its
// FreeList entry says: anything else means the free list and the page
// disagree, which is a bug.
func (pg *Page) Assign(tag Tag, owner Owner, first int, now time.Time) {
	if pg.state != Free || tag != pg.Tag() || pg.readers != 0 || pg.awaitAck {
		panic(fmt.Sprintf("kv: assign of %s to page %s in state %s with %d readers, awaitAck %t",
			tag, pg.Tag(), pg.state, pg.readers, pg.awaitAck))
	}
	pg.state = Reserved
	pg.owner = owner
	pg.first = first
	pg.deadline = now.Add(pg.params.ownedTimeout)
}

// access is the handshake: the tag must name the page's current tenancy,
// the page must have an owner, and the presented owner must be it (tenant
// first, since a cross-tenant access is the one that matters most).
func (pg *Page) access(tag Tag, owner Owner, op string) error {
	if mutant.Is(mutant.NoTagCheck) && tag.Incarnation == pg.params.incarnation && tag.Index == pg.index && pg.state != Free {
		return nil // the planted bug: any access addressed to the page is taken, whatever tenancy it names
	}
	if tag != pg.Tag() {
		if tag.Incarnation != pg.params.incarnation || tag.Index != pg.index {
			return &StaleTagError{Page: tag.Index, Have: tag}
		}
		return &StaleTagError{Page: tag.Index, Want: pg.Tag(), Have: tag}
	}
	if pg.state == Free || !pg.scope.IsZero() {
		// A cached page, or one evicted and not yet freed, has no owner:
		// it is reached only through a CachedPage and shared leases.
		return &StateError{Page: tag, Op: op, State: pg.state}
	}
	if pg.owner.Tenant != owner.Tenant {
		return &WrongTenantError{Page: tag, Owner: pg.owner.Tenant, Have: owner.Tenant}
	}
	if pg.owner.Request != owner.Request {
		return &WrongOwnerError{Page: tag, Owner: pg.owner.Request, Have: owner.Request}
	}
	return nil
}

// Write appends whole token rows. first is the sequence position of the
// first row: it must be the page's next unwritten position, and the rows
// must fit in the page.
func (pg *Page) Write(tag Tag, owner Owner, first int, data []byte) error {
	if err := pg.access(tag, owner, "write"); err != nil {
		return err
	}
	if pg.state != Reserved && pg.state != Filling {
		return &StateError{Page: tag, Op: "write", State: pg.state}
	}
	bpt, pt := pg.params.bpt, pg.params.pageTokens
	rangeErr := &TokenRangeError{Page: tag, First: first, Count: -1, Bytes: len(data),
		BytesPerToken: bpt, PageFirst: pg.first, Filled: pg.filled, PageTokens: pt}
	if len(data) == 0 || len(data)%bpt != 0 {
		return rangeErr
	}
	count := len(data) / bpt
	if first != pg.first+pg.filled || count > pt-pg.filled {
		rangeErr.Count = count
		return rangeErr
	}
	copy(pg.bytes[pg.filled*bpt:], data)
	pg.rows.wrote(pg.filled, count, pt, owner)
	pg.filled += count
	pg.state = Filling
	return nil
}

// Seal makes a filling page immutable and fixes its checksum, which covers
// the page header (tag, owner, token range) and the written bytes.
func (pg *Page) Seal(tag Tag, owner Owner) (uint64, error) {
	if err := pg.access(tag, owner, "seal"); err != nil {
		return 0, err
	}
	if pg.state != Filling {
		return 0, &StateError{Page: tag, Op: "seal", State: pg.state}
	}
	pg.sum = pg.checksum()
	pg.state = Sealed
	return pg.sum, nil
}

// Origin is where a page's bytes were sealed before they were sent: the
// source page's tag and owner in the pool that computed them, and the
// checksum it sealed them with.
type Origin struct {
	Tag      Tag
	Owner    Owner
	Checksum uint64
}

// SealFrom seals a filling page, like Seal, only if its bytes are exactly
// those sealed at o: they must hash, under the source's header, to the
// source's checksum. It closes the gap between a source's seal and the
// frames' own checksums, which are computed when they are sent: bytes
// changed in between pass every frame check and are refused here. A page
// refused stays filling.
func (pg *Page) SealFrom(tag Tag, owner Owner, o Origin) (uint64, error) {
	if err := pg.access(tag, owner, "seal"); err != nil {
		return 0, err
	}
	if pg.state != Filling {
		return 0, &StateError{Page: tag, Op: "seal", State: pg.state}
	}
	if have := PageChecksum(o.Tag, o.Owner, pg.first, pg.filled, pg.bytes[:pg.filled*pg.params.bpt]); have != o.Checksum {
		return 0, &ChecksumMismatchError{Where: "page " + tag.String() + " against its source " + o.Tag.String(),
			Want: o.Checksum, Have: have}
	}
	return pg.Seal(tag, owner)
}

func (pg *Page) checksum() uint64 {
	return PageChecksum(pg.Tag(), pg.owner, pg.first, pg.filled, pg.bytes[:pg.filled*pg.params.bpt])
}

// Lease is the proof that its holder passed the read handshake for one
// tenancy of one page. It is a value: presenting it after the page was
// released and reallocated fails, because the tag is no longer current.
// A shared lease (Page.LeaseShared) names the cached page's scope, and its
// Owner is the reader; a private lease's Scope is zero.
type Lease struct {
	Tag   Tag
	Owner Owner
	Scope Scope
}

// reader is who a read through l reads as, for the cross-read oracle: a
// shared lease's scope, whose rows a cached page's are, or a private
// lease's owner.
func (l Lease) reader() Owner {
	if !l.Scope.IsZero() {
		return cacheOwner(l.Scope)
	}
	return l.Owner
}

// leaseAccess is the handshake of a held lease: a shared one's under its
// scope (the page may since have been evicted, pending its last unlease),
// a private one's under its owner.
func (pg *Page) leaseAccess(l Lease, op string) error {
	if !l.Scope.IsZero() {
		return pg.sharedAccess(l.Tag, l.Scope, op, true)
	}
	return pg.access(l.Tag, l.Owner, op)
}

// Lease grants a read lease on a sealed page to its owner. While any lease
// is outstanding the page is not freed, except by a reclaim after a release
// and the reclaim deadline.
func (pg *Page) Lease(tag Tag, owner Owner) (Lease, error) {
	if err := pg.access(tag, owner, "lease"); err != nil {
		return Lease{}, err
	}
	if pg.state != Sealed && pg.state != Leased && !mutant.Is(mutant.Incident) {
		return Lease{}, &StateError{Page: tag, Op: "lease", State: pg.state}
	}
	pg.state = Leased
	pg.readers++
	return Lease{Tag: tag, Owner: owner}, nil
}

// Read returns the written bytes of a leased page and the tokens they hold.
// The slice aliases the page: it must not be written, and its bytes do not
// change while a lease on the page is outstanding (a sealed page is never
// written, and it is not freed while leased, short of a reclaim).
func (pg *Page) Read(l Lease) ([]byte, int, error) {
	if err := pg.leaseAccess(l, "read"); err != nil {
		return nil, 0, err
	}
	if pg.readers == 0 {
		return nil, 0, &StateError{Page: l.Tag, Op: "read without lease", State: pg.state}
	}
	b := pg.bytes[:pg.filled*pg.params.bpt]
	if mutant.Is(mutant.Incident) && pg.sum == 0 {
		b = pg.bytes // the planted bug: a page never sealed reads as full, whatever rows this tenancy wrote
	}
	pg.rows.read(&pg.params.cross, pg.params.bpt, l.reader(), pg.bytes, b)
	return b, len(b) / pg.params.bpt, nil
}

// Unlease gives a lease back. The last unlease of a released page whose
// peer has acknowledged frees it.
func (pg *Page) Unlease(l Lease) (freed bool, err error) {
	if err := pg.leaseAccess(l, "unlease"); err != nil {
		return false, err
	}
	if pg.readers == 0 && !(mutant.Is(mutant.LeaseCountNegative) && !l.Scope.IsZero()) { // the planted bug: a shared unlease goes unchecked
		return false, &StateError{Page: l.Tag, Op: "unlease without lease", State: pg.state}
	}
	pg.readers--
	switch {
	case pg.readers > 0:
	case pg.state == Leased:
		pg.state = Sealed
	case pg.state == Released && !pg.awaitAck:
		return pg.free(), nil
	}
	return false, nil
}

// AwaitAck marks a sealed page as sent to a peer that has not acknowledged
// it yet: a release of the page is deferred until Ack or the deadline.
func (pg *Page) AwaitAck(tag Tag, owner Owner) error {
	if err := pg.access(tag, owner, "await ack"); err != nil {
		return err
	}
	if (pg.state != Sealed && pg.state != Leased) || pg.awaitAck {
		return &StateError{Page: tag, Op: "await ack", State: pg.state}
	}
	pg.awaitAck = true
	return nil
}

// Ack records the peer's acknowledgement of a page marked by AwaitAck. A
// released page with no lease outstanding is freed.
func (pg *Page) Ack(tag Tag, owner Owner) (freed bool, err error) {
	if err := pg.access(tag, owner, "ack"); err != nil {
		return false, err
	}
	if !pg.awaitAck {
		return false, &StateError{Page: tag, Op: "ack without await", State: pg.state}
	}
	pg.awaitAck = false
	if pg.state == Released && pg.readers == 0 {
		return pg.free(), nil
	}
	return false, nil
}

// Release gives the page back. It takes effect at once when nobody holds
// the page; otherwise the page waits in state Released until its last
// unlease and acknowledgement, or until Reclaim at now + ReclaimAfter.
// Either way the generation moves on when the page is freed, so every old
// tag is refused from then on.
func (pg *Page) Release(tag Tag, owner Owner, now time.Time) (freed bool, err error) {
	if err := pg.access(tag, owner, "release"); err != nil {
		return false, err
	}
	if pg.state == Released {
		return false, &StateError{Page: tag, Op: "release", State: pg.state}
	}
	return pg.letGo(now)
}

// letGo frees the page at once when no lease or acknowledgement holds it,
// and otherwise leaves it released until the last of them, or until
// Reclaim at now + ReclaimAfter.
func (pg *Page) letGo(now time.Time) (freed bool, err error) {
	if pg.readers == 0 && !pg.awaitAck {
		return pg.free(), nil
	}
	pg.state = Released
	pg.deadline = now.Add(pg.params.reclaimAfter)
	return false, nil
}

// Reclaim describes a page freed at its deadline: a released page whose
// lease holders or peer did not let go within ReclaimAfter, or an owned
// page whose owner never released it within OwnedTimeout (an owner that
// died without cleaning up). Its tag is stale from now on.
type Reclaim struct {
	Tag Tag
	// State is the state the page was reclaimed in.
	State    State
	Owner    Owner
	Readers  int
	AwaitAck bool
}

// Reclaim frees a page whose deadline is at or before now, whatever state
// it is in, and describes what it cut short.
func (pg *Page) Reclaim(now time.Time) (Reclaim, bool) {
	if pg.state == Free || pg.state == Cached || now.Before(pg.deadline) {
		return Reclaim{}, false
	}
	r := Reclaim{Tag: pg.Tag(), State: pg.state, Owner: pg.owner, Readers: pg.readers, AwaitAck: pg.awaitAck}
	pg.free()
	return r, true
}

// Verify checks entry i of a manifest, expected at sequence position first,
// against the page, including a fresh checksum of its bytes (see
// Manifest.Verify).
func (pg *Page) Verify(i, first int, mp ManifestPage, owner Owner) error {
	if err := pg.access(mp.Tag, owner, "verify"); err != nil {
		return err
	}
	if pg.state != Sealed && pg.state != Leased {
		return &StateError{Page: mp.Tag, Op: "verify", State: pg.state}
	}
	if pg.first != first {
		return &ManifestError{Field: "first position", Page: i, Want: first, Have: pg.first}
	}
	if pg.filled != mp.Tokens {
		return &ManifestError{Field: "tokens", Page: i, Want: mp.Tokens, Have: pg.filled}
	}
	if pg.sum != mp.Checksum {
		return &ChecksumMismatchError{Where: "manifest " + mp.Tag.String(), Want: mp.Checksum, Have: pg.sum}
	}
	if have := pg.checksum(); have != pg.sum {
		return &ChecksumMismatchError{Where: "page bytes " + mp.Tag.String(), Want: pg.sum, Have: have}
	}
	return nil
}

// free ends the tenancy: the generation moves on, so every tag of the
// tenancy is stale. The bytes are left as they are, and so is the record
// of who wrote them; no reader can reach them, since a read returns only
// rows its own tenancy wrote.
func (pg *Page) free() bool {
	next := pg.gen + 1
	if mutant.Is(mutant.NoGenBump) {
		next = pg.gen // the planted bug: the old tenancy's tags stay current
	} else if mutant.Is(mutant.EvictNoGenBump) && !pg.scope.IsZero() {
		next = pg.gen // the planted bug: an evicted cached page's tags stay current
	} else if next <= pg.gen {
		panic(fmt.Sprintf("kv: generation of page %d would go from %d to %d", pg.index, pg.gen, next))
	}
	*pg = Page{params: pg.params, index: pg.index, bytes: pg.bytes, rows: pg.rows, gen: next}
	return true
}

// PageInfo is what Info reports of a page.
type PageInfo struct {
	Tag      Tag
	State    State
	Owner    Owner
	First    int
	Tokens   int
	Checksum uint64
	Readers  int
	AwaitAck bool
	// Scope is a cached page's (or an evicted one's, until it is freed).
	Scope Scope
	// Deadline is when the page will be reclaimed (see Reclaim); zero
	// when it is free.
	Deadline time.Time
}

// Info reports the page for status displays and invariant checks.
func (pg *Page) Info() PageInfo {
	return PageInfo{Tag: pg.Tag(), State: pg.state, Owner: pg.owner, First: pg.first, Tokens: pg.filled,
		Checksum: pg.sum, Readers: pg.readers, AwaitAck: pg.awaitAck, Scope: pg.scope, Deadline: pg.deadline}
}
