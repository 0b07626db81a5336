package kv

import (
	"fmt"
	"time"
)

// Config sizes one pool. Validate runs before the arena is allocated.
type Config struct {
	// Geometry is the shape of the KV cache the pool stores.
	Geometry Geometry
	// Pages is the number of physical pages. Must be at least 1.
	Pages int
	// Incarnation identifies the node run that owns the pool; it is chosen
	// at node start so that a restarted node's tags never match its old
	// self's. Must be non-zero.
	Incarnation uint64
	// ReclaimAfter is how long a released page may wait for its last
	// unlease or its peer's acknowledgement before Tick reclaims it anyway.
	// Must be positive.
	ReclaimAfter time.Duration
	// OwnedTimeout is the longest a page may stay owned (reserved,
	// filling, sealed or leased) from its reservation before Tick reclaims
	// it anyway, so that an owner that dies without releasing its pages
	// cannot pin them forever. It must be longer than any owner's
	// legitimate use of a page. Must be positive.
	OwnedTimeout time.Duration
	// ArenaBytesMax bounds the arena (Pages × page bytes) in bytes, so that a
	// mistaken page count fails here with the numbers instead of in the
	// allocator. Must be positive.
	ArenaBytesMax int64
}

// DefaultArenaBytesMax is the arena bound of DefaultConfig: 64 GiB.
const DefaultArenaBytesMax = 64 << 30

// DefaultConfig is a pool of pages pages for geometry g, with a 30-second
// reclaim deadline and pages owned for at most 10 minutes.
func DefaultConfig(g Geometry, pages int, incarnation uint64) Config {
	return Config{Geometry: g, Pages: pages, Incarnation: incarnation,
		ReclaimAfter: 30 * time.Second, OwnedTimeout: 10 * time.Minute, ArenaBytesMax: DefaultArenaBytesMax}
}

// pagesMax keeps page indexes inside a Tag's uint32.
const pagesMax = 1 << 31

// SequenceTokensMax bounds a sequence position, so that positions fit a
// frame header's uint32 fields with room for a page past the end.
const SequenceTokensMax = 1 << 30

// Validate reports the first field out of range, with its value.
func (c Config) Validate() error {
	if err := c.Geometry.Validate(); err != nil {
		return err
	}
	switch {
	case c.Pages < 1 || c.Pages > pagesMax:
		return fmt.Errorf("kv: pool Pages (%d) must be in [1, %d]", c.Pages, pagesMax)
	case c.Incarnation == 0:
		return fmt.Errorf("kv: pool Incarnation must be non-zero")
	case c.ReclaimAfter <= 0:
		return fmt.Errorf("kv: pool ReclaimAfter (%s) must be positive", c.ReclaimAfter)
	case c.OwnedTimeout <= 0:
		return fmt.Errorf("kv: pool OwnedTimeout (%s) must be positive", c.OwnedTimeout)
	case c.ArenaBytesMax <= 0:
		return fmt.Errorf("kv: pool ArenaBytesMax (%d) must be positive", c.ArenaBytesMax)
	}
	if need := int64(c.Pages) * int64(c.Geometry.PageBytes()); need > c.ArenaBytesMax {
		return fmt.Errorf("kv: pool of %d pages × %d bytes = %d bytes exceeds ArenaBytesMax (%d)",
			c.Pages, c.Geometry.PageBytes(), need, c.ArenaBytesMax)
	}
	return nil
}

// Pool is the paged KV store of one device: an arena allocated once, the
// pages over it, and their free list. It is a pure state machine: see the
// package documentation for its contract.
type Pool struct {
	cfg   Config
	pages []Page
	free  FreeList
	stats Stats
}

