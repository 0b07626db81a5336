package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
)

// label says for whom the bytes of a KV row were computed: the node run and
// the owner there whose lease may read them. A row prefill computed for a
// plan is labelled, once it crosses to decode, with the plan's owner on the
// decode run; a row flipped at rest carries flipped.
type label struct {
	inc   uint64
	owner kv.Owner
}

var flipped = label{owner: kv.Owner{Tenant: "(bit flipped at rest)"}}

func (l label) String() string {
	switch l {
	case flipped:
		return "bytes flipped at rest"
	case label{}:
		return "bytes no tenancy wrote"
	}
	return fmt.Sprintf("bytes computed for %s on run %x", l.owner, l.inc)
}

// holding is a page's tenancy as the oracle saw it handed out: to an
// owner by a reservation, or to a scope when a prefix cache published it
// (scope is set, owner zero).
type holding struct {
	tag   kv.Tag
	owner kv.Owner
	scope kv.Scope
	live  bool
}

// pages is one node's pool as the cores, the engine and a prefix cache use
// it (handoff.CachePages), with the oracle around it: it records the owner
// and generation of every tenancy a reservation hands out or a cache
// publishes, the label of every row written, the pages awaiting an
// acknowledgement, the pages the deadlines freed and the shared leases
// held, and it checks every row a lease reads.
type pages struct {
	n    *node
	pool *kv.Pool
	pt   int
	rows []label // page index × PageTokens + row

	// shadow labels the payload of a received frame (by its first byte)
	// with the label of the source rows it was read from.
	shadow    map[*byte]label
	gen       []uint64 // the generation of each page's last tenancy
	held      []holding
	awaiting  map[kv.Tag]bool // source pages marked awaiting an ack: acked yet?
	reclaimed map[kv.Tag]bool // freed by a deadline since the last check
	shared    map[kv.Tag]int  // shared leases held on each cached page
	retired   bool

	// On a decode run, the held copies: copyFrom names the page whose
	// rows a shared lease read in this step (by the address of the bytes
	// Read returned), so that a write of those bytes, a copy, carries
	// their labels; copied are the pages so written, and copies counts
	// them by the attempt that wrote them.
	copyFrom map[*byte]uint32
	copied   map[kv.Tag]bool
	copies   map[uint64]int
}

var _ handoff.CachePages = (*pages)(nil)

func newPages(n *node, pool *kv.Pool) *pages {
	c := pool.Config()
	return &pages{n: n, pool: pool, pt: c.Geometry.PageTokens, rows: make([]label, c.Pages*c.Geometry.PageTokens),
		shadow: map[*byte]label{}, gen: make([]uint64, c.Pages), held: make([]holding, c.Pages),
		awaiting: map[kv.Tag]bool{}, reclaimed: map[kv.Tag]bool{}, shared: map[kv.Tag]int{},
		copyFrom: map[*byte]uint32{}, copied: map[kv.Tag]bool{}, copies: map[uint64]int{}}
}

func (p *pages) fail(invariant, format string, args ...any) {
	p.n.w.fail(invariant, "%s: "+format, append([]any{p.n.addr}, args...)...)
}

func (p *pages) Geometry() kv.Geometry { return p.pool.Geometry() }

func (p *pages) VerifyPage(i, first int, mp kv.ManifestPage, owner kv.Owner) error {
	return p.owns("verify", mp.Tag, owner, p.pool.VerifyPage(i, first, mp, owner))
}

// owns is the one-owner check on every access the pool allowed: it must be
// by the owner of the page's tenancy, under the tag the reservation handed
// out.
func (p *pages) owns(op string, tag kv.Tag, owner kv.Owner, err error) error {
	if err != nil || tag.Incarnation != p.n.inc || int(tag.Index) >= len(p.held) {
		return err
	}
	if h := p.held[tag.Index]; !h.live || h.tag != tag || h.owner != owner {
		p.fail("one owner", "the pool let %s %s page %s; its tenancy is %s, held by %s (live %t)", owner, op, tag, h.tag, h.owner, h.live)
	}
	return nil
}

// Reserve checks that every page handed out is free of any other tenancy
// and that its generation grew.
func (p *pages) Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error) {
	tags, err := p.pool.Reserve(owner, first, n, p.n.w.now)
	for _, t := range tags {
		i := t.Index
		h := &p.held[i]
		if t.Generation <= p.gen[i] {
			p.fail("generations grow", "page %d handed out to %s at generation %d; its previous tenancy (%s) had generation %d",
				i, owner, t.Generation, h.owner, p.gen[i])
		}
		if h.live {
			p.ended(h.tag) // freed earlier in this step
		}
		p.gen[i] = t.Generation
		*h = holding{tag: t, owner: owner, live: true}
	}
	return tags, err
}

