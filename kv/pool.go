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
	// ArenaBytesMax bounds the arena (Pages × page bytes) in bytes, so that a
	// mistaken page count fails here with the numbers instead of in the
	// allocator. Must be positive.
	ArenaBytesMax int64
}

// DefaultArenaBytesMax is the arena bound of DefaultConfig: 64 GiB.
const DefaultArenaBytesMax = 64 << 30

// DefaultConfig is a pool of pages pages for geometry g, with a 30-second
// reclaim deadline.
func DefaultConfig(g Geometry, pages int, incarnation uint64) Config {
	return Config{Geometry: g, Pages: pages, Incarnation: incarnation,
		ReclaimAfter: 30 * time.Second, ArenaBytesMax: DefaultArenaBytesMax}
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
	case c.ArenaBytesMax <= 0:
		return fmt.Errorf("kv: pool ArenaBytesMax (%d) must be positive", c.ArenaBytesMax)
	}
	if need := int64(c.Pages) * int64(c.Geometry.PageBytes()); need > c.ArenaBytesMax {
		return fmt.Errorf("kv: pool of %d pages × %d bytes = %d bytes exceeds ArenaBytesMax (%d)",
			c.Pages, c.Geometry.PageBytes(), need, c.ArenaBytesMax)
	}
	return nil
}

// page is the bookkeeping of one physical page. Its bytes live in the
// pool's arena at index × page bytes.
type page struct {
	gen      uint64
	state    State
	owner    Owner
	first    int    // sequence position of the page's row 0, fixed at reserve
	filled   int    // token rows written, from row 0
	sum      uint64 // checksum fixed at seal
	readers  int    // leases outstanding
	awaitAck bool   // a peer has not yet acknowledged the bytes sent from this page
	deadline time.Time
}

// Pool is the paged KV store of one device. It is a pure state machine:
// see the package documentation for its contract.
type Pool struct {
	cfg     Config
	bpt     int // bytes per token
	arena   []byte
	pages   []page
	free    []uint32 // stack of free page indexes
	pending []uint32 // pages in state Released, waiting for unlease, ack or deadline
	stats   Stats
}

// Stats counts pages by state and the refusals and reclaims so far.
type Stats struct {
	Capacity, Free, Reserved, Filling, Sealed, Leased, Released int

	// Reservations and Releases count pages, over the pool's life.
	Reservations, Releases uint64
	// Reclaimed counts pages freed by Tick because their deadline passed
	// with a lease or an acknowledgement outstanding.
	Reclaimed uint64
	// Refused counts accesses refused, by reason.
	Refused Refusals
}

// Refusals counts refused accesses by reason.
type Refusals struct {
	Stale, WrongTenant, WrongOwner, State, Range, Checksum uint64
}

// Total is the sum over all reasons.
func (r Refusals) Total() uint64 {
	return r.Stale + r.WrongTenant + r.WrongOwner + r.State + r.Range + r.Checksum
}

// NewPool validates cfg and then allocates the whole arena once. The pool
// never grows.
func NewPool(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:     cfg,
		bpt:     cfg.Geometry.BytesPerToken(),
		arena:   make([]byte, cfg.Pages*cfg.Geometry.PageBytes()),
		pages:   make([]page, cfg.Pages),
		free:    make([]uint32, cfg.Pages),
		pending: make([]uint32, 0, cfg.Pages),
	}
	// Pop order is ascending index on a fresh pool; generations start at 1
	// so that the zero Tag never names a page.
	for i := range p.pages {
		p.pages[i].gen = 1
		p.free[cfg.Pages-1-i] = uint32(i)
	}
	p.stats.Capacity = cfg.Pages
	p.stats.Free = cfg.Pages
	return p, nil
}

// Config returns the configuration the pool was built with.
func (p *Pool) Config() Config { return p.cfg }

// Stats returns the counters as of now.
func (p *Pool) Stats() Stats { return p.stats }