// Stats counts pages by state and the refusals and reclaims so far.
type Stats struct {
	Capacity, Free, Reserved, Filling, Sealed, Leased, Released, Cached int

	// Reservations and Releases count pages, over the pool's life.
	Reservations, Releases uint64
	// Reclaimed counts pages freed by Tick because their deadline passed,
	// by the state they were in: Released (a lease or an acknowledgement
	// outstanding past ReclaimAfter) or owned (never released within
	// OwnedTimeout).
	Reclaimed Reclaims
	// Refused counts accesses refused, by reason.
	Refused Refusals
	// Cross counts rows that reads returned although another owner wrote
	// them: zero in a correct pool, and counted only in a chaos build
	// (see CrossRows).
	Cross CrossRows
}

// Reclaims counts reclaimed pages by the State they were reclaimed in;
// the Free entry stays zero.
type Reclaims [Released + 1]uint64

// Total is the sum over all states.
func (r Reclaims) Total() uint64 {
	var t uint64
	for _, n := range r {
		t += n
	}
	return t
}

// Refusals counts refused accesses by reason. WrongTenant counts shared
// leases and reads under another scope (WrongScopeError) too.
type Refusals struct {
	Stale, WrongTenant, WrongOwner, State, Range, Checksum uint64
}

// Total is the sum over all reasons.
func (r Refusals) Total() uint64 {
	return r.Stale + r.WrongTenant + r.WrongOwner + r.State + r.Range + r.Checksum
}

// Count adds err to the counter of its reason; other errors are not
// counted.
func (r *Refusals) Count(err error) {
	switch err.(type) {
	case *StaleTagError:
		r.Stale++
	case *WrongTenantError, *WrongScopeError:
		r.WrongTenant++
	case *WrongOwnerError:
		r.WrongOwner++
	case *StateError:
		r.State++
	case *TokenRangeError, *ManifestError:
		r.Range++
	case *ChecksumMismatchError:
		r.Checksum++
	}
}

// NewPages validates cfg, then allocates one arena and the pages over it,
// with generations starting at 1 so that the zero Tag never names a page.
// Pool uses it; so does anything that spreads one pool's pages over several
// owners (one actor a page).
func NewPages(cfg Config) ([]Page, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	params := &pageParams{incarnation: cfg.Incarnation, bpt: cfg.Geometry.BytesPerToken(),
		pageTokens: cfg.Geometry.PageTokens, reclaimAfter: cfg.ReclaimAfter, ownedTimeout: cfg.OwnedTimeout}
	pb := cfg.Geometry.PageBytes()
	arena := make([]byte, cfg.Pages*pb)
	pages := make([]Page, cfg.Pages)
	for i := range pages {
		pages[i] = Page{params: params, index: uint32(i), bytes: arena[i*pb : (i+1)*pb : (i+1)*pb], gen: 1}
	}
	return pages, nil
}

// FirstTags are the tags pages will hand out first, in index order.
func FirstTags(pages []Page) []Tag {
	tags := make([]Tag, len(pages))
	for i := range pages {
		tags[i] = pages[i].Tag()
	}
	return tags
}

// NewPool validates cfg and then allocates the whole arena once. The pool
// never grows.
func NewPool(cfg Config) (*Pool, error) {
	pages, err := NewPages(cfg)
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, pages: pages, free: NewFreeList(FirstTags(pages))}
	p.stats.Capacity = cfg.Pages
	p.stats.Free = cfg.Pages
	return p, nil
}

// Config returns the configuration the pool was built with.
func (p *Pool) Config() Config { return p.cfg }

// Geometry is the shape of the pool's pages.
func (p *Pool) Geometry() Geometry { return p.cfg.Geometry }

// Stats returns the counters as of now.
func (p *Pool) Stats() Stats {
	s := p.stats
	s.Cross = CrossRowsOf(p.pages)
	return s
}