func (p *pages) Write(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	return p.write(tag, owner, first, data, label{inc: p.n.inc, owner: owner})
}

// WriteOwned writes a received frame's payload, whose rows carry the label
// of the rows they were read from.
func (p *pages) WriteOwned(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	l, ok := label{}, false
	if len(data) > 0 {
		l, ok = p.shadow[&data[0]]
	}
	if !ok {
		l = label{inc: p.n.inc, owner: owner}
	}
	return p.write(tag, owner, first, data, l)
}

// write writes rows labelled l, or, for a copy of a cached page's bytes
// (a held copy), labelled as the rows they were copied from.
func (p *pages) write(tag kv.Tag, owner kv.Owner, first int, data []byte, l label) error {
	n := len(data) / p.pool.Geometry().BytesPerToken()
	labels := slices.Repeat([]label{l}, n)
	var src uint32
	copying := false
	if len(data) > 0 {
		src, copying = p.copyFrom[&data[0]]
	}
	if copying {
		copy(labels, p.rows[int(src)*p.pt:])
		data = p.flipCopy(data, labels)
	}
	if err := p.owns("write", tag, owner, p.pool.Write(tag, owner, first, data)); err != nil {
		return err
	}
	info := p.pool.Inspect(tag.Index)
	base := int(tag.Index) * p.pt
	copy(p.rows[base+info.Tokens-n:base+info.Tokens], labels)
	if copying {
		p.copied[tag] = true
		p.copies[owner.Request]++
	}
	return nil
}

// flipCopy is the bit flip of a held copy before its seal, now and then
// (BitFlip): a bit of one row differs from the cached page's, which the
// copy's seal must refuse (SealFrom against the cached page's checksum).
// The cached page's bytes are left as they are.
func (p *pages) flipCopy(data []byte, labels []label) []byte {
	w := p.n.w
	if !w.chance(BitFlip) || w.rng.IntN(4) != 0 {
		return data
	}
	out := slices.Clone(data)
	bpt := p.pool.Geometry().BytesPerToken()
	row := w.rng.IntN(len(labels))
	out[row*bpt+4*w.rng.IntN(bpt/4)+3] ^= 0x40
	labels[row] = flipped
	w.count[HeldCopyFlipped]++
	return out
}

func (p *pages) Seal(tag kv.Tag, owner kv.Owner) (uint64, error) {
	sum, err := p.pool.Seal(tag, owner)
	return sum, p.owns("seal", tag, owner, err)
}

func (p *pages) SealFrom(tag kv.Tag, owner kv.Owner, o kv.Origin) (uint64, error) {
	sum, err := p.pool.SealFrom(tag, owner, o)
	var corrupt *kv.ChecksumMismatchError
	if p.copied[tag] && errors.As(err, &corrupt) {
		p.n.w.count[HeldCopyRefused]++
	}
	return sum, p.owns("seal", tag, owner, err)
}

func (p *pages) Lease(tag kv.Tag, owner kv.Owner) (kv.Lease, error) {
	l, err := p.pool.Lease(tag, owner)
	return l, p.owns("lease", tag, owner, err)
}

// Read is the provenance check: every row a lease reads must have been
// computed for the lease's owner on this run, or, through a shared lease
// or in a held copy, for a request of the reader's scope. On a decode run,
// the bytes a shared lease reads are those a held copy is written from.
func (p *pages) Read(l kv.Lease) ([]byte, int, error) {
	b, n, err := p.pool.Read(l)
	switch {
	case err != nil:
	case l.Scope.IsZero():
		p.owns("read", l.Tag, l.Owner, nil)
		p.checkRows(l, n)
	default:
		p.cachedAs("read", l.Tag, l.Scope)
		p.checkScopeRows(l, n)
		if p.n.role == roleDecode && len(b) > 0 {
			p.copyFrom[&b[0]] = l.Tag.Index
		}
	}
	return b, n, err
}

// checkScopeRows is the provenance check of a read through a shared
// lease: every row must have been computed on this run for a request
// whose scope, by the oracle's account, is the reader's. The rows' labels
// name the requests that computed them, and the prefill jobs or the
// decode requests' clients name their scopes.
func (p *pages) checkScopeRows(l kv.Lease, n int) {
	_, scope, ok := p.n.promptScope(l.Owner)
	if !ok {
		p.fail("provenance", "%s read cached page %s through a shared lease, and no request of this run is its", l.Owner, l.Tag)
		return
	}
	if j := p.n.jobs[l.Owner.Request]; j != nil {
		j.read[l.Tag] = true
	}
	base := int(l.Tag.Index) * p.pt
	for r := range n {
		got := p.rows[base+r]
		writer, ok := p.writerScope(got)
		if ok && writer == scope {
			continue
		}
		what := got.String()
		if ok {
			what = fmt.Sprintf("%s, of %s", got, writer)
		}
		p.fail("provenance", "%s, of %s, read row %d of cached page %s through a shared lease and got %s",
			l.Owner, scope, r, l.Tag, what)
		return
	}
}