// Reserve gives owner n free pages, all or nothing, and returns their tags in
// order. Page i will hold the request's tokens from sequence position
// firstToken + i × PageTokens on: binding each page to its position lets a
// write (or a frame) meant for another position of the same request be
// refused, not just one meant for another request. A refusal reserves
// nothing.
func (p *Pool) Reserve(owner Owner, firstToken, n int) ([]Tag, error) {
	if err := owner.Validate(); err != nil {
		return nil, err
	}
	if firstToken < 0 || firstToken > SequenceTokensMax {
		return nil, fmt.Errorf("kv: reserve at sequence position %d: want 0 to %d", firstToken, SequenceTokensMax)
	}
	if n < 1 || n > len(p.free) {
		if n < 1 {
			return nil, fmt.Errorf("kv: reserve of %d pages: want at least 1", n)
		}
		return nil, &PoolExhaustedError{Need: n, Free: len(p.free), Capacity: len(p.pages)}
	}
	tags := make([]Tag, n)
	for i := range tags {
		idx := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		pg := &p.pages[idx]
		if pg.state != Free || pg.readers != 0 || pg.awaitAck {
			panic(fmt.Sprintf("kv: free list holds page %d in state %s with %d readers, awaitAck %t",
				idx, pg.state, pg.readers, pg.awaitAck))
		}
		pg.state = Reserved
		pg.owner = owner
		pg.first = firstToken + i*p.cfg.Geometry.PageTokens
		tags[i] = p.tagOf(idx)
	}
	p.stats.Free -= n
	p.stats.Reserved += n
	p.stats.Reservations += uint64(n)
	return tags, nil
}

func (p *Pool) tagOf(idx uint32) Tag {
	return Tag{Incarnation: p.cfg.Incarnation, Index: idx, Generation: p.pages[idx].gen}
}

// access is the handshake every operation starts with: the tag must name the
// current tenancy of a page here, the page must have an owner, and the
// presented owner must be that owner (tenant first, since a cross-tenant
// access is the one that matters most). It counts what it refuses.
func (p *Pool) access(tag Tag, owner Owner, op string) (*page, error) {
	if tag.Incarnation != p.cfg.Incarnation || int64(tag.Index) >= int64(len(p.pages)) {
		p.stats.Refused.Stale++
		return nil, &StaleTagError{Page: tag.Index, Have: tag}
	}
	pg := &p.pages[tag.Index]
	if pg.gen != tag.Generation {
		p.stats.Refused.Stale++
		return nil, &StaleTagError{Page: tag.Index, Want: p.tagOf(tag.Index), Have: tag}
	}
	if pg.state == Free {
		p.stats.Refused.State++
		return nil, &StateError{Page: tag, Op: op, State: Free}
	}
	if pg.owner.Tenant != owner.Tenant {
		p.stats.Refused.WrongTenant++
		return nil, &WrongTenantError{Page: tag, Owner: pg.owner.Tenant, Have: owner.Tenant}
	}
	if pg.owner.Request != owner.Request {
		p.stats.Refused.WrongOwner++
		return nil, &WrongOwnerError{Page: tag, Owner: pg.owner.Request, Have: owner.Request}
	}
	return pg, nil
}

func (p *Pool) refuseState(tag Tag, op string, s State) error {
	p.stats.Refused.State++
	return &StateError{Page: tag, Op: op, State: s}
}

func (p *Pool) bytesOf(idx uint32) []byte {
	pb := p.cfg.Geometry.PageBytes()
	off := int(idx) * pb
	return p.arena[off : off+pb : off+pb]
}