// Reserve gives owner n free pages, all or nothing, at now, and returns
// their tags in order. Page i will hold the request's tokens from sequence
// position firstToken + i × PageTokens on: binding each page to its
// position lets a write (or a frame) meant for another position of the
// same request be refused, not just one meant for another request. The
// pages are the owner's until it releases them or now + OwnedTimeout. A
// refusal reserves nothing.
func (p *Pool) Reserve(owner Owner, firstToken, n int, now time.Time) ([]Tag, error) {
	if err := owner.Validate(); err != nil {
		return nil, err
	}
	if firstToken < 0 || firstToken > SequenceTokensMax {
		return nil, fmt.Errorf("kv: reserve at sequence position %d: want 0 to %d", firstToken, SequenceTokensMax)
	}
	tags, err := p.free.Take(n)
	if err != nil {
		return nil, err
	}
	for i, t := range tags {
		p.pages[t.Index].Assign(t, owner, firstToken+i*p.cfg.Geometry.PageTokens, now)
	}
	p.stats.Free -= n
	p.stats.Reserved += n
	p.stats.Reservations += uint64(n)
	return tags, nil
}

// page finds the page a tag names, or refuses a tag of another pool.
func (p *Pool) page(tag Tag) (*Page, error) {
	if tag.Incarnation != p.cfg.Incarnation || int64(tag.Index) >= int64(len(p.pages)) {
		err := &StaleTagError{Page: tag.Index, Have: tag}
		p.stats.Refused.Count(err)
		return nil, err
	}
	return &p.pages[tag.Index], nil
}

// do runs one page operation and keeps the counters and the free list in
// step with what it did.
func (p *Pool) do(tag Tag, op func(pg *Page) (freed bool, err error)) error {
	pg, err := p.page(tag)
	if err != nil {
		return err
	}
	before := pg.state
	freed, err := op(pg)
	if err != nil {
		p.stats.Refused.Count(err)
		return err
	}
	p.moved(before, pg)
	if freed {
		p.freed(pg)
	}
	return nil
}

// moved counts a page that went from state before to its state now.
func (p *Pool) moved(before State, pg *Page) {
	if before == pg.state {
		return
	}
	*p.count(before)--
	*p.count(pg.state)++
}

func (p *Pool) count(s State) *int {
	switch s {
	case Free:
		return &p.stats.Free
	case Reserved:
		return &p.stats.Reserved
	case Filling:
		return &p.stats.Filling
	case Sealed:
		return &p.stats.Sealed
	case Leased:
		return &p.stats.Leased
	case Released:
		return &p.stats.Released
	case Cached:
		return &p.stats.Cached
	}
	panic(fmt.Sprintf("kv: count of state %s", s))
}

// freed returns a page that was just freed to the free list.
func (p *Pool) freed(pg *Page) {
	p.free.Push(pg.Tag())
	p.stats.Releases++
}

func noFree(err error) (bool, error) { return false, err }

// Write appends whole token rows to a page that owner holds under tag (see
// Page.Write).
func (p *Pool) Write(tag Tag, owner Owner, first int, data []byte) error {
	return p.do(tag, func(pg *Page) (bool, error) { return noFree(pg.Write(tag, owner, first, data)) })
}

// Seal makes a filling page immutable and fixes its checksum (see
// Page.Seal).
func (p *Pool) Seal(tag Tag, owner Owner) (sum uint64, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		sum, err = pg.Seal(tag, owner)
		return false, err
	})
	return sum, err
}

// SealFrom seals a filling page only if its bytes are those its source
// sealed (see Page.SealFrom).
func (p *Pool) SealFrom(tag Tag, owner Owner, o Origin) (sum uint64, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		sum, err = pg.SealFrom(tag, owner, o)
		return false, err
	})
	return sum, err
}

// Lease grants a read lease on a sealed page to its owner (see Page.Lease).
func (p *Pool) Lease(tag Tag, owner Owner) (l Lease, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		l, err = pg.Lease(tag, owner)
		return false, err
	})
	return l, err
}