// writerScope is the oracle's scope of the request a row's label names,
// if it names one of this run.
func (p *pages) writerScope(l label) (string, bool) {
	if l.inc != p.n.inc || l == flipped {
		return "", false
	}
	_, scope, ok := p.n.promptScope(l.owner)
	return scope, ok
}

// checkRows is the provenance check of a read through a private lease:
// every row must have been computed for the lease's owner on this run,
// or, in a held copy, for a request of the owner's scope.
func (p *pages) checkRows(l kv.Lease, n int) {
	want := label{inc: p.n.inc, owner: l.Owner}
	base := int(l.Tag.Index) * p.pt
	for r := range n {
		got := p.rows[base+r]
		if got == want {
			continue
		}
		if p.copied[l.Tag] {
			_, reader, ok := p.n.promptScope(l.Owner)
			if writer, known := p.writerScope(got); ok && known && writer == reader {
				continue
			}
		}
		what := "another request's or attempt's bytes"
		switch {
		case got == flipped:
			what = "corrupted bytes"
		case got.owner.Tenant != want.owner.Tenant:
			what = "another tenant's bytes"
		}
		p.fail("provenance", "%s read row %d of page %s through its lease and got %s: %s", l.Owner, r, l.Tag, what, got)
		return
	}
}

// flippedAt reports whether a row of tag's page already had a bit
// flipped.
func (p *pages) flippedAt(tag kv.Tag) bool {
	base := int(tag.Index) * p.pt
	return slices.Contains(p.rows[base:base+p.pool.Inspect(tag.Index).Tokens], flipped)
}

// Unlease gives a lease back. A shared one is counted off the page, and
// now and then given back twice, as a page message delivered twice would
// be: the pool must refuse the second (the first may have freed the page
// of an evicted entry, or left it to other readers).
func (p *pages) Unlease(l kv.Lease) error {
	if l.Scope.IsZero() {
		return p.owns("unlease", l.Tag, l.Owner, p.pool.Unlease(l))
	}
	p.cachedAs("unlease", l.Tag, l.Scope)
	err := p.pool.Unlease(l)
	if err != nil {
		return err
	}
	p.shared[l.Tag]--
	w := p.n.w
	if w.chance(Duplicate) {
		w.count[SharedUnleaseRepeated]++
		if again := p.pool.Unlease(l); again == nil {
			p.fail("lease count", "a repeated unlease of %s's shared lease on page %s was taken: the page counts %d readers, %d leases are held",
				l.Owner, l.Tag, p.pool.Inspect(l.Tag.Index).Readers, p.shared[l.Tag])
		} else {
			w.count[RepeatedUnleaseRefused]++
		}
	}
	p.countsLeases(l.Tag)
	return nil
}

// LeaseShared leases a cached page the prefix index found: the index must
// never find a page another scope published (the pool would refuse it,
// but the lookup would have named another scope's prompt). A corrupt
// cached page is refused here, at the lease.
func (p *pages) LeaseShared(c kv.CachedPage, reader kv.Owner, scope kv.Scope) (kv.Lease, error) {
	l, err := p.pool.LeaseShared(c, reader, scope)
	var wrong *kv.WrongScopeError
	var corrupt *kv.ChecksumMismatchError
	switch {
	case errors.As(err, &wrong):
		p.fail("cache scope", "the prefix index found page %s for %s under scope %s, and another scope published it", c.Tag, reader, scope)
	case errors.As(err, &corrupt):
		p.n.w.count[CachedCorruptRefused]++
	case err == nil:
		p.cachedAs("shared lease", c.Tag, scope)
		p.shared[c.Tag]++
		p.countsLeases(c.Tag)
	}
	return l, err
}

// AckPublish acknowledges a source page as Ack does and, when the pool
// published it instead of freeing it, records the cached tenancy.
func (p *pages) AckPublish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error) {
	c, err := p.pool.AckPublish(tag, owner, scope)
	if err = p.owns("acknowledge", tag, owner, err); err != nil {
		return c, err
	}
	if _, ok := p.awaiting[tag]; ok {
		p.awaiting[tag] = true
	}
	if c.Tag == (kv.Tag{}) {
		return c, nil
	}
	p.published(c, owner)
	return c, nil
}