// Write appends whole token rows to a page that owner holds under tag. first
// is the sequence position of the first row: it must be the page's next
// unwritten position, and the rows must fit in the page.
func (p *Pool) Write(tag Tag, owner Owner, first int, data []byte) error {
	pg, err := p.access(tag, owner, "write")
	if err != nil {
		return err
	}
	if pg.state != Reserved && pg.state != Filling {
		return p.refuseState(tag, "write", pg.state)
	}
	pt := p.cfg.Geometry.PageTokens
	rangeErr := &TokenRangeError{Page: tag, First: first, Count: -1, Bytes: len(data),
		BytesPerToken: p.bpt, PageFirst: pg.first, Filled: pg.filled, PageTokens: pt}
	if len(data) == 0 || len(data)%p.bpt != 0 {
		p.stats.Refused.Range++
		return rangeErr
	}
	count := len(data) / p.bpt
	if first != pg.first+pg.filled || count > pt-pg.filled {
		p.stats.Refused.Range++
		rangeErr.Count = count
		return rangeErr
	}
	if pg.state == Reserved {
		p.stats.Reserved--
		p.stats.Filling++
	}
	pg.state = Filling
	copy(p.bytesOf(tag.Index)[pg.filled*p.bpt:], data)
	pg.filled += count
	return nil
}

// Seal makes a filling page immutable and fixes its checksum, which covers
// the page header (tag, owner, token range) and the written bytes.
func (p *Pool) Seal(tag Tag, owner Owner) (uint64, error) {
	pg, err := p.access(tag, owner, "seal")
	if err != nil {
		return 0, err
	}
	if pg.state != Filling {
		return 0, p.refuseState(tag, "seal", pg.state)
	}
	pg.sum = PageChecksum(tag, owner, pg.first, pg.filled, p.bytesOf(tag.Index)[:pg.filled*p.bpt])
	pg.state = Sealed
	p.stats.Filling--
	p.stats.Sealed++
	return pg.sum, nil
}

// Lease is the proof that its holder passed the read handshake for one
// tenancy of one page. It is a value: presenting it after the page was
// released and reallocated fails, because the tag is no longer current.
type Lease struct {
	Tag   Tag
	Owner Owner
}

// Lease grants a read lease on a sealed page to its owner. While any lease
// is outstanding the page cannot be freed, except by Tick after a release
// and the reclaim deadline.
func (p *Pool) Lease(tag Tag, owner Owner) (Lease, error) {
	pg, err := p.access(tag, owner, "lease")
	if err != nil {
		return Lease{}, err
	}
	if pg.state != Sealed && pg.state != Leased {
		return Lease{}, p.refuseState(tag, "lease", pg.state)
	}
	if pg.state == Sealed {
		p.stats.Sealed--
		p.stats.Leased++
	}
	pg.state = Leased
	pg.readers++
	return Lease{Tag: tag, Owner: owner}, nil
}

// Read returns the written bytes of a leased page and the number of tokens
// they hold. The slice aliases the arena: it is valid until the next call
// that mutates the pool, and must not be written.
func (p *Pool) Read(l Lease) ([]byte, int, error) {
	pg, err := p.access(l.Tag, l.Owner, "read")
	if err != nil {
		return nil, 0, err
	}
	if pg.readers == 0 {
		return nil, 0, p.refuseState(l.Tag, "read without lease", pg.state)
	}
	return p.bytesOf(l.Tag.Index)[:pg.filled*p.bpt], pg.filled, nil
}

// Unlease gives a lease back. The last unlease of a released page whose
// peer has acknowledged frees it.
func (p *Pool) Unlease(l Lease) error {
	pg, err := p.access(l.Tag, l.Owner, "unlease")
	if err != nil {
		return err
	}
	if pg.readers == 0 {
		return p.refuseState(l.Tag, "unlease without lease", pg.state)
	}
	pg.readers--
	switch {
	case pg.readers > 0:
	case pg.state == Leased:
		pg.state = Sealed
		p.stats.Leased--
		p.stats.Sealed++
	case pg.state == Released && !pg.awaitAck:
		p.freePage(l.Tag.Index)
	}
	return nil
}

// AwaitAck marks a sealed page as sent to a peer that has not acknowledged
// it yet: a release of the page is deferred until Ack or the deadline.
func (p *Pool) AwaitAck(tag Tag, owner Owner) error {
	pg, err := p.access(tag, owner, "await ack")
	if err != nil {
		return err
	}
	if (pg.state != Sealed && pg.state != Leased) || pg.awaitAck {
		return p.refuseState(tag, "await ack", pg.state)
	}
	pg.awaitAck = true
	return nil
}