// Read returns the written bytes of a leased page and the tokens they hold
// (see Page.Read). The slice must not be written. Read changes no state, so
// it skips do's bookkeeping: it is the check on every read of a page.
func (p *Pool) Read(l Lease) ([]byte, int, error) {
	pg, err := p.page(l.Tag)
	if err != nil {
		return nil, 0, err
	}
	b, tokens, err := pg.Read(l)
	if err != nil {
		p.stats.Refused.Count(err)
	}
	return b, tokens, err
}

// Unlease gives a lease back (see Page.Unlease).
func (p *Pool) Unlease(l Lease) error {
	return p.do(l.Tag, func(pg *Page) (bool, error) { return pg.Unlease(l) })
}

// AwaitAck marks a sealed page as sent to a peer that has not acknowledged
// it yet (see Page.AwaitAck).
func (p *Pool) AwaitAck(tag Tag, owner Owner) error {
	return p.do(tag, func(pg *Page) (bool, error) { return noFree(pg.AwaitAck(tag, owner)) })
}

// Ack records the peer's acknowledgement of a page (see Page.Ack).
func (p *Pool) Ack(tag Tag, owner Owner) error {
	return p.do(tag, func(pg *Page) (bool, error) { return pg.Ack(tag, owner) })
}

// Release gives a page back, at once or deferred (see Page.Release). It
// reports whether the page is free already.
func (p *Pool) Release(tag Tag, owner Owner, now time.Time) (freed bool, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		freed, err = pg.Release(tag, owner, now)
		return freed, err
	})
	return freed, err
}

// Tick reclaims every page whose deadline is at or before now (see
// Page.Reclaim), and returns them. Leases still held on them become stale.
// It looks at every page: a pool is ticked seconds apart, not per access.
func (p *Pool) Tick(now time.Time) []Reclaim {
	var out []Reclaim
	for i := range p.pages {
		pg := &p.pages[i]
		r, ok := pg.Reclaim(now)
		if !ok {
			continue
		}
		out = append(out, r)
		*p.count(r.State)--
		p.stats.Free++
		p.stats.Reclaimed[r.State]++
		p.freed(pg)
	}
	return out
}

// Inspect reports page idx for status displays and invariant checks.
func (p *Pool) Inspect(idx uint32) PageInfo { return p.pages[idx].Info() }

// bytesOf is the whole of page idx's bytes, written or not, for tests that
// corrupt a page behind the pool's back.
func (p *Pool) bytesOf(idx uint32) []byte { return p.pages[idx].bytes }

// Publish turns a full sealed page that owner holds into a cached page of
// scope (see Page.Publish).
func (p *Pool) Publish(tag Tag, owner Owner, scope Scope) (c CachedPage, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		c, err = pg.Publish(tag, owner, scope)
		return false, err
	})
	return c, err
}

// LeaseShared grants reader a shared read lease on a cached page of scope
// (see Page.LeaseShared).
func (p *Pool) LeaseShared(c CachedPage, reader Owner, scope Scope) (l Lease, err error) {
	err = p.do(c.Tag, func(pg *Page) (bool, error) {
		l, err = pg.LeaseShared(c, reader, scope)
		return false, err
	})
	return l, err
}

// Evict gives a cached page up at now (see Page.Evict).
func (p *Pool) Evict(c CachedPage, now time.Time) (freed bool, err error) {
	err = p.do(c.Tag, func(pg *Page) (bool, error) {
		freed, err = pg.Evict(c, now)
		return freed, err
	})
	return freed, err
}

// AckPublish acknowledges a page and publishes it under scope when the
// acknowledgement would free it (see Page.AckPublish).
func (p *Pool) AckPublish(tag Tag, owner Owner, scope Scope) (c CachedPage, err error) {
	err = p.do(tag, func(pg *Page) (bool, error) {
		var freed bool
		c, freed, err = pg.AckPublish(tag, owner, scope)
		return freed, err
	})
	return c, err
}