// Publish publishes a page never sent (a decode pool's, once its request
// is answered), with the checks of AckPublish. A page the pool refuses
// because a lease still holds it is released by the cache instead.
func (p *pages) Publish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error) {
	c, err := p.pool.Publish(tag, owner, scope)
	if err = p.owns("publish", tag, owner, err); err != nil {
		if info := p.pool.Inspect(tag.Index); info.Tag == tag && info.Readers > 0 {
			p.n.w.count[KeepLeasedReleased]++
		}
		return c, err
	}
	p.published(c, owner)
	return c, nil
}

// published checks that publishing moved the page's generation on, and
// records the cached tenancy as the page's holding (and which prompt the
// request of owner, a prefill job or a decode request, published).
func (p *pages) published(c kv.CachedPage, owner kv.Owner) {
	i := c.Tag.Index
	if c.Tag.Generation <= p.gen[i] {
		p.fail("generations grow", "page %d published at generation %d; its previous tenancy had generation %d", i, c.Tag.Generation, p.gen[i])
	}
	p.ended(p.held[i].tag)
	p.gen[i] = c.Tag.Generation
	p.held[i] = holding{tag: c.Tag, scope: c.Scope, live: true}
	if p.n.role == roleDecode {
		p.n.w.count[DecodeKeptPages]++
	} else {
		p.n.w.count[CachePublished]++
	}
	if prompt, scope, ok := p.n.promptScope(owner); ok {
		p.n.publishedBy(prompt, scope, c)
	}
}

// Evict gives a cached page up, freed at once or at its last unlease.
func (p *pages) Evict(c kv.CachedPage) error {
	leased := p.shared[c.Tag] > 0
	if _, err := p.pool.Evict(c, p.n.w.now); err != nil {
		return err
	}
	evicted, whileLeased := CacheEvicted, EvictedWhileLeased
	if p.n.role == roleDecode {
		evicted, whileLeased = DecodeEvicted, DecodeEvictedWhileLeased
	}
	p.n.w.count[evicted]++
	if leased {
		p.n.w.count[whileLeased]++
	}
	p.countsLeases(c.Tag)
	return nil
}

// cachedAs is the one-scope check on every access through a shared lease
// the pool allowed: the page must be the tenancy a cache published, under
// that scope.
func (p *pages) cachedAs(op string, tag kv.Tag, scope kv.Scope) {
	if int(tag.Index) >= len(p.held) {
		return
	}
	if h := p.held[tag.Index]; !h.live || h.tag != tag || h.scope != scope {
		p.fail("one owner", "the pool let a shared lease of scope %s %s page %s; its tenancy is %s of scope %s (live %t)",
			scope, op, tag, h.tag, h.scope, h.live)
	}
}

// countsLeases is the check of a cached page's lease count: the pool
// counts as many readers as the oracle holds shared leases on it, and
// frees it only once none is held.
func (p *pages) countsLeases(tag kv.Tag) {
	held := p.shared[tag]
	info := p.pool.Inspect(tag.Index)
	switch {
	case info.Tag == tag && info.State != kv.Free && info.Readers != held:
		p.fail("lease count", "cached page %s counts %d readers; %d shared leases on it are held", tag, info.Readers, held)
	case (info.Tag != tag || info.State == kv.Free) && held != 0:
		p.fail("lease count", "cached page %s was freed with %d shared leases on it held", tag, held)
	}
	if held == 0 {
		delete(p.shared, tag)
	}
}

func (p *pages) AwaitAck(tag kv.Tag, owner kv.Owner) error {
	err := p.owns("mark awaiting ack", tag, owner, p.pool.AwaitAck(tag, owner))
	if err == nil {
		p.awaiting[tag] = false
	}
	return err
}

func (p *pages) Ack(tag kv.Tag, owner kv.Owner) error {
	err := p.owns("acknowledge", tag, owner, p.pool.Ack(tag, owner))
	if _, ok := p.awaiting[tag]; ok && err == nil {
		p.awaiting[tag] = true
	}
	return err
}

func (p *pages) Release(tag kv.Tag, owner kv.Owner) error {
	_, err := p.pool.Release(tag, owner, p.n.w.now)
	return p.owns("release", tag, owner, err)
}