// Ack records the peer's acknowledgement of a page marked by AwaitAck. A
// released page with no lease outstanding is freed.
func (p *Pool) Ack(tag Tag, owner Owner) error {
	pg, err := p.access(tag, owner, "ack")
	if err != nil {
		return err
	}
	if !pg.awaitAck {
		return p.refuseState(tag, "ack without await", pg.state)
	}
	pg.awaitAck = false
	if pg.state == Released && pg.readers == 0 {
		p.freePage(tag.Index)
	}
	return nil
}

// Release gives a page back. It takes effect at once when nobody holds the
// page; otherwise the page waits in state Released until its last unlease
// and acknowledgement, or until Tick passes now + ReclaimAfter. Either way
// the generation moves on when the page is freed, so every old tag is
// refused from then on. It reports whether the page is free already.
func (p *Pool) Release(tag Tag, owner Owner, now time.Time) (freed bool, err error) {
	pg, err := p.access(tag, owner, "release")
	if err != nil {
		return false, err
	}
	if pg.state == Released {
		return false, p.refuseState(tag, "release", pg.state)
	}
	if pg.readers == 0 && !pg.awaitAck {
		p.freePage(tag.Index)
		return true, nil
	}
	p.countState(pg.state, -1)
	pg.state = Released
	pg.deadline = now.Add(p.cfg.ReclaimAfter)
	p.stats.Released++
	p.pending = append(p.pending, tag.Index)
	return false, nil
}

// Reclaim describes a page freed by Tick with a lease or an acknowledgement
// still outstanding: its tag is stale from now on.
type Reclaim struct {
	Tag      Tag
	Owner    Owner
	Readers  int
	AwaitAck bool
}

// Tick frees every released page whose reclaim deadline is at or before
// now, and returns them. Leases still held on them become stale.
func (p *Pool) Tick(now time.Time) []Reclaim {
	var out []Reclaim
	keep := p.pending[:0]
	for _, idx := range p.pending {
		pg := &p.pages[idx]
		switch {
		case pg.state != Released:
			// Freed already by its last unlease or ack.
		case now.Before(pg.deadline):
			keep = append(keep, idx)
		default:
			out = append(out, Reclaim{Tag: p.tagOf(idx), Owner: pg.owner, Readers: pg.readers, AwaitAck: pg.awaitAck})
			p.stats.Reclaimed++
			p.freePage(idx)
		}
	}
	p.pending = keep
	return out
}

func (p *Pool) countState(s State, d int) {
	switch s {
	case Reserved:
		p.stats.Reserved += d
	case Filling:
		p.stats.Filling += d
	case Sealed:
		p.stats.Sealed += d
	case Leased:
		p.stats.Leased += d
	case Released:
		p.stats.Released += d
	default:
		panic(fmt.Sprintf("kv: count of state %s", s))
	}
}

// freePage returns a page to the free list and moves its generation on.
func (p *Pool) freePage(idx uint32) {
	pg := &p.pages[idx]
	p.countState(pg.state, -1)
	next := pg.gen + 1
	if next <= pg.gen {
		panic(fmt.Sprintf("kv: generation of page %d would go from %d to %d", idx, pg.gen, next))
	}
	*pg = page{gen: next}
	p.free = append(p.free, idx)
	if len(p.free) > len(p.pages) {
		panic(fmt.Sprintf("kv: free list holds %d pages, capacity %d", len(p.free), len(p.pages)))
	}
	p.stats.Free++
	p.stats.Releases++
}

// PageInfo is what Inspect reports of one page.
type PageInfo struct {
	Tag      Tag
	State    State
	Owner    Owner
	First    int
	Tokens   int
	Checksum uint64
	Readers  int
	AwaitAck bool
}

// Inspect reports page idx for status displays and invariant checks.
func (p *Pool) Inspect(idx uint32) PageInfo {
	pg := &p.pages[idx]
	return PageInfo{Tag: p.tagOf(idx), State: pg.state, Owner: pg.owner, First: pg.first, Tokens: pg.filled,
		Checksum: pg.sum, Readers: pg.readers, AwaitAck: pg.awaitAck}
}