// tick runs the pool's deadlines and notes what they freed.
func (p *pages) tick() {
	for _, r := range p.pool.Tick(p.n.w.now) {
		p.reclaimed[r.Tag] = true
		p.n.w.count[ReclaimFreed]++
		if r.AwaitAck && p.n.role == rolePrefill {
			p.n.w.count[AckLostReclaimed]++
		}
		p.n.w.trace.line(fmt.Sprintf("  reclaimed %s (%s, owner %d/%s, readers %d, awaiting ack %t)",
			r.Tag, r.State, r.Owner.Request, r.Owner.Tenant, r.Readers, r.AwaitAck))
	}
}

// ended is the end of a tenancy: a source page that awaited decode's ack
// may be freed only by the ack or by its reclaim deadline.
func (p *pages) ended(tag kv.Tag) {
	acked, ok := p.awaiting[tag]
	if !ok {
		return
	}
	delete(p.awaiting, tag)
	if !acked && !p.reclaimed[tag] {
		p.fail("release after ack", "source page %s was freed while it awaited decode's acknowledgement, before its reclaim deadline", tag)
	}
}

// check compares every page with the tenancies the oracle saw handed out:
// a page is free, owned by the owner of its one tenancy or cached under
// the scope it was published with; generations never go back; the pool's
// own counts of free and cached pages agree, and the prefix index holds
// every cached page (one it lost could never be evicted).
func (p *pages) check() {
	free, cached := 0, 0
	for i := range p.held {
		info := p.pool.Inspect(uint32(i))
		h := &p.held[i]
		if info.Tag.Generation < p.gen[i] {
			p.fail("generations grow", "page %d is at generation %d after a tenancy at generation %d", i, info.Tag.Generation, p.gen[i])
			return
		}
		if h.live && (info.Tag != h.tag || info.State == kv.Free) {
			p.ended(h.tag)
			h.live = false
		}
		if info.State == kv.Cached {
			cached++
		}
		switch {
		case info.State == kv.Free:
			free++
		case !h.live:
			p.fail("one owner", "page %s is %s, owned by %s, and no reservation handed it out", info.Tag, info.State, info.Owner)
			return
		case !h.scope.IsZero() || !info.Scope.IsZero():
			if info.Scope != h.scope {
				p.fail("one owner", "page %s is %s under scope %s; its tenancy is %s's of scope %s", info.Tag, info.State, info.Scope, h.owner, h.scope)
				return
			}
		case info.Owner != h.owner:
			p.fail("one owner", "page %s was reserved by %s and is owned by %s", info.Tag, h.owner, info.Owner)
			return
		}
	}
	clear(p.reclaimed)
	clear(p.copyFrom)
	s := p.pool.Stats()
	switch {
	case s.Free != free:
		p.fail("pool counts", "the pool counts %d free pages, %d are", s.Free, free)
	case s.Cached != cached:
		p.fail("pool counts", "the pool counts %d cached pages, %d are", s.Cached, cached)
	case s.Cross != kv.CrossRows{}:
		p.fail("provenance", "the pool's cross-read oracle counted rows read that another owner or scope wrote: %+v", s.Cross)
	case p.n.cache != nil && p.n.cache.Stats().Pages != cached:
		p.fail("cache index", "the prefix index holds %d pages and the pool %d cached pages", p.n.cache.Stats().Pages, cached)
	}
}

// busy describes the pages that are not free and whose state is of.
func (p *pages) busy(of func(kv.State) bool) []string {
	var out []string
	for i := range p.held {
		if info := p.pool.Inspect(uint32(i)); info.State != kv.Free && of(info.State) {
			out = append(out, fmt.Sprintf("%s %s owner %d/%s readers %d awaiting ack %t",
				info.Tag, info.State, info.Owner.Request, info.Owner.Tenant, info.Readers, info.AwaitAck))
		}
	}
	return out
}

// cachedTags are the pool's cached pages, by index.
func (p *pages) cachedTags() []kv.Tag {
	var out []kv.Tag
	for i := range p.held {
		if info := p.pool.Inspect(uint32(i)); info.State == kv.Cached {
			out = append(out, info.Tag)
		}
	}
	return out
}

// leasedCached describes the cached pages a lease holds.
func (p *pages) leasedCached() []string {
	var out []string
	for i := range p.held {
		if info := p.pool.Inspect(uint32(i)); info.State == kv.Cached && info.Readers != 0 {
			out = append(out, fmt.Sprintf("%s readers %d", info.Tag, info.Readers))
		}
	}
	return out
}

// retire ends the oracle's watch over a pool that went down with its node,
// keeping its refusal counts.
func (p *pages) retire() {
	if p.retired {
		return
	}
	p.retired = true
	r := p.pool.Stats().Refused
	p.n.w.count[StaleTagRefused] += r.Stale
	p.n.w.count[WrongOwnerRefused] += r.WrongOwner + r.WrongTenant
}
